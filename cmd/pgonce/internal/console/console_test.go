package console_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// testBundle is a console over a fresh schema, served on loopback, and a
// browser-like client with a cookie jar.
type testBundle[TTx any] struct {
	schema  string
	client  *outbox.Client[TTx]
	server  *httptest.Server
	browser *http.Client
	seq     atomic.Int64
}

func setup[TTx any](t *testing.T, driver drivertest.Driver[TTx], config console.Config) *testBundle[TTx] {
	t.Helper()
	schema := pgoncetest.Schema(t)
	ok := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})
	// A refund of order 7731 never gets through: its payment provider is
	// down, and every attempt is retried until the attempts run out.
	refund := outbox.ProviderFunc(func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
		if strings.Contains(string(req.Args), `"order":7731`) {
			return nil, fmt.Errorf("attempt %d: 503 Service Unavailable from the payment provider", req.Attempt)
		}
		return json.RawMessage(`{"id":"re_3NkU","status":"succeeded"}`), nil
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", refund, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("email", ok, outbox.AtMostOnce))
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)})
	config.Schema = schema
	handler, err := console.New(client, config)
	require.NoError(t, err)
	server := httptest.NewServer(handler)
	t.Cleanup(server.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(browser.CloseIdleConnections)
	return &testBundle[TTx]{schema: schema, client: client, server: server, browser: browser}
}

func (b *testBundle[TTx]) call(tool string) outbox.Call {
	n := b.seq.Add(1)
	return outbox.Call{
		RunID: "run-1", Step: n, Tool: tool, Args: map[string]any{"order": 8842, "amount": "42.00", "n": n},
		Metadata: map[string]string{"ticket": "OPS-7"},
	}
}

func (b *testBundle[TTx]) do(t *testing.T, tool string, resp json.RawMessage, err error) outbox.Result {
	t.Helper()
	res, doErr := b.client.Do(t.Context(), b.call(tool), outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return resp, err
	}))
	require.NoError(t, doErr)
	return res
}

func (b *testBundle[TTx]) needsReview(t *testing.T) outbox.Key {
	t.Helper()
	res := b.do(t, "email", nil, outbox.Ambiguous(errors.New("timeout after 30s")))
	require.Equal(t, outbox.StateNeedsReview, res.State)
	return res.Key
}

func (b *testBundle[TTx]) failed(t *testing.T) outbox.Key {
	t.Helper()
	res := b.do(t, "refund", nil, outbox.PermanentBody(json.RawMessage(`{"code":"card_declined"}`), errors.New("declined")))
	require.Equal(t, outbox.StateFailed, res.State)
	return res.Key
}

func (b *testBundle[TTx]) pending(t *testing.T) outbox.Key {
	t.Helper()
	res, err := b.client.Submit(t.Context(), b.call("refund"))
	require.NoError(t, err)
	return res.Key
}

// get fetches path and returns the status and body.
func (b *testBundle[TTx]) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return b.send(t, http.MethodGet, path, nil, nil)
}

func (b *testBundle[TTx]) send(t *testing.T, method, path string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	var bodyReader io.Reader
	if form != nil {
		bodyReader = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, b.server.URL+path, bodyReader)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for name, values := range header {
		req.Header[name] = values
	}
	resp, err := b.browser.Do(req)
	require.NoError(t, err)
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, string(data)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// confirm opens an action's confirmation page and returns its CSRF token.
func (b *testBundle[TTx]) confirm(t *testing.T, key outbox.Key, action string) string {
	t.Helper()
	status, page := b.get(t, "/keys/"+string(key)+"/"+action)
	require.Equal(t, http.StatusOK, status, page)
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(t, m, page)
	return m[1]
}

func (b *testBundle[TTx]) inspect(t *testing.T, key outbox.Key) outbox.Inspection {
	t.Helper()
	in, err := b.client.Inspect(t.Context(), key)
	require.NoError(t, err)
	return in
}

// countCells matches the overview's count cells, each a link to its keys.
func countCells(counts ...int) string {
	var cells strings.Builder
	for _, n := range counts {
		fmt.Fprintf(&cells, `<td class="num"[^>]*><a href="[^"]*">%d</a></td>`, n)
	}
	return cells.String()
}

func TestPages(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testPages[pgx.Tx], testPages[*sql.Tx])
}

func testPages[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("OverviewCountsPerToolAndState", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		b.needsReview(t)
		b.failed(t)
		b.pending(t)
		b.do(t, "refund", json.RawMessage(`{"id":"re_1"}`), nil)

		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/", nil)
		require.NoError(t, err)
		resp, err := b.browser.Do(req)
		require.NoError(t, err)
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		page := string(data)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
		require.NotContains(t, resp.Header.Get("Content-Security-Policy"), "script-src")
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
		require.Contains(t, page, `<meta http-equiv="refresh" content="10">`)
		// email: pending, in flight, needs review, succeeded, failed, cancelled, expired.
		require.Regexp(t, `(?s)<td><a href="/keys\?tool=email">email</a></td>`+countCells(0, 0, 1), page)
		require.Regexp(t, `(?s)<td><a href="/keys\?tool=refund">refund</a></td>`+countCells(1, 0, 0, 1, 1), page)
		// Every count links to its keys.
		require.Contains(t, page, `<td class="num"><a href="/keys?state=needs_review&amp;tool=email">1</a></td>`)
		require.Contains(t, page, `<a class="card alert" href="/keys?state=needs_review">`)
		require.Regexp(t, `<span class="n">1</span> need review`, page)
	})

	t.Run("KeysFilterByState", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		review := b.needsReview(t)
		failed := b.failed(t)
		status, page := b.get(t, "/keys?state=needs_review")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, string(review))
		require.NotContains(t, page, string(failed))
		require.Contains(t, page, "timeout after 30s", "the list shows the last error")
		require.Contains(t, page, `value="needs_review" id="state-needs_review" checked`)

		status, page = b.get(t, "/keys?tool=refund")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, string(failed))
		require.NotContains(t, page, string(review))
	})

	t.Run("KeysKeysetPages", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		keys := []outbox.Key{b.failed(t), b.failed(t), b.failed(t)}
		path := "/keys?state=failed&limit=1"
		var seen []string
		keyLink := regexp.MustCompile(`class="key" href="/keys/(k1_[0-9a-f]+)"`)
		next := regexp.MustCompile(`id="next" href="([^"]+)"`)
		for range 5 {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusOK, status, page)
			for _, m := range keyLink.FindAllStringSubmatch(page, -1) {
				seen = append(seen, m[1])
			}
			m := next.FindStringSubmatch(page)
			if m == nil {
				break
			}
			path = strings.ReplaceAll(m[1], "&amp;", "&")
			require.Contains(t, path, "limit=1", "the next page keeps the filters")
		}
		require.Equal(t, []string{string(keys[0]), string(keys[1]), string(keys[2])}, seen)
	})

	t.Run("RunPageShowsStepsInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		first := b.failed(t)
		succeeded := b.do(t, "refund", json.RawMessage(`{"id":"re_1"}`), nil)
		require.Equal(t, outbox.StateSucceeded, succeeded.State)
		second := b.needsReview(t)
		third := b.pending(t)
		status, page := b.get(t, "/keys?run=run-1")
		require.Equal(t, http.StatusOK, status, page)
		require.Less(t, strings.Index(page, string(first)), strings.Index(page, string(second)))
		require.NotContains(t, page, string(succeeded.Key), "the list holds only listable keys")
		require.Contains(t, page, `<a id="run-page" href="/run?run=run-1">`, "without a tenant, the run's page finds the tenants")

		status, page = b.get(t, "/run?run=run-1")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `<td class="num">2</td><td class="key-cell"><span class="copy" title="the whole key: click to select it, then copy">`+
			string(succeeded.Key)+`</span><a class="key" href="/keys/`+string(succeeded.Key)+`"`, "the succeeded step, with its number")
		require.Contains(t, page, `<span class="state succeeded">succeeded</span>`)
		positions := []int{}
		for _, key := range []outbox.Key{first, succeeded.Key, second, third} {
			i := strings.Index(page, string(key))
			require.Positive(t, i, "step %s shown", key)
			positions = append(positions, i)
		}
		require.IsIncreasing(t, positions, "steps in step order")
		require.NotContains(t, page, `id="next"`)

		status, page = b.get(t, "/run?run=run-1&from=3")
		require.Equal(t, http.StatusOK, status, page)
		require.NotContains(t, page, string(first))
		require.NotContains(t, page, string(succeeded.Key))
		require.Contains(t, page, string(second))

		for _, path := range []string{"/run", "/run?run=run-1&from=x", "/run?run=run-1&from=-1"} {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusBadRequest, status, path+": "+page)
			require.Contains(t, page, `id="problem"`, path)
		}
	})

	t.Run("KeysBadFilterRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		for _, path := range []string{"/keys?after=yesterday", "/keys?state=done", "/keys?limit=-1", "/keys?limit=x", "/keys?cursor=bogus"} {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusBadRequest, status, path+": "+page)
			require.Contains(t, page, `id="problem"`, path)
		}
	})

	t.Run("KeyPage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.needsReview(t)
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `id="state">needs_review`)
		require.Contains(t, page, `{&#34;amount&#34;:&#34;42.00&#34;,&#34;n&#34;:1,&#34;order&#34;:8842}`, "canonical arguments verbatim")
		require.Contains(t, page, "{\n  &#34;amount&#34;: &#34;42.00&#34;,", "and pretty-printed")
		require.Contains(t, page, "<dt>ticket</dt><dd>OPS-7</dd>", "metadata")
		require.Contains(t, page, "<dt>delivery</dt><dd>at most once</dd>")
		require.Contains(t, page, "timeout after 30s")
		require.Contains(t, page, `id="observation-pretty">{`+"\n"+`  &#34;status&#34;: &#34;needs_review&#34;`)
		require.Contains(t, page, `id="action-resolve" href="/keys/`+string(key)+`/resolve"`)
		require.Contains(t, page, `href="/keys/`+string(key)+`/raw/args"`)
	})

	t.Run("TombstonePage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		call := b.call("refund")
		call.Metadata = nil
		res, err := b.client.Do(t.Context(), call, outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"id":"re_1"}`), nil
		}))
		require.NoError(t, err)
		key := res.Key
		_, err = pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(b.schema), pgoncetest.StoredKey(t, string(key)), nil)
		require.NoError(t, err)
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `id="state">expired`)
		require.NotContains(t, page, "re_1", "a tombstone keeps no response")
		require.Contains(t, page, `&#34;status&#34;: &#34;expired&#34;`)
		require.NotContains(t, page, `id="action-`)
	})

	t.Run("KeyPageUnknownAndMalformed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		status, page := b.get(t, "/keys/k1_"+strings.Repeat("ab", 32))
		require.Equal(t, http.StatusNotFound, status, page)
		require.Contains(t, page, "key not found")
		status, page = b.get(t, "/keys/not-a-key")
		require.Equal(t, http.StatusBadRequest, status, page)
		require.Contains(t, page, "invalid key")
	})

	t.Run("HostileResponseRenderedInert", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		hostile := `{"html":"</pre><script>alert(1)</script><img src=x onerror=alert(2)>"}`
		key := b.do(t, "refund", json.RawMessage(hostile), nil).Key
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status)
		require.NotContains(t, page, "<script>")
		require.NotContains(t, page, "<img src=x")
		require.Contains(t, page, "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;")

		call := b.call("email")
		call.Args = map[string]any{"to": "<script>alert(3)</script>"}
		call.Metadata = map[string]string{"<b>k</b>": "<script>alert(4)</script>"}
		res, err := b.client.Do(t.Context(), call, outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, outbox.Ambiguous(errors.New("<script>alert(5)</script>"))
		}))
		require.NoError(t, err)
		for _, path := range []string{"/keys/" + string(res.Key), "/keys?state=needs_review", "/keys/" + string(res.Key) + "/resolve"} {
			status, page = b.get(t, path)
			require.Equal(t, http.StatusOK, status, path)
			require.NotContains(t, page, "<script>", path)
			require.NotContains(t, page, "<b>k</b>", path)
		}
		require.Contains(t, page, "&lt;script&gt;alert(5)&lt;/script&gt;", "the last error, as text")

		status, raw := b.get(t, "/keys/"+string(key)+"/raw/response")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, hostile, raw, "the raw link serves the stored bytes")
	})

	t.Run("HugeAndInvalidUTF8ResponseTruncated", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		huge := append([]byte(`{"s":"`+strings.Repeat("<b>x</b>", 5<<20/8)), []byte("\xff\xfe\"}")...)
		key := b.do(t, "refund", json.RawMessage(huge), nil).Key
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status)
		require.Less(t, len(page), 300<<10, "the page shows a bounded part of a 5 MB response")
		require.Contains(t, page, fmt.Sprintf("%d bytes", len(huge)))
		require.Contains(t, page, "<strong>truncated</strong>")
		require.Contains(t, page, "<strong>not valid UTF-8</strong>")
		require.NotContains(t, page, "<b>x</b>")

		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/keys/"+string(key)+"/raw/response", nil)
		require.NoError(t, err)
		resp, err := b.browser.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, huge, raw, "raw bytes, verbatim")
		require.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"))
		require.Contains(t, resp.Header.Get("Content-Disposition"), "attachment")
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "sandbox")
	})
}

func TestActions(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testActions[pgx.Tx], testActions[*sql.Tx])
}

func testActions[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("ResolveSucceeded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.needsReview(t)
		csrf := b.confirm(t, key, "resolve")
		status, page := b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", url.Values{
			"csrf": {csrf}, "outcome": {"succeeded"}, "body": {`{"sent":true}`}, "by": {"ana"}, "reason": {"provider log shows delivery"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "the key is now <span class=\"state succeeded\">succeeded")
		in := b.inspect(t, key)
		require.Equal(t, outbox.StateSucceeded, in.State)
		require.JSONEq(t, `{"sent":true}`, string(in.Response))
		require.Len(t, in.Resolutions, 1)
		require.Equal(t, "ana", in.Resolutions[0].By)
		require.Equal(t, "provider log shows delivery", in.Resolutions[0].Reason)
	})

	t.Run("ResolveFailedAndRetry", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		failedKey, retryKey := b.needsReview(t), b.needsReview(t)
		csrf := b.confirm(t, failedKey, "resolve")
		status, page := b.send(t, http.MethodPost, "/keys/"+string(failedKey)+"/resolve", url.Values{
			"csrf": {csrf}, "outcome": {"failed"}, "body": {`{"code":"bounced"}`}, "by": {"ana"}, "reason": {"bounced"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Equal(t, outbox.StateFailed, b.inspect(t, failedKey).State)
		status, page = b.send(t, http.MethodPost, "/keys/"+string(retryKey)+"/resolve", url.Values{
			"csrf": {csrf}, "outcome": {"retry"}, "by": {"ana"}, "reason": {"never sent"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Equal(t, outbox.StatePending, b.inspect(t, retryKey).State)
	})

	t.Run("CancelPending", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.pending(t)
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, page, `id="action-cancel"`)
		require.Contains(t, page, "<dt>due at</dt>", "a pending key shows its queue entry")
		csrf := b.confirm(t, key, "cancel")
		status, page = b.send(t, http.MethodPost, "/keys/"+string(key)+"/cancel", url.Values{
			"csrf": {csrf}, "by": {"ana"}, "reason": {"customer withdrew"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		in := b.inspect(t, key)
		require.Equal(t, outbox.StateCancelled, in.State)
		require.Equal(t, "customer withdrew", in.Resolutions[0].Reason)
	})

	t.Run("RetryFailed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.failed(t)
		csrf := b.confirm(t, key, "retry")
		status, page := b.send(t, http.MethodPost, "/keys/"+string(key)+"/retry", url.Values{
			"csrf": {csrf}, "by": {"ana"}, "reason": {"card updated"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Equal(t, outbox.StatePending, b.inspect(t, key).State)
	})
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testRefusals[pgx.Tx], testRefusals[*sql.Tx])
}

// unchanged fails t unless key is as before.
func unchanged[TTx any](t *testing.T, b *testBundle[TTx], key outbox.Key, before outbox.Inspection) {
	t.Helper()
	after := b.inspect(t, key)
	require.Equal(t, before.State, after.State)
	require.Equal(t, before.UpdatedAt, after.UpdatedAt)
	require.Len(t, after.Resolutions, len(before.Resolutions))
}

func testRefusals[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	resolveForm := func(csrf string) url.Values {
		return url.Values{"csrf": {csrf}, "outcome": {"succeeded"}, "body": {`{}`}, "by": {"ana"}, "reason": {"r"}}
	}

	t.Run("MissingAndWrongCSRF", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.needsReview(t)
		before := b.inspect(t, key)
		csrf := b.confirm(t, key, "resolve")
		for _, token := range []string{"", strings.Repeat("0", 32), csrf + "0"} {
			status, page := b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", resolveForm(token), nil)
			require.Equal(t, http.StatusForbidden, status, page)
			require.Contains(t, page, "CSRF token does not match")
		}
		unchanged(t, b, key, before)

		// A browser without the console's cookie (another site's form)
		// has no secret to match.
		other := &http.Client{}
		resp, err := other.PostForm(b.server.URL+"/keys/"+string(key)+"/resolve", resolveForm(csrf))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
		unchanged(t, b, key, before)
	})

	t.Run("CrossOriginPostRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.needsReview(t)
		before := b.inspect(t, key)
		csrf := b.confirm(t, key, "resolve")
		status, page := b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", resolveForm(csrf),
			http.Header{"Sec-Fetch-Site": {"cross-site"}})
		require.Equal(t, http.StatusForbidden, status, page)
		require.Contains(t, page, "Cross-origin request refused")
		unchanged(t, b, key, before)
	})

	t.Run("ActionInWrongState", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		review, pending := b.needsReview(t), b.pending(t)
		csrf := b.confirm(t, review, "resolve")
		for _, tt := range []struct {
			key    outbox.Key
			action string
			words  string
		}{
			{review, "cancel", "cannot cancel key " + string(review) + ": it is needs_review, not pending"},
			{review, "retry", "cannot retry key " + string(review)},
			{pending, "resolve", string(pending)},
		} {
			before := b.inspect(t, tt.key)
			status, page := b.get(t, "/keys/"+string(tt.key)+"/"+tt.action)
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, page, "cannot be "+tt.action+"d", "the confirmation page warns")
			status, page = b.send(t, http.MethodPost, "/keys/"+string(tt.key)+"/"+tt.action, resolveForm(csrf), nil)
			require.Equal(t, http.StatusConflict, status, page)
			require.Contains(t, page, tt.words)
			unchanged(t, b, tt.key, before)
		}
	})

	t.Run("MissingWhoOrWhyAndBadJSON", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.needsReview(t)
		before := b.inspect(t, key)
		csrf := b.confirm(t, key, "resolve")
		for _, tt := range []struct {
			name  string
			edit  func(url.Values)
			words string
		}{
			{"NoBy", func(v url.Values) { v.Set("by", " ") }, "Say who you are and why"},
			{"NoReason", func(v url.Values) { v.Del("reason") }, "Say who you are and why"},
			{"BadJSON", func(v url.Values) { v.Set("body", "{not json") }, "must be valid JSON"},
			{"NoOutcome", func(v url.Values) { v.Set("outcome", "maybe") }, "Choose an outcome"},
		} {
			form := resolveForm(csrf)
			tt.edit(form)
			status, page := b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", form, nil)
			require.Equal(t, http.StatusBadRequest, status, tt.name)
			require.Contains(t, page, tt.words, tt.name)
			require.Contains(t, page, `name="csrf"`, "%s: the form is shown again", tt.name)
		}
		unchanged(t, b, key, before)
	})

	t.Run("ReadOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{ReadOnly: true})
		key := b.needsReview(t)
		before := b.inspect(t, key)
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status)
		require.NotContains(t, page, `id="action-resolve"`)
		require.Contains(t, page, "read-only")
		status, page = b.get(t, "/keys/"+string(key)+"/resolve")
		require.Equal(t, http.StatusForbidden, status, page)
		status, page = b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", resolveForm(strings.Repeat("0", 32)), nil)
		require.Equal(t, http.StatusForbidden, status, page)
		require.Contains(t, page, "read-only")
		unchanged(t, b, key, before)
	})

	t.Run("Token", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{Token: testToken})
		key := b.needsReview(t)
		before := b.inspect(t, key)
		status, page := b.get(t, "/")
		require.Equal(t, http.StatusUnauthorized, status, page)
		require.Contains(t, page, "needs its token")
		require.NotContains(t, page, "email")
		status, _ = b.get(t, "/?token=wrong-but-long-enough-token")
		require.Equal(t, http.StatusUnauthorized, status)
		status, _ = b.send(t, http.MethodGet, "/", nil, http.Header{"Authorization": {"Bearer wrong"}})
		require.Equal(t, http.StatusUnauthorized, status)
		status, _ = b.send(t, http.MethodPost, "/keys/"+string(key)+"/resolve", resolveForm(""), nil)
		require.Equal(t, http.StatusUnauthorized, status)
		unchanged(t, b, key, before)

		status, _ = b.send(t, http.MethodGet, "/", nil, http.Header{"Authorization": {"Bearer " + testToken}})
		require.Equal(t, http.StatusOK, status)
		status, _ = b.get(t, "/keys?token="+testToken)
		require.Equal(t, http.StatusSeeOther, status, "the token is traded for a cookie")
		status, page = b.get(t, "/keys")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, string(key))
	})

	t.Run("ForeignHostRefusedWithoutToken", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/", nil)
		require.NoError(t, err)
		req.Host = "attacker.example:8480"
		resp, err := b.browser.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
	})
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:8480", "[::1]:8480", "localhost:8480", "127.0.0.2:0"} {
		require.NoError(t, console.CheckListen(addr, ""), addr)
	}
	for _, addr := range []string{"0.0.0.0:8480", ":8480", "[::]:8480", "10.1.2.3:8480", "example.com:80"} {
		err := console.CheckListen(addr, "")
		require.ErrorIs(t, err, console.ErrTokenRequired, addr)
		require.NoError(t, console.CheckListen(addr, testToken), addr)
	}
	require.Error(t, console.CheckListen("no-port", testToken))
}
