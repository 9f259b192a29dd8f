package console_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// noRedirects is a client without cookies that shows redirects.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// testToken is a token of the length the console requires.
const testToken = "0123456789abcdef-console-token"

// bidi holds every Unicode bidi control.
const bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

// requireNoRawBidi fails t when page shows a character the console writes
// out (a bidi or zero-width control, another format or control
// character) raw anywhere: in its text, an attribute, an input's value or
// a text area.
func requireNoRawBidi(t *testing.T, path, page string) {
	t.Helper()
	i := strings.IndexFunc(page, func(c rune) bool {
		return c != '\t' && c != '\n' && c != '\r' && (unicode.Is(unicode.Cf, c) || unicode.IsControl(c))
	})
	if i >= 0 {
		require.FailNow(t, "a hidden character is shown raw", "%s: %q", path, page[max(0, i-60):min(len(page), i+60)])
	}
}

// formFields matches a page's text inputs and text areas: the name and the
// value each shows.
var formFields = regexp.MustCompile(`(?s)<input ([^>]*)>|<textarea [^>]*name="([^"]*)"[^>]*>(.*?)</textarea>`)

var (
	attrName  = regexp.MustCompile(`\bname="([^"]*)"`)
	attrValue = regexp.MustCompile(`\bvalue="([^"]*)"`)
	attrType  = regexp.MustCompile(`\btype="([^"]*)"`)
)

// textFields returns the values a page's text inputs and text areas show,
// by name, unescaped; hidden inputs, check boxes and radio buttons are
// left out.
func textFields(page string) map[string][]string {
	fields := map[string][]string{}
	for _, m := range formFields.FindAllStringSubmatch(page, -1) {
		if m[1] == "" {
			fields[m[2]] = append(fields[m[2]], html.UnescapeString(m[3]))
			continue
		}
		if typ := attrType.FindStringSubmatch(m[1]); typ != nil && typ[1] != "text" && typ[1] != "search" {
			continue
		}
		name, value := attrName.FindStringSubmatch(m[1]), attrValue.FindStringSubmatch(m[1])
		if name == nil {
			continue
		}
		v := ""
		if value != nil {
			v = html.UnescapeString(value[1])
		}
		fields[name[1]] = append(fields[name[1]], v)
	}
	return fields
}

func TestEdges(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testEdges[pgx.Tx], testEdges[*sql.Tx])
}

func testEdges[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("BidiControlsShownVisiblyEverywhere", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		tenant, run := "acme\u202egnp.exe\u202c", "run\u2066-7\u2069"
		call := outbox.Call{
			Tenant: tenant, RunID: run, Step: 1, Tool: "email",
			Args:     map[string]any{"to": "ana\u202e@example.com" + bidi, "n": 1},
			Metadata: map[string]string{"ticket\u200f": "OPS\u202e-7", "all": bidi},
		}
		res, err := b.client.Do(t.Context(), call, outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, outbox.Ambiguous(errors.New("timeout \u202eat the provider" + bidi))
		}))
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, res.State)
		key := res.Key
		pendingCall := call
		pendingCall.Step, pendingCall.Tool = 2, "refund"
		_, err = b.client.Submit(t.Context(), pendingCall)
		require.NoError(t, err)

		pages := []string{
			"/", "/?window=1h", "/?window=24h", "/keys", "/keys?tenant=" + url.QueryEscape(tenant), "/keys?run=" + url.QueryEscape(run),
			"/keys?state=succeeded&state=expired",
			"/run?run=" + url.QueryEscape(run) + "&tenant=" + url.QueryEscape(tenant), "/run?run=" + url.QueryEscape(run),
			"/search?q=" + url.QueryEscape("ana\u202e"), "/search?q=" + url.QueryEscape(run), "/search?q=" + url.QueryEscape(tenant),
			"/keys/" + string(key), "/keys/" + string(key) + "/resolve",
		}
		for _, path := range pages {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusOK, status, path+": "+page)
			requireNoRawBidi(t, path, page)
		}
		_, page := b.get(t, "/keys/"+string(key))
		page = html.UnescapeString(page)
		require.Contains(t, page, "acme⟨U+202E⟩gnp.exe⟨U+202C⟩", "the tenant as stored, its controls visible")
		require.Contains(t, page, "run⟨U+2066⟩-7⟨U+2069⟩")
		require.Contains(t, page, "OPS⟨U+202E⟩-7")
		require.Contains(t, page, "ticket⟨U+200F⟩")
		require.Contains(t, page, "timeout ⟨U+202E⟩at the provider⟨U+061C⟩⟨U+200E⟩⟨U+200F⟩⟨U+202A⟩⟨U+202B⟩⟨U+202C⟩⟨U+202D⟩⟨U+202E⟩⟨U+2066⟩⟨U+2067⟩⟨U+2068⟩⟨U+2069⟩")
		require.Contains(t, page, "ana⟨U+202E⟩@example.com", "the arguments")

		// The raw bytes stay downloadable as they are.
		_, raw := b.get(t, "/keys/"+string(key)+"/raw/args")
		require.Contains(t, raw, "ana\u202e@example.com")

		// An action's name and reason, on the result page and the key's
		// history.
		csrf := b.confirm(t, key, "resolve")
		status, page := b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", url.Values{
			"csrf": {csrf}, "outcome": {"succeeded"}, "body": {`{"sent":true}`},
			"by": {"ana\u202e"}, "reason": {"checked\u2067 the log" + bidi},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		requireNoRawBidi(t, "result", page)
		require.Contains(t, html.UnescapeString(page), "ana⟨U+202E⟩")
		_, page = b.get(t, "/keys/"+string(key))
		requireNoRawBidi(t, "/keys/"+string(key), page)
		require.Contains(t, html.UnescapeString(page), "checked⟨U+2067⟩ the log")

		// A bulk action's name and reason, on its confirmation and result
		// pages.
		pending, err := b.client.Submit(t.Context(), outbox.Call{Tenant: tenant, RunID: run, Step: 3, Tool: "refund", Args: map[string]any{"n": 3}})
		require.NoError(t, err)
		bulk := url.Values{"csrf": {csrf}, "action": {"cancel"}, "key": {string(pending.Key)}, "by": {"ana\u202e"}, "reason": {"bulk\u2067" + bidi}}
		for _, confirm := range []string{"", "yes"} {
			bulk.Set("confirm", confirm)
			status, page = b.send(t, http.MethodPost, "/keys/bulk", bulk, nil)
			require.Equal(t, http.StatusOK, status, page)
			requireNoRawBidi(t, "bulk "+confirm, page)
		}
		require.Equal(t, outbox.StateCancelled, b.inspect(t, pending.Key).State)

		// A malformed filter is echoed in the error page visibly too.
		_, page = b.get(t, "/keys?cursor="+url.QueryEscape("x\u202ey"))
		requireNoRawBidi(t, "bad cursor", page)
	})

	t.Run("RequestTextShownVisiblyInEveryInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		const typed, shown = "ord\u202e\u200b42", "ord⟨U+202E⟩⟨U+200B⟩42"
		review := b.needsReview(t)
		call := b.call("refund")
		call.Args = map[string]any{"order": typed}
		pending, err := b.client.Submit(t.Context(), call)
		require.NoError(t, err)

		// check fails t when the page shows a hidden character raw, or
		// unless each of its text inputs and text areas named want shows
		// what was typed visibly.
		check := func(t *testing.T, what string, page string, want ...string) {
			t.Helper()
			requireNoRawBidi(t, what, page)
			fields := textFields(page)
			for _, name := range want {
				require.NotEmpty(t, fields[name], "%s: the page has a %s field", what, name)
				for _, value := range fields[name] {
					require.Equal(t, shown, value, "%s: field %s", what, name)
				}
			}
		}
		q := url.QueryEscape(typed)
		for path, want := range map[string][]string{
			"/?q=" + q:                        {"q"},
			"/search?q=" + q + "&tenant=" + q: {"q", "tenant"},
			"/keys?tool=" + q + "&tenant=" + q + "&run=" + q + "&q=" + q: {"q", "tool", "tenant", "run"},
			"/run?run=" + q + "&tenant=" + q + "&q=" + q:                 {"q"},
			"/keys/" + string(review) + "?q=" + q:                        {"q"},
			"/keys/" + string(review) + "/resolve?q=" + q:                {"q"},
			"/tools/refund/pause?q=" + q:                                 {"q"},
		} {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusOK, status, "%s: %s", path, page)
			check(t, path, page, want...)
		}

		// Forms shown again: a resolution whose body is no JSON, a bulk
		// action's review, a pause without a reason or a name.
		csrf := b.confirm(t, review, "resolve")
		status, page := b.send(t, http.MethodPost, "/keys/"+string(review)+"/resolve", url.Values{
			"csrf": {csrf}, "outcome": {"succeeded"}, "body": {typed}, "by": {typed}, "reason": {typed},
		}, nil)
		require.Equal(t, http.StatusBadRequest, status, page)
		check(t, "resolve", page, "body", "by", "reason")
		require.Equal(t, outbox.StateNeedsReview, b.inspect(t, review).State, "nothing changed")
		bulk := url.Values{"csrf": {csrf}, "action": {"cancel"}, "key": {string(pending.Key)}, "by": {typed}, "reason": {typed}}
		status, page = b.send(t, http.MethodPost, "/keys/bulk", bulk, nil)
		require.Equal(t, http.StatusOK, status, page)
		check(t, "bulk", page, "by", "reason")
		for _, field := range []string{"by", "reason"} {
			form := url.Values{"csrf": {csrf}, field: {typed}}
			status, page = b.send(t, http.MethodPost, "/tools/refund/pause", form, nil)
			require.Equal(t, http.StatusBadRequest, status, page)
			check(t, "pause", page, field)
		}

		// What a page shows, sent back, means what was typed: the search
		// finds the key by its arguments, and the bulk action records the
		// name and reason as typed.
		status, page = b.get(t, "/search?q="+url.QueryEscape(shown))
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, string(pending.Key), "the search box's text finds what the typed text found")
		bulk.Set("by", shown)
		bulk.Set("reason", shown)
		bulk.Set("confirm", "yes")
		status, page = b.send(t, http.MethodPost, "/keys/bulk", bulk, nil)
		require.Equal(t, http.StatusOK, status, page)
		in := b.inspect(t, pending.Key)
		require.Equal(t, outbox.StateCancelled, in.State)
		require.Len(t, in.Resolutions, 1)
		require.Equal(t, typed, in.Resolutions[0].By)
		require.Equal(t, typed, in.Resolutions[0].Reason)
	})

	t.Run("BadListFiltersAre400WithoutDatabaseText", func(t *testing.T) {
		t.Parallel()
		logger, logs := pgoncetest.CaptureLogs()
		b := setup(t, driver, console.Config{Logger: logger})
		b.needsReview(t)
		huge := strings.Repeat("t", 100<<10)
		for _, field := range []string{"tenant", "tool", "run"} {
			for _, value := range []string{"a\x00b", "\xff\xfe", huge} {
				path := "/keys?" + field + "=" + url.QueryEscape(value)
				status, page := b.get(t, path)
				require.Equal(t, http.StatusBadRequest, status, "%s=%.40q: %.400s", field, value, page)
				require.Contains(t, page, `id="problem"`)
				require.Contains(t, page, field+": must ")
				for _, text := range []string{"SQLSTATE", "22021", "invalid byte sequence", "pgonce_key"} {
					require.NotContains(t, page, text)
				}
			}
		}
		for _, record := range logs.Records() {
			require.Less(t, record.Level, slog.LevelError, "nothing logged at ERROR: %s %v", record.Message, record.Attrs)
		}
	})

	t.Run("ServerErrorsShowNoDatabaseText", func(t *testing.T) {
		t.Parallel()
		logger, logs := pgoncetest.CaptureLogs()
		b := setup(t, driver, console.Config{Logger: logger})
		// The key table out of the way, every read fails in the database.
		table := ident.Quote(b.schema) + ".pgonce_key"
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `ALTER TABLE `+table+` RENAME TO pgonce_key_away`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pgoncetest.Pool(t).Exec(context.WithoutCancel(t.Context()), `ALTER TABLE `+ident.Quote(b.schema)+`.pgonce_key_away RENAME TO pgonce_key`)
			require.NoError(t, err)
		})
		status, page := b.get(t, "/keys")
		require.Equal(t, http.StatusInternalServerError, status)
		require.Contains(t, page, "the error is in its log")
		require.NotContains(t, page, "pgonce_key")
		require.NotContains(t, page, "SQLSTATE")
		require.NotEmpty(t, logs.Matching(func(r pgoncetest.LogRecord) bool { return r.Level == slog.LevelError }), "the operator finds it in the log")
	})

	t.Run("TokenTradeRedirectsOnlyWithinTheConsole", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{Token: testToken})
		for path, want := range map[string]string{
			"/%5Cevil.example/":          "/",
			"/%5cevil.example/x":         "/",
			"/%2F%5Cevil.example/":       "/",
			"/%2F%2Fevil.example/":       "/",
			"/%09/evil.example/":         "/",
			"/keys":                      "/keys",
			"/keys/k1_00/resolve":        "/keys/k1_00/resolve",
			"/keys?state=needs_review":   "/keys?state=needs_review",
			"/keys?tenant=a%5Cb&state=x": "/keys?state=x&tenant=a%5Cb",
		} {
			sep := "?"
			if strings.Contains(path, "?") {
				sep = "&"
			}
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+path+sep+"token="+testToken, nil)
			require.NoError(t, err)
			// A browser without the session cookie: each request trades.
			resp, err := noRedirects.Do(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, http.StatusSeeOther, resp.StatusCode, path)
			require.Equal(t, want, resp.Header.Get("Location"), path)
		}
	})

	t.Run("SessionCookieHoldsNoTokenAndExpires", func(t *testing.T) {
		t.Parallel()
		var now atomic.Int64
		now.Store(time.Date(2026, 1, 2, 15, 4, 0, 0, time.UTC).Unix())
		b := setup(t, driver, console.Config{
			Token: testToken, SessionLifetime: time.Hour,
			NowFunc: func() time.Time { return time.Unix(now.Load(), 0) },
		})
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/keys?token="+testToken, nil)
		require.NoError(t, err)
		resp, err := b.browser.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		var session *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == "pgonce_console_session" {
				session = c
			}
		}
		require.NotNil(t, session, "a session cookie")
		require.NotContains(t, session.Value, testToken)
		require.NotContains(t, resp.Header.Get("Set-Cookie"), testToken)
		require.Equal(t, 3600, session.MaxAge)
		require.True(t, session.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, session.SameSite)
		require.False(t, session.Secure, "plain HTTP, no SecureCookie")

		status, _ := b.get(t, "/keys")
		require.Equal(t, http.StatusOK, status, "the session lets the browser in")
		now.Add(3599)
		status, _ = b.get(t, "/keys")
		require.Equal(t, http.StatusOK, status)
		now.Add(1)
		status, _ = b.get(t, "/keys")
		require.Equal(t, http.StatusUnauthorized, status, "the session expired")

		for _, value := range []string{testToken, session.Value + "x", "99999999999." + strings.SplitN(session.Value, ".", 2)[1]} {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/keys", nil)
			require.NoError(t, err)
			req.AddCookie(&http.Cookie{Name: "pgonce_console_session", Value: value})
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "forged session %q", value)
		}
	})

	t.Run("SecureCookieBehindATLSProxy", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{Token: testToken, SecureCookie: true})
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/?token="+testToken, nil)
		require.NoError(t, err)
		resp, err := b.browser.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.NotEmpty(t, resp.Cookies())
		for _, c := range resp.Cookies() {
			require.True(t, c.Secure, c.Name)
		}
	})

	t.Run("UnauthenticatedClientsSeeNoSchema", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{Token: testToken})
		status, page := b.get(t, "/")
		require.Equal(t, http.StatusUnauthorized, status)
		require.NotContains(t, page, b.schema)
		require.NotContains(t, page, "schema")

		open := setup(t, driver, console.Config{})
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, open.server.URL+"/", nil)
		require.NoError(t, err)
		req.Host = "attacker.example:8480"
		resp, err := open.browser.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
		forbidden, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.NotContains(t, string(forbidden), open.schema)

		status, page = b.send(t, http.MethodGet, "/", nil, http.Header{"Authorization": {"Bearer " + testToken}})
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, page, "schema "+b.schema, "shown once authenticated")
	})
}

func TestShortTokenRefused(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"s3cret", strings.Repeat("x", console.TokenMinBytes-1)} {
		_, err := console.New(nilOperator{}, console.Config{Token: token})
		require.ErrorIs(t, err, console.ErrTokenTooShort)
		require.ErrorIs(t, console.CheckToken(token), console.ErrTokenTooShort)
	}
	require.NoError(t, console.CheckToken(""))
	require.NoError(t, console.CheckToken(strings.Repeat("x", console.TokenMinBytes)))
	require.Len(t, console.NewToken(), 32)
	first, second := console.NewToken(), console.NewToken()
	require.NotEqual(t, first, second)
	require.NoError(t, console.CheckToken(console.NewToken()))
}

// nilOperator is an Operator for tests that never reach it.
type nilOperator struct{ console.Operator }
