package httpprovider

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/internal/header"
	"github.com/pgonce/pgonce/outbox"
)

// downstreamKeyAttr names the span attribute of the key sent downstream,
// the telemetry package's AttrDownstreamKey.
const downstreamKeyAttr = "pgonce.downstream_key"

// Defaults of [Config].
const (
	// KeyHeaderDefault is the header that carries the key downstream.
	KeyHeaderDefault = "Idempotency-Key"
	// TimeoutDefault is the deadline of one attempt's request.
	TimeoutDefault = 10 * time.Second
	// MaxResponseBytesDefault bounds the body read from a response.
	MaxResponseBytesDefault = 1 << 20
	// RetryAfterMaxDefault caps the wait a Retry-After header asks for.
	RetryAfterMaxDefault = 10 * time.Minute
)

// ErrInvalidConfig is returned by [New] and [NewLookup] for an invalid
// [Config] or [LookupConfig].
var ErrInvalidConfig = errors.New("invalid httpprovider config")

// ErrResponseTooLarge is wrapped by the error of an attempt whose response
// body exceeds [Config.MaxResponseBytes]. The request was answered, so the
// effect may have happened: the attempt is ambiguous.
var ErrResponseTooLarge = errors.New("response body too large")

// Config configures a [Provider]. The zero value of every field but URL
// works.
type Config struct {
	// URL is the downstream endpoint every call is sent to. Required unless
	// URLFunc is set.
	URL string
	// URLFunc, when set, returns the endpoint of one call instead of URL
	// (say, an order id from the arguments in the path). An error fails the
	// call permanently: the same request would give the same error.
	URLFunc func(req outbox.Request) (string, error)
	// Method is the request method. Defaults to POST.
	Method string
	// Client sends the requests. Defaults to a client of its own over a
	// transport that the package's providers share, a clone of
	// http.DefaultTransport's settings: other code that closes the idle
	// connections of http.DefaultTransport (an httptest.Server that closes
	// does) cannot break a request of a provider that was taking one of
	// them. Its Timeout, if any, applies beside Timeout.
	// The provider sends through a copy of it whose redirect policy is
	// Redirects: its CheckRedirect is consulted only for a redirect that
	// Redirects allows.
	Client *http.Client
	// Redirects says which redirects are followed. Defaults to
	// [RedirectsNone]: a 3xx answer is the attempt's outcome, never
	// followed, so that the request and its key go to no other server.
	Redirects Redirects

	// KeyHeader names the header that carries the idempotency key. Defaults
	// to [KeyHeaderDefault].
	KeyHeader string
	// KeyFunc, when set, turns the key into the header's value, for a
	// provider that limits a key's length or alphabet; it must be
	// deterministic, or a retry is a new request downstream. [Truncate] and
	// [HexOnly] are two such functions. Defaults to the key itself: "k1_"
	// and 64 lower-case hex digits, 67 bytes, which fits every payment
	// API's limit (Stripe: 255). An error, or a value that is empty or not a
	// valid header value, fails the call permanently.
	KeyFunc func(key outbox.Key) (string, error)

	// BodyFunc, when set, builds the request body and its content type from
	// the call. Defaults to the call's canonical arguments
	// ([outbox.Request.Args], RFC 8785 bytes) as application/json. An
	// error fails the call permanently.
	BodyFunc func(req outbox.Request) (body []byte, contentType string, err error)
	// RequestFunc, when set, is called with every request before it is
	// sent, to add what the downstream API needs (authorisation, a version
	// header). An error fails the call permanently.
	RequestFunc func(r *http.Request, req outbox.Request) error

	// Timeout is the deadline of one attempt: the request and the reading
	// of its response. The dispatcher's own deadline
	// ([outbox.Config.CallTimeout]) applies as well, whichever ends first.
	// Defaults to [TimeoutDefault].
	Timeout time.Duration
	// KeepHeaders names the response headers stored with the body (say
	// Request-Id, Location). Defaults to none.
	KeepHeaders []string
	// MaxResponseBytes bounds the response body read and stored. A larger
	// body fails the attempt as ambiguous with [ErrResponseTooLarge], never
	// stored truncated. Defaults to [MaxResponseBytesDefault].
	MaxResponseBytes int64
	// RetryAfterMax caps the delay a Retry-After header asks for. Defaults
	// to [RetryAfterMaxDefault].
	RetryAfterMax time.Duration
	// KeyRetention is how long the downstream API remembers a key (Stripe:
	// 24 hours); [Provider.Register] registers it as the tool's
	// [outbox.ToolOpts.KeyRetention]. Zero means it never forgets.
	KeyRetention time.Duration

	// NowFunc returns the current time, to read a Retry-After date.
	// Defaults to time.Now.
	NowFunc func() time.Time
}

// Redirects says which redirects a [Provider] follows ([Config.Redirects]).
type Redirects int

const (
	// RedirectsNone follows no redirect: a 3xx answer is the attempt's
	// outcome, a permanent failure whose envelope is stored (keep
	// Location with [Config.KeepHeaders] to see where it pointed).
	RedirectsNone Redirects = iota
	// RedirectsSameOrigin follows a redirect whose target has the scheme,
	// host and port of the request, as net/http follows it (10 requests
	// at most): 307 and 308 send the same method, body and key again;
	// 301, 302 and 303 turn a POST into a GET without a body. A redirect
	// to another origin, or past that bound, is not followed: it is the
	// outcome, as with RedirectsNone.
	RedirectsSameOrigin
)

// redirectsMax bounds the requests of one attempt under
// RedirectsSameOrigin, as net/http's default policy does.
const redirectsMax = 10

// Provider is an [outbox.Provider] for a downstream HTTP API that
// deduplicates on an idempotency key, as payment APIs do. Every attempt of
// one action sends the same request with the same key header. It is safe
// for concurrent use.
//
// # Answers
//
// An attempt ends by the answer, the way such APIs document them:
//
//	2xx                        success: the envelope of status, kept headers
//	                           and body is stored (see [Response])
//	409                        the API is still running a request with this
//	                           key: retry later, by Retry-After if given
//	408, 425, 429              not processed: retry, by Retry-After if given
//	429, 503 with Retry-After  slow down ([outbox.SlowDown]): no call of the
//	                           tool from any dispatcher until then, and the
//	                           key waits without spending its attempt (a
//	                           503 stays ambiguous)
//	5xx                        may have acted: ambiguous, retry (the same key
//	                           makes the retry safe), by Retry-After if given
//	other 4xx (400, 402, 422)  permanent failure: the envelope is stored with
//	                           [outbox.PermanentBody] and replayed verbatim
//	1xx, 3xx                   permanent failure, likewise; redirects are
//	                           not followed unless [Config.Redirects] says
//	                           so, and then within the origin only
//	transport error or timeout ambiguous once the request's headers were
//	                           written, a plain retry before
//
// A 5xx, a timeout or a dropped connection after the request went out may
// hide an effect: with [outbox.IdempotentByKey] the retry carries the same
// key and the API replays its answer; a tool registered
// [outbox.AtMostOnce] goes to review instead.
type Provider struct {
	config Config
}

// New returns a provider for config. It returns an error matching
// [ErrInvalidConfig] for a config without URL or URLFunc, a URL that is
// not absolute http or https, a key header that is not a valid header
// name, or a negative duration or limit.
func New(config Config) (*Provider, error) {
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	return &Provider{config: config}, nil
}

// sharedTransport is the transport of the clients the package's providers
// make when Config.Client is nil: one for them all, so that they share
// their connections, and apart from http.DefaultTransport.
var sharedTransport = sync.OnceValue(func() http.RoundTripper {
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		return t.Clone()
	}
	return http.DefaultTransport
})

func (c Config) withDefaults() Config {
	c.Method = cmp.Or(c.Method, http.MethodPost)
	c.KeyHeader = http.CanonicalHeaderKey(cmp.Or(c.KeyHeader, KeyHeaderDefault))
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, MaxResponseBytesDefault)
	c.RetryAfterMax = cmp.Or(c.RetryAfterMax, RetryAfterMaxDefault)
	client := &http.Client{Transport: sharedTransport()}
	if c.Client != nil {
		copied := *c.Client
		client = &copied
	}
	client.CheckRedirect = checkRedirect(c.Redirects, client.CheckRedirect)
	c.Client = client
	if c.NowFunc == nil {
		c.NowFunc = time.Now
	}
	c.KeepHeaders = header.Canonical(c.KeepHeaders)
	return c
}

func (c Config) validate() error {
	switch {
	case c.URL == "" && c.URLFunc == nil:
		return fmt.Errorf("%w: URL or URLFunc is required", ErrInvalidConfig)
	case c.URL != "" && !validURL(c.URL):
		return fmt.Errorf("%w: URL %q must be an absolute http or https URL", ErrInvalidConfig, c.URL)
	case !header.ValidToken(c.KeyHeader):
		return fmt.Errorf("%w: KeyHeader %q must be a header name", ErrInvalidConfig, c.KeyHeader)
	case !header.ValidToken(c.Method):
		return fmt.Errorf("%w: Method %q must be a method name", ErrInvalidConfig, c.Method)
	case c.Redirects != RedirectsNone && c.Redirects != RedirectsSameOrigin:
		return fmt.Errorf("%w: unknown Redirects %d", ErrInvalidConfig, int(c.Redirects))
	case c.Timeout < 0 || c.MaxResponseBytes < 0 || c.RetryAfterMax < 0 || c.KeyRetention < 0:
		return fmt.Errorf("%w: Timeout, MaxResponseBytes, RetryAfterMax and KeyRetention must not be negative", ErrInvalidConfig)
	}
	if name, bad := header.InvalidName(c.KeepHeaders); bad {
		return fmt.Errorf("%w: KeepHeaders: %q must be a header name", ErrInvalidConfig, name)
	}
	return nil
}

// checkRedirect is the redirect policy of a client: which redirects
// follow, and then the client's own policy, if any.
func checkRedirect(redirects Redirects, own func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if redirects != RedirectsSameOrigin || !sameOrigin(req.URL, via[0].URL) || len(via) >= redirectsMax {
			// The redirect is the answer.
			return http.ErrUseLastResponse
		}
		if own != nil {
			return own(req, via)
		}
		return nil
	}
}

// sameOrigin reports whether a and b have one origin (RFC 6454): scheme,
// host and port, a default port spelled or not.
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) &&
		portOf(a) == portOf(b)
}

func portOf(u *url.URL) string {
	if port := u.Port(); port != "" {
		return port
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

func validURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// validHeaderValue reports whether s can be sent as a header value as is.
func validHeaderValue(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if c := s[i]; c < ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// Register registers p in r as tool, delivered [outbox.IdempotentByKey],
// with [Config.KeyRetention] as the tool's
// [outbox.ToolOpts.KeyRetention]. See [outbox.Registry.RegisterWithOpts]
// for its errors.
func (p *Provider) Register(r *outbox.Registry, tool string) error {
	return r.RegisterWithOpts(tool, p, outbox.IdempotentByKey, &outbox.ToolOpts{KeyRetention: p.config.KeyRetention})
}

// Call sends the attempt's request and classifies the answer (see
// [Provider]).
func (p *Provider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	httpReq, err := p.newRequest(ctx, req)
	if err != nil {
		return nil, outbox.Permanent(err)
	}
	ctx, cancel := context.WithTimeout(httpReq.Context(), p.config.Timeout)
	defer cancel()
	resp, retryAfterValue, err := p.send(httpReq.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	stored, err := resp.Encode()
	if err != nil {
		return nil, outbox.Ambiguous(err)
	}
	retryAfter := p.retryAfter(retryAfterValue)
	switch code := resp.Status; {
	case code >= 200 && code <= 299:
		return stored, nil
	case code == http.StatusConflict:
		return nil, outbox.RetryAfter(fmt.Errorf("%s: 409: a request with this key is in progress downstream", p.what(httpReq)), retryAfter)
	case code == http.StatusTooManyRequests && retryAfter > 0:
		// The API's pace, not this request's: the whole tool slows down.
		return nil, outbox.SlowDown(fmt.Errorf("%s: 429: not processed", p.what(httpReq)), retryAfter)
	case code == http.StatusServiceUnavailable && retryAfter > 0:
		return nil, outbox.SlowDown(outbox.Ambiguous(fmt.Errorf("%s: 503", p.what(httpReq))), retryAfter)
	case code == http.StatusRequestTimeout || code == http.StatusTooEarly || code == http.StatusTooManyRequests:
		return nil, outbox.RetryAfter(fmt.Errorf("%s: %d: not processed", p.what(httpReq), code), retryAfter)
	case code >= 500:
		return nil, outbox.RetryAfter(outbox.Ambiguous(fmt.Errorf("%s: %d", p.what(httpReq), code)), retryAfter)
	}
	return nil, outbox.PermanentBody(stored, fmt.Errorf("%s: %d", p.what(httpReq), resp.Status))
}

func (p *Provider) what(r *http.Request) string { return r.Method + " " + r.URL.Redacted() }

// newRequest builds the request of one attempt.
func (p *Provider) newRequest(ctx context.Context, req outbox.Request) (*http.Request, error) {
	target := p.config.URL
	if p.config.URLFunc != nil {
		u, err := p.config.URLFunc(req)
		if err != nil {
			return nil, fmt.Errorf("url: %w", err)
		}
		if !validURL(u) {
			return nil, fmt.Errorf("url: %q is not an absolute http or https URL", u)
		}
		target = u
	}
	body, contentType := []byte(req.Args), "application/json"
	if p.config.BodyFunc != nil {
		var err error
		if body, contentType, err = p.config.BodyFunc(req); err != nil {
			return nil, fmt.Errorf("body: %w", err)
		}
	}
	key := string(req.Key)
	if p.config.KeyFunc != nil {
		var err error
		if key, err = p.config.KeyFunc(req.Key); err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
	}
	if !validHeaderValue(key) {
		return nil, fmt.Errorf("key: %q is not a header value", key)
	}
	if key != string(req.Key) {
		// The call's span says which key went downstream when it is not
		// the call's own (telemetry.AttrDownstreamKey).
		trace.SpanFromContext(ctx).SetAttributes(attribute.String(downstreamKeyAttr, key))
	}
	httpReq, err := http.NewRequestWithContext(ctx, p.config.Method, target, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if len(body) > 0 && contentType != "" {
		httpReq.Header.Set("Content-Type", contentType)
	}
	httpReq.Header.Set(p.config.KeyHeader, key)
	if p.config.RequestFunc != nil {
		if err := p.config.RequestFunc(httpReq, req); err != nil {
			return nil, fmt.Errorf("request: %w", err)
		}
	}
	return httpReq, nil
}

// send sends r and reads its answer, bounded, and returns it with its
// Retry-After header. Its errors are already classified: ambiguous once r's
// headers may have reached the server, a plain retry before.
func (p *Provider) send(r *http.Request) (*Response, string, error) {
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{
		// From the first header on, the server may act: a body is not
		// needed for that.
		WroteHeaderField: func(string, []string) { wrote.Store(true) },
		WroteHeaders:     func() { wrote.Store(true) },
	}
	r = r.WithContext(httptrace.WithClientTrace(r.Context(), trace))
	resp, err := p.config.Client.Do(r) //nolint:gosec // G704: the URL is the service's own configuration, not user input
	if err != nil {
		return nil, "", p.transportError(r, err, wrote.Load())
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.config.MaxResponseBytes+1))
	if err != nil {
		return nil, "", outbox.Ambiguous(fmt.Errorf("%s: read response: %w", p.what(r), err))
	}
	if int64(len(body)) > p.config.MaxResponseBytes {
		return nil, "", outbox.Ambiguous(fmt.Errorf("%s: %w: more than %d bytes", p.what(r), ErrResponseTooLarge, p.config.MaxResponseBytes))
	}
	kept := header.Keep(resp.Header, p.config.KeepHeaders)
	return &Response{Status: resp.StatusCode, Header: kept, Body: body}, resp.Header.Get("Retry-After"), nil
}

func (p *Provider) transportError(r *http.Request, err error, wrote bool) error {
	if wrote {
		return outbox.Ambiguous(fmt.Errorf("%s: %w", p.what(r), err))
	}
	// Nothing reached the server: a plain retry, even for a timeout, which
	// is why the context's error is not wrapped (it would read as
	// ambiguous).
	return fmt.Errorf("%s: request not sent: %v", p.what(r), err) //nolint:errorlint // see above
}

// retryAfter reads a Retry-After value, seconds or an HTTP date, capped at
// RetryAfterMax; zero when absent or unreadable.
func (p *Provider) retryAfter(value string) time.Duration {
	if value == "" {
		return 0
	}
	var delay time.Duration
	if secs, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		delay = time.Duration(min(secs, int64(p.config.RetryAfterMax/time.Second)+1)) * time.Second
	} else if at, err := http.ParseTime(value); err == nil {
		delay = at.Sub(p.config.NowFunc())
	}
	return min(max(delay, 0), p.config.RetryAfterMax)
}
