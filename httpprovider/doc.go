// Package httpprovider is an [outbox.Provider] for a downstream HTTP API
// that deduplicates on an idempotency key, as payment APIs do (Stripe,
// Adyen, and every API that follows the IETF Idempotency-Key draft): each
// attempt of one action sends the same request with the action's key in a
// header, so a retry after a timeout or a dropped connection is answered
// with the API's stored answer instead of a second effect.
//
// # Use
//
//	p, err := httpprovider.New(httpprovider.Config{
//		URL:          "https://api.example.com/v1/refunds",
//		KeepHeaders:  []string{"Request-Id"},
//		KeyRetention: 24 * time.Hour, // how long the API remembers a key
//		RequestFunc: func(r *http.Request, _ outbox.Request) error {
//			r.Header.Set("Authorization", "Bearer "+apiKey)
//			return nil
//		},
//	})
//	if err != nil {
//		return err
//	}
//	registry := outbox.NewRegistry()
//	if err := p.Register(registry, "refund"); err != nil {
//		return err
//	}
//
// The body is the call's canonical arguments (RFC 8785 JSON) unless
// [Config.BodyFunc] builds another; the key goes in Idempotency-Key unless
// [Config.KeyHeader] names another header, as itself ("k1_" and 64 hex
// digits) unless [Config.KeyFunc] transforms it for an API that limits
// keys ([Truncate], [HexOnly]). Every attempt has its own deadline,
// [Config.Timeout].
//
// # Redirects
//
// A redirect is not followed: a 3xx answer is the attempt's outcome, a
// permanent failure, so that the request and its idempotency key reach no
// server but the configured one. [RedirectsSameOrigin] follows redirects
// within the request's origin (scheme, host and port), and only there.
//
// # What is stored
//
// A 2xx answer is stored as the key's response, and a 4xx one as its
// permanent failure, both in one JSON envelope of status, kept headers and
// body, the body byte for byte (see [Response] and [Decode]); the envelope
// is valid JSON in valid UTF-8 whatever the body holds. Duplicates
// of the call get the stored envelope back, never a second request.
//
// # Classification
//
// See [Provider] for how each answer is classified: 409 (the API is still
// processing the key), 408, 425, 429 and 5xx are retried, honouring
// Retry-After through [outbox.RetryAfter]; 5xx, a timeout and a dropped
// connection once the request was written are ambiguous, so a tool
// registered [outbox.AtMostOnce] goes to review instead of a retry; a
// connection that failed before anything was written is a plain retry.
//
// # Key retention
//
// An API forgets keys after a while (Stripe: 24 hours). [Config.KeyRetention]
// records that window, and [Provider.Register] makes it the tool's
// [outbox.ToolOpts.KeyRetention]: an ambiguous attempt older than that is
// no longer retried by key, but looked up ([LookupProvider]) or sent to
// review.
package httpprovider
