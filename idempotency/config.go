package idempotency

import (
	"cmp"
	"fmt"
	"net/http"
	"time"

	"github.com/pgonce/pgonce/internal/header"
	"github.com/pgonce/pgonce/outbox"
)

// Defaults of [Config].
const (
	// HeaderDefault is the request header that carries the key.
	HeaderDefault = "Idempotency-Key"
	// ToolDefault is the tool name the middleware's keys are claimed under.
	ToolDefault = "http_request"
	// MaxKeyLengthDefault is the longest key accepted, in bytes.
	MaxKeyLengthDefault = 255
	// MaxRequestBytesDefault bounds the request body read to fingerprint it.
	MaxRequestBytesDefault = 1 << 20
	// MaxResponseBytesDefault bounds the response stored.
	MaxResponseBytesDefault = 1 << 20
	// RetryAfterDefault is the Retry-After of a 409 for a key in progress.
	RetryAfterDefault = time.Second
	// WaitTimeoutDefault is how long a duplicate waits for the first
	// request of its key.
	WaitTimeoutDefault = 5 * time.Second
	// ReplayedHeader marks a replayed response, as Stripe's API does.
	ReplayedHeader = "Idempotent-Replayed"
)

// Mode says where a handler's effects live, and so how its key is held.
type Mode int

const (
	// ModeTx is for handlers whose effects live in the same PostgreSQL: the
	// key is claimed in a transaction that the handler writes in ([Tx]),
	// and its response is stored in it; one commit holds all.
	ModeTx Mode = iota
	// ModeLease is for handlers that call the outside world: the key is
	// claimed in flight under a lease, as [outbox.Client.Do] does, the
	// handler runs under the client's CallTimeout, and its response is
	// stored once it returns, whatever its status (but a 5xx on an
	// [outbox.IdempotentByKey] route, which is no outcome). A duplicate
	// that arrives while it runs waits for it up to [Config.WaitTimeout]
	// and replays its response, as in ModeTx. A request
	// abandoned mid-way (a crash, a panic, a timeout) is resolved by the
	// tool's delivery, as [Register] registered it: [outbox.AtMostOnce]
	// sends it to review, and the key answers 409 until an operator
	// resolves it; [outbox.IdempotentByKey], for a handler that passes
	// [Key] downstream, puts it back to pending, and the next request with
	// the key runs the handler again.
	ModeLease
)

// Config configures a [Middleware]. Its zero value works, but a service
// with more than one account must set ScopeFunc.
type Config struct {
	// Mode says where the handler's effects live. Defaults to [ModeTx].
	Mode Mode
	// Methods are the request methods the middleware handles; others pass
	// through untouched. Defaults to POST and PATCH, as the IETF draft
	// suggests.
	Methods []string
	// Header names the request header that carries the key. Defaults to
	// [HeaderDefault].
	Header string
	// KeyRequired answers a handled request without a key with 400. By
	// default such a request passes through to the handler unprotected.
	KeyRequired bool
	// MaxKeyLength bounds a key's length in bytes; a longer key is a 400.
	// Defaults to [MaxKeyLengthDefault]; at most 512.
	MaxKeyLength int
	// ScopeFunc returns the scope of a request's key: the authenticated
	// account or tenant. Keys of different scopes never meet: one account
	// never receives another's stored response, nor blocks another's key.
	// An error answers 401. Defaults to one scope for every request.
	ScopeFunc func(r *http.Request) (string, error)
	// Tool is the tool name the keys are claimed under. It must be
	// registered in the client's registry by [Register]. Defaults to
	// [ToolDefault].
	Tool string
	// KeepHeaders names the response headers stored and replayed with the
	// status and body. Defaults to every header the handler set but
	// Set-Cookie, Date and hop-by-hop headers.
	KeepHeaders []string
	// MaxRequestBytes bounds the request body; a larger one is a 413.
	// Defaults to [MaxRequestBytesDefault].
	MaxRequestBytes int64
	// MaxResponseBytes bounds the response body a handler may write: a
	// larger response is refused with a 500 problem, the transaction
	// rolled back and nothing stored, never truncated. Defaults to
	// [MaxResponseBytesDefault].
	MaxResponseBytes int
	// RetryAfter is the Retry-After sent with a 409 for a key in progress.
	// Defaults to [RetryAfterDefault].
	RetryAfter time.Duration
	// WaitTimeout is how long a duplicate that arrives while the first
	// request of its key is running waits for it, then replays its
	// response; past it the duplicate is answered 409 with Retry-After.
	// It applies in both modes: in [ModeTx] the duplicate waits on the
	// key's row lock, in [ModeLease] for the key's outcome. In ModeLease a
	// claim that fails transiently is tried again within it too. Defaults
	// to [WaitTimeoutDefault].
	WaitTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	c.Header = cmp.Or(c.Header, HeaderDefault)
	c.MaxKeyLength = cmp.Or(c.MaxKeyLength, MaxKeyLengthDefault)
	c.Tool = cmp.Or(c.Tool, ToolDefault)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, MaxRequestBytesDefault)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, MaxResponseBytesDefault)
	c.RetryAfter = cmp.Or(c.RetryAfter, RetryAfterDefault)
	c.WaitTimeout = cmp.Or(c.WaitTimeout, WaitTimeoutDefault)
	if c.ScopeFunc == nil {
		c.ScopeFunc = func(*http.Request) (string, error) { return "", nil }
	}
	c.KeepHeaders = header.Canonical(c.KeepHeaders)
	return c
}

func (c Config) validate() error {
	switch {
	case c.Mode != ModeTx && c.Mode != ModeLease:
		return fmt.Errorf("%w: unknown Mode %d", ErrInvalidConfig, int(c.Mode))
	case c.MaxKeyLength < 1 || c.MaxKeyLength > outbox.CallStringMaxBytes:
		return fmt.Errorf("%w: MaxKeyLength must be between 1 and %d", ErrInvalidConfig, outbox.CallStringMaxBytes)
	case c.MaxRequestBytes < 0 || c.MaxResponseBytes < 0 || c.RetryAfter < 0 || c.WaitTimeout < 0:
		return fmt.Errorf("%w: MaxRequestBytes, MaxResponseBytes, RetryAfter and WaitTimeout must not be negative", ErrInvalidConfig)
	case !header.ValidToken(c.Header):
		return fmt.Errorf("%w: Header %q must be a header name", ErrInvalidConfig, c.Header)
	}
	if name, bad := header.InvalidName(c.KeepHeaders); bad {
		return fmt.Errorf("%w: KeepHeaders: %q must be a header name", ErrInvalidConfig, name)
	}
	return nil
}
