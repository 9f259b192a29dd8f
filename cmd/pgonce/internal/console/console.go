// Package console is the operator console that `pgonce console` serves:
// server-rendered pages over the public outbox API (an overview of recent
// and all-time counts, lists of keys, a search by what an operator knows,
// runs, one key with its attempts), with actions on one key or many that
// are POSTs behind a CSRF token, a strict Content-Security-Policy and, off
// loopback, an access token, traded once for an expiring session cookie
// that holds an HMAC, never the token. Pages show stored and requested
// text, form inputs included, with its bidi, zero-width and other hidden
// characters written out (⟨U+202E⟩); bad filters are 400s, and a server
// error's text stays in the log.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// Operator is what the console needs of an outbox client; every
// *outbox.Client satisfies it, whatever its transaction type.
type Operator interface {
	Stats(ctx context.Context) (outbox.Stats, error)
	CountCreated(ctx context.Context, params outbox.CountCreatedParams) (outbox.CreatedCounts, error)
	List(ctx context.Context, params outbox.ListParams) (outbox.ListResult, error)
	Search(ctx context.Context, params outbox.SearchParams) (outbox.SearchResult, error)
	RunSteps(ctx context.Context, params outbox.RunParams) (outbox.RunResult, error)
	Inspect(ctx context.Context, key outbox.Key) (outbox.Inspection, error)
	Resolve(ctx context.Context, key outbox.Key, resolution outbox.Resolution) (outbox.Result, error)
	Cancel(ctx context.Context, key outbox.Key, params outbox.CancelParams) (outbox.Result, error)
	Retry(ctx context.Context, key outbox.Key, params outbox.RetryParams) (outbox.Result, error)
	Tools(ctx context.Context) ([]outbox.ToolStatus, error)
	Pause(ctx context.Context, tool string, params outbox.PauseParams) (outbox.ToolStatus, error)
	Resume(ctx context.Context, tool string, params outbox.ResumeParams) (outbox.ToolStatus, error)
}

// Config configures a console.
type Config struct {
	// Token, when not empty, is required of every request: as
	// "Authorization: Bearer TOKEN", or once as ?token=TOKEN, which is
	// traded for a session cookie and a redirect. The cookie holds no
	// token: it holds an expiry and an HMAC of it keyed by the token, so a
	// service on another port of the host (browsers send a host's cookies
	// to every port) learns nothing that outlives SessionLifetime. At least
	// [TokenMinBytes] bytes ([NewToken] makes one). Required by
	// [CheckListen] off loopback.
	Token string
	// SessionLifetime is how long the session cookie a token is traded for
	// lasts; then the browser presents the token again. Defaults to
	// [SessionLifetimeDefault].
	SessionLifetime time.Duration
	// SecureCookie marks the console's cookies Secure even though the
	// request came over plain HTTP: for a console behind a proxy that
	// terminates TLS, whose browsers must never send the cookies in clear.
	// A request over TLS gets Secure cookies anyway.
	SecureCookie bool
	// ReadOnly hides the actions and refuses every POST.
	ReadOnly bool
	// Schema is shown in the page header, to clients that passed the
	// token and Host checks only.
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

// ErrTokenTooShort is returned by [CheckToken] and [New] for a token of
// fewer than [TokenMinBytes] bytes.
var ErrTokenTooShort = errors.New("the console token is too short")

const (
	// TokenMinBytes is the shortest token the console accepts.
	TokenMinBytes = 16
	// SessionLifetimeDefault is the default [Config.SessionLifetime].
	SessionLifetimeDefault = 12 * time.Hour
)

// CheckToken refuses a token that is set but shorter than [TokenMinBytes],
// with an error matching [ErrTokenTooShort]. An empty token is no token.
func CheckToken(token string) error {
	if token != "" && len(token) < TokenMinBytes {
		return fmt.Errorf("%w: it has %d bytes, at least %d are required; leave it out to have one generated", ErrTokenTooShort, len(token), TokenMinBytes)
	}
	return nil
}

// NewToken returns a random token: 32 hex digits, 128 bits.
func NewToken() string { return newSecret() }

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
	cookieCSRF    = "pgonce_console_csrf"
	cookieSession = "pgonce_console_session"
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
	if err := CheckToken(config.Token); err != nil {
		return nil, err
	}
	if config.SessionLifetime < 0 {
		return nil, errors.New("console: SessionLifetime must not be negative")
	}
	if config.SessionLifetime == 0 {
		config.SessionLifetime = SessionLifetimeDefault
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
	h.mux.HandleFunc("POST /keys/bulk", h.bulk)
	h.mux.HandleFunc("GET /search", h.search)
	h.mux.HandleFunc("GET /run", h.run)
	h.mux.HandleFunc("GET /keys/{key}", h.key)
	h.mux.HandleFunc("GET /keys/{key}/raw/{part}", h.raw)
	h.mux.HandleFunc("GET /keys/{key}/{action}", h.confirm)
	h.mux.HandleFunc("POST /keys/{key}/{action}", h.act)
	h.mux.HandleFunc("GET /tools/{tool}/{action}", h.toolConfirm)
	h.mux.HandleFunc("POST /tools/{tool}/{action}", h.toolAct)
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
		h.refuseAnonymous(w, r, http.StatusForbidden, "This console serves loopback host names only (Host "+r.Host+"). Start it with --token to serve others.")
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
	if c, err := r.Cookie(cookieSession); err == nil && h.validSession(c.Value) {
		return true
	}
	if q := r.URL.Query().Get("token"); q != "" && r.Method == http.MethodGet {
		if equal(q, h.config.Token) {
			cookie := h.cookie(r, cookieSession, h.newSession()) //nolint:gosec // HttpOnly, SameSite=Strict; Secure over TLS or by Config.SecureCookie
			cookie.MaxAge = int(h.config.SessionLifetime / time.Second)
			http.SetCookie(w, cookie)
			// Back to the same page without the token in its address (and
			// so in the history).
			query := r.URL.Query()
			query.Del("token")
			http.Redirect(w, r, localTarget(r.URL.EscapedPath(), query), http.StatusSeeOther) //nolint:gosec // localTarget admits only this console's paths
			return false
		}
	}
	h.refuseAnonymous(w, r, http.StatusUnauthorized, "This console needs its token: open it as /?token=TOKEN, or send Authorization: Bearer TOKEN.")
	return false
}

// localTarget is a redirect target that stays on this console: path with
// query, or "/" for a path that a browser could read as another host's
// ("//host", "/\host" and their escaped spellings) or that is no
// absolute path.
func localTarget(path string, query url.Values) string {
	unescaped, err := url.PathUnescape(path)
	if err != nil || !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") ||
		strings.HasPrefix(unescaped, "//") || strings.ContainsAny(unescaped, "\\\x00\r\n\t") {
		path, query = "/", nil
	}
	if len(query) > 0 {
		return path + "?" + query.Encode()
	}
	return path
}

// newSession returns a session cookie's value: its expiry in Unix seconds
// and an HMAC-SHA256 of it keyed by the token. It proves that the browser
// once presented the token, and reveals nothing of it.
func (h *Handler) newSession() string {
	expiry := strconv.FormatInt(h.config.NowFunc().Add(h.config.SessionLifetime).Unix(), 10)
	return expiry + "." + h.sessionMAC(expiry)
}

func (h *Handler) sessionMAC(expiry string) string {
	mac := hmac.New(sha256.New, []byte(h.config.Token))
	_, _ = mac.Write([]byte("pgonce console session\x00" + expiry))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// validSession reports whether value is a session this console's token
// made, and not expired.
func (h *Handler) validSession(value string) bool {
	expiry, mac, ok := strings.Cut(value, ".")
	if !ok {
		return false
	}
	unix, err := strconv.ParseInt(expiry, 10, 64)
	if err != nil || h.config.NowFunc().Unix() >= unix {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(h.sessionMAC(expiry)))
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// ensureCSRFCookie gives the browser a random CSRF secret, which every form
// repeats in a hidden field; a POST whose field differs is refused.
func (h *Handler) ensureCSRFCookie(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(cookieCSRF); err == nil && len(c.Value) == 32 {
		return
	}
	secret := newSecret()
	cookie := h.cookie(r, cookieCSRF, secret)
	http.SetCookie(w, cookie)
	r.AddCookie(cookie)
}

// cookie is an HttpOnly, SameSite=Strict cookie for the whole console,
// Secure when the request came over TLS or [Config.SecureCookie] says a
// proxy in front terminates it (the console itself serves plain HTTP, on
// loopback unless a token is set).
func (h *Handler) cookie(r *http.Request, name, value string) *http.Cookie {
	return &http.Cookie{ //nolint:gosec // Secure over TLS or by Config.SecureCookie: the console serves plain HTTP
		Name: name, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || h.config.SecureCookie,
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
