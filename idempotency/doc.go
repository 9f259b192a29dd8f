// Package idempotency is net/http middleware that honours the
// Idempotency-Key request header (IETF draft-ietf-httpapi-idempotency-key-header)
// for a service's own API, with pgonce's store as the arbiter: the first
// request with a key runs the handler once, and its response (status, kept
// headers, body bytes) is stored and replayed byte for byte to every later
// request with the same key.
//
// # Registration
//
// The middleware's keys are claimed under a tool of their own,
// [Config.Tool]. Register it with [Register] while building the client's
// registry; [NewPgx] and [New] refuse a tool it did not register, with
// [ErrToolNotRegistered], and never change the registry themselves:
//
//	registry := outbox.NewRegistry()
//	if err := idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil); err != nil {
//		return err
//	}
//
// The tool is inline-only ([outbox.ToolOpts.InlineOnly]): the middleware
// runs its keys for the request in hand, and no dispatcher claims them.
//
// # Same-transaction mode ([ModeTx], the default)
//
// The middleware serves handlers whose effects live in the same PostgreSQL
// as the keys. For a request with a key, it opens a transaction, claims the
// key in it ([outbox.Client.ClaimTx]), hands the transaction to the handler
// through the request's context ([Tx]), stores the handler's response in it
// ([outbox.Client.CompleteTx]) and commits. The handler's writes and the
// stored response are one commit: a crash leaves neither, and the same key
// simply runs again.
//
//	m, err := idempotency.NewPgx(pool, client, idempotency.Config{
//		ScopeFunc: func(r *http.Request) (string, error) { return accountOf(r) },
//	})
//	if err != nil {
//		return err
//	}
//	mux.Handle("POST /refunds", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx, _ := idempotency.Tx[pgx.Tx](r.Context())
//		// ... write the refund in tx, then answer:
//		w.WriteHeader(http.StatusCreated)
//	})))
//
// A handler's 5xx answer is no outcome: its transaction rolls back, nothing
// is stored, and a retry with the same key runs the handler again. Every
// other status (2xx, 4xx) is the request's outcome, stored and replayed.
//
// # Lease mode
//
// [ModeLease] is for handlers that call the outside world. The key is
// claimed in flight under a lease, as [outbox.Client.Do] claims it, the
// handler runs under the client's CallTimeout, and its response is stored
// when it returns. A duplicate while it runs waits for it, as in [ModeTx],
// up to [Config.WaitTimeout], and replays its response; past it, it gets
// 409 with Retry-After. A request whose outcome nobody knows (the server was killed mid-request,
// the handler panicked or overran) is resolved by the tool's delivery, as
// [Register] registered it:
//
//   - [outbox.AtMostOnce]: the key goes to review (by the reconciler, once
//     the lease expires, after a crash) and answers 409 needs-review until
//     an operator resolves it; the handler never runs twice. A 5xx answer
//     is stored and replayed, as any other.
//   - [outbox.IdempotentByKey], for a handler that passes the request's key
//     ([Key]) downstream to an API that deduplicates on it: the key goes
//     back to pending (by the reconciler, after a crash), and the next
//     request with it runs the handler again, which the API answers as it
//     answered the abandoned one. A 5xx answer is no outcome: it is sent,
//     not stored, and the same key runs again.
//
// A route of each kind needs its own tool and middleware:
//
//	err := idempotency.Register(registry, "refund_now_request", outbox.IdempotentByKey,
//		&outbox.ToolOpts{KeyRetention: 24 * time.Hour}) // the downstream API's key window
//	if err != nil {
//		return err
//	}
//	now, err := idempotency.NewPgx(nil, client, idempotency.Config{
//		Mode: idempotency.ModeLease, Tool: "refund_now_request", ScopeFunc: accountOf,
//	})
//	if err != nil {
//		return err
//	}
//	mux.Handle("POST /refunds/now", now.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		key, _ := idempotency.Key(r.Context())
//		// ... call the payment API with key in its Idempotency-Key header,
//		// and answer with its answer.
//	})))
//
// # Answers
//
//	first request with a key                 the handler's response (one that
//	                                         wrote nothing: 200, empty, stored)
//	same key, same request, finished         the stored response, byte for byte,
//	                                         with Idempotent-Replayed: true
//	same key while the first runs            waits up to Config.WaitTimeout and
//	                                         replays; past it 409, Retry-After
//	                                         (both modes)
//	same key, outcome unknown (ModeLease,    409 needs-review, until an
//	AtMostOnce)                              operator resolves it
//	same key, resolved by an operator        the resolution: an envelope is
//	                                         replayed; other JSON is 200 with it
//	                                         (succeeded) or 422 (failed)
//	same key, cancelled by an operator       422
//	same key, other method, path or body     422
//	no key (Config.KeyRequired), a malformed
//	key, a key over Config.MaxKeyLength      400
//	no account (Config.ScopeFunc failed)     401
//	request body over Config.MaxRequestBytes 413
//	response over Config.MaxResponseBytes    500, nothing stored, rolled back
//	a key whose response was pruned          422 (its tombstone remains)
//	the store unreachable for WaitTimeout    503, Retry-After; nothing ran
//
// Errors are RFC 9457 problem details (application/problem+json) whose type
// starts with [ProblemTypeBase]. A request is the same request when its
// method, path, query and body match; a JSON body is compared in canonical
// form (RFC 8785), so re-encoding it changes nothing. Keys are scoped by
// [Config.ScopeFunc]: two accounts may use the same key without meeting.
//
// The key is sent as a structured-field string ("…", RFC 8941 §3.3.3) as
// the draft specifies, or bare, as Stripe's clients send it; both name the
// same key: "k-1" and k-1 are one key. In the quoted form the only escapes
// are \" and \\; any other backslash, a control character, a character
// past ASCII or anything after the closing quote (parameters included) is
// a 400.
//
// A duplicate is never answered with a server error for a key whose
// outcome is stored or still being made: it waits, replays or gets a 409.
// In [ModeLease] a claim that fails transiently (no free connection within
// the client's StatementTimeout, too many connections, a dropped one) is
// tried again within WaitTimeout. A store that stays unreachable gets a
// 503 with Retry-After, and then this request ran nothing.
//
// # Storage
//
// The stored response is the envelope of package httpprovider ([httpprovider.Response]):
// a JSON object of status, kept headers and body. Keys are claimed under
// [Config.Tool]; in [ModeTx] the claim and the response commit together, so
// no claim is left in flight.
//
// # Streaming
//
// Streaming handlers are not supported: the response is buffered until it
// is stored, the writer implements no http.Flusher (a flush through
// http.ResponseController fails with http.ErrNotSupported), and the whole
// response is sent once the transaction commits.
package idempotency
