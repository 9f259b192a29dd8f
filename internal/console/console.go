// Package console is the operator console that `pgonce console` serves:
// server-rendered pages over the public outbox API, with actions that are
// POSTs behind a CSRF token, a strict Content-Security-Policy and, off
// loopback, an access token.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// Operator is what the console needs of an outbox client; every
// *outbox.Client satisfies it, whatever its transaction type.
type Operator interface {
	Stats(ctx context.Context) (outbox.Stats, error)
	List(ctx context.Context, params outbox.ListParams) (outbox.ListResult, error)
	Run(ctx context.Context, params outbox.RunParams) (outbox.RunResult, error)
	Inspect(ctx context.Context, key outbox.Key) (outbox.Inspection, error)
	Resolve(ctx context.Context, key outbox.Key, resolution outbox.Resolution) (outbox.Result, error)
	Cancel(ctx context.Context, key outbox.Key, params outbox.CancelParams) (outbox.Result, error)
	Retry(ctx context.Context, key outbox.Key, params outbox.RetryParams) (outbox.Result, error)
}

// Config configures a console.
type Config struct {
	// Token, when not empty, is required of every request: as
	// "Authorization: Bearer TOKEN", or once as ?token=TOKEN, which sets a
	// cookie and redirects. Required by [CheckListen] off loopback.
	Token string
	// ReadOnly hides the actions and refuses every POST.
	ReadOnly bool
	// Schema is shown in the page header.
	Schema string
	// RefreshSeconds is how often the overview reloads itself. Defaults to
	// 10; -1 disables it.
	RefreshSeconds int
	// StatsInterval is the least time between two reads of
	// [outbox.Client.Stats], whose per-tool counts read the key table:
	// however many browsers show the overview, the table is counted at most
	// once an interval, and the overview says when. Defaults to 15s.
	StatsInterval time.Duration
	// Logger receives errors the pages show. Defaults to slog.Default().
	Logger *slog.Logger
	// NowFunc returns the time; for tests. Defaults to time.Now.
	NowFunc func() time.Time
}

// ErrTokenRequired is returned by [CheckListen] for an address that is
// not loopback when no token is configured.
var ErrTokenRequired = errors.New("a non-loopback listen address requires a token")

// CheckListen refuses to serve on an address other than loopback without
// a token: the console changes keys, and anyone who reaches it could.
func CheckListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if token != "" || isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("%w: %q is reachable from other hosts; pass --token or $PGONCE_CONSOLE_TOKEN, or listen on 127.0.0.1", ErrTokenRequired, addr)
}

func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

const (
	cookieCSRF  = "pgonce_console_csrf"
	cookieToken = "pgonce_console_token" //nolint:gosec // a cookie name, not a credential
	// csp allows nothing but the console's own stylesheet and images and
	// forms posted back to it: no script of any origin, inline or not.
	csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

// Handler serves the console.
type Handler struct {
	ops      Operator
	config   Config
	pages    map[string]*template.Template
	mux      *http.ServeMux
	protect  *http.CrossOriginProtection
	tokenSet bool
	stats    statsCache
}

// New returns the console over ops.
func New(ops Operator, config Config) (*Handler, error) {
	if ops == nil {
		return nil, errors.New("console: Operator is required")
	}
	if config.RefreshSeconds == 0 {
		config.RefreshSeconds = 10
	}
	if config.Logger == nil {
		config.Logger = slog.Default()
	}
	if config.StatsInterval == 0 {
		config.StatsInterval = 15 * time.Second
	}
	if config.NowFunc == nil {
		config.NowFunc = time.Now
	}
	h := &Handler{ops: ops, config: config, mux: http.NewServeMux(), protect: http.NewCrossOriginProtection(), tokenSet: config.Token != ""}
	if err := h.parseTemplates(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /keys", h.keys)
	h.mux.HandleFunc("GET /run", h.run)
	h.mux.HandleFunc("GET /keys/{key}", h.key)
	h.mux.HandleFunc("GET /keys/{key}/raw/{part}", h.raw)
	h.mux.HandleFunc("GET /keys/{key}/{action}", h.confirm)
	h.mux.HandleFunc("POST /keys/{key}/{action}", h.act)
	return h, nil
}

// ServeHTTP applies the console's security headers, the token and the
// Host check, then serves the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	header := w.Header()
	header.Set("Content-Security-Policy", csp)
	header.Set("X-Content-Type-Options", "nosniff")
	header.Set("X-Frame-Options", "DENY")
	header.Set("Referrer-Policy", "no-referrer")
	header.Set("Cache-Control", "no-store")
	if !h.tokenSet && !isLoopbackHost(hostOnly(r.Host)) {
		// Without a token the console trusts loopback; a page elsewhere that
		// resolves its own name to 127.0.0.1 (DNS rebinding) sends its own
		// Host, and is refused.
		h.refuse(w, r, http.StatusForbidden, "This console serves loopback host names only (Host "+r.Host+"). Start it with --token to serve others.")
		return
	}
	if h.tokenSet && !h.authorized(w, r) {
		return
	}
	if r.Method == http.MethodPost {
		if err := h.protect.Check(r); err != nil {
			h.refuse(w, r, http.StatusForbidden, "Cross-origin request refused: "+err.Error())
			return
		}
	}
	h.ensureCSRFCookie(w, r)
	h.mux.ServeHTTP(w, r)
}

func hostOnly(hostport string) string {
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		return host
	}
	return hostport
}

func (h *Handler) authorized(w http.ResponseWriter, r *http.Request) bool {
	if auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(auth, h.config.Token) {
		return true
	}
	if c, err := r.Cookie(cookieToken); err == nil && equal(c.Value, h.config.Token) {
		return true
	}
	if q := r.URL.Query().Get("token"); q != "" && r.Method == http.MethodGet {
		if equal(q, h.config.Token) {
			http.SetCookie(w, sessionCookie(r, cookieToken, q))
			// Back to the same page without the token in its address (and
			// so in the history). The target is a path of this console.
			query := r.URL.Query()
			query.Del("token")
			target := "/" + strings.TrimLeft(r.URL.Path, "/")
			if len(query) > 0 {
				target += "?" + query.Encode()
			}
			http.Redirect(w, r, target, http.StatusSeeOther) //nolint:gosec // target is a local path: leading slashes are trimmed to one
			return false
		}
	}
	h.refuse(w, r, http.StatusUnauthorized, "This console needs its token: open it as /?token=TOKEN, or send Authorization: Bearer TOKEN.")
	return false
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// ensureCSRFCookie gives the browser a random CSRF secret, which every form
// repeats in a hidden field; a POST whose field differs is refused.
func (h *Handler) ensureCSRFCookie(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(cookieCSRF); err == nil && len(c.Value) == 32 {
		return
	}
	secret := newSecret()
	cookie := sessionCookie(r, cookieCSRF, secret)
	http.SetCookie(w, cookie)
	r.AddCookie(cookie)
}

// sessionCookie is an HttpOnly, SameSite=Strict cookie for the whole
// console, Secure when the request came over TLS (the console itself
// serves plain HTTP, on loopback unless a token is set).
func sessionCookie(r *http.Request, name, value string) *http.Cookie {
	return &http.Cookie{ //nolint:gosec // Secure over TLS only: the console serves plain HTTP
		Name: name, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	}
}

func newSecret() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func csrfToken(r *http.Request) string {
	if c, err := r.Cookie(cookieCSRF); err == nil {
		return c.Value
	}
	return ""
}

func validCSRF(r *http.Request) bool {
	cookie := csrfToken(r)
	return cookie != "" && equal(r.PostFormValue("csrf"), cookie)
}

func ago(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	return d.Round(time.Second).String()
}
