package console_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// gaveUp submits a refund of order 7731 for customer cus_5521, which the
// payment provider refuses with a 503 every time, and runs a dispatcher
// that gives up after three attempts, until the key has failed.
func (b *testBundle[TTx]) gaveUp(t *testing.T) outbox.Key {
	t.Helper()
	call := b.call("refund")
	call.Tenant, call.RunID = "globex", "run-g"
	call.Args = map[string]any{"order": 7731, "customer": "cus_5521", "amount": "129.00"}
	res, err := b.client.Submit(t.Context(), call)
	require.NoError(t, err)
	d, err := dispatcher.New(b.client, dispatcher.Config{
		MaxAttempts: 3, BackoffFunc: func(int) time.Duration { return time.Millisecond },
		PollInterval: 10 * time.Millisecond, MaintenanceDisabled: true, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitCtx, waitCancel := context.WithTimeout(t.Context(), time.Minute)
	defer waitCancel()
	final, err := b.client.Wait(waitCtx, res.Key)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, err)
	require.Equal(t, outbox.StateFailed, final.State)
	require.Equal(t, 3, final.Attempts)
	return res.Key
}

func TestFind(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testFind[pgx.Tx], testFind[*sql.Tx])
}

func testFind[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("AnOrderIDLeadsToItsKeyAndEveryAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		b.do(t, "refund", json.RawMessage(`{"id":"re_1"}`), nil) // order 8842
		key := b.gaveUp(t)

		status, page := b.get(t, "/search?q=7731")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `<input id="find-q" name="q" type="search" value="7731"`, "the header's box keeps the text")
		require.Contains(t, page, `class="key" href="/keys/`+string(key)+`"`)
		require.Equal(t, 1, strings.Count(page, `class="key" href=`), "one key matches")
		require.Contains(t, page, ">args</td>", "matched in the arguments")

		status, page = b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status, page)
		attempts := regexp.MustCompile(`(?s)<table id="attempts".*?</table>`).FindString(page)
		require.Equal(t, 3, strings.Count(attempts, "503 Service Unavailable from the payment provider"), attempts)
		for i, outcome := range []string{"retry", "retry", "failed"} {
			require.Contains(t, attempts, `<tr><td class="num">`+string(rune('1'+i))+`</td>`)
			require.Contains(t, attempts, `class="outcome `+outcome+`"`)
		}
		require.Contains(t, attempts, "attempt 1: 503")
		require.Contains(t, attempts, "attempt 3: 503")
	})

	t.Run("ATicketInTheMetadataLeadsToItsKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		res := b.do(t, "refund", json.RawMessage(`{"id":"re_1"}`), nil) // metadata ticket OPS-7
		for _, path := range []string{"/search?q=OPS-7", "/search?q=OPS-7&in=metadata"} {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusOK, status, page)
			require.Contains(t, page, `class="key" href="/keys/`+string(res.Key)+`"`, path)
			require.Equal(t, 1, strings.Count(page, `class="key" href=`), "%s: one key matches", path)
			require.Contains(t, page, ">metadata</td>", "%s: matched in the metadata", path)
		}
		_, page := b.get(t, "/search?q=OPS-7&in=args")
		require.Contains(t, page, "No key matches OPS-7", "the arguments do not hold it")
		require.Contains(t, page, `<option value="metadata">text in the metadata</option>`)
	})

	t.Run("SucceededKeysAreListedAndSearched", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		succeeded := b.do(t, "refund", json.RawMessage(`{"id":"re_1"}`), nil)
		b.failed(t)
		status, page := b.get(t, "/keys?state=succeeded")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `class="key" href="/keys/`+string(succeeded.Key)+`"`)
		require.Equal(t, 1, strings.Count(page, `class="key" href=`))
		require.Contains(t, page, ", a day.", "the window it defaulted to")
		require.Contains(t, page, `{&#34;amount&#34;:&#34;42.00&#34;,&#34;n&#34;:1,`, "the arguments' first bytes")

		status, page = b.get(t, "/search?q="+string(succeeded.Key)[:14])
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `class="key" href="/keys/`+string(succeeded.Key)+`"`, "by the start of its key")
	})

	t.Run("ARunWithoutItsTenant", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		for step := range int64(3) {
			call := outbox.Call{Tenant: "globex", RunID: "run-g", Step: step, Tool: "refund", Args: map[string]any{"n": step}}
			_, err := b.client.Submit(t.Context(), call)
			require.NoError(t, err)
		}
		status, page := b.get(t, "/keys?run=run-g")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `<a id="run-page" href="/run?run=run-g">`)
		status, page = b.get(t, "/run?run=run-g")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `<a href="/run?run=run-g&amp;tenant=globex">run run-g of tenant globex</a> · 3 keys seen`)
		status, page = b.get(t, "/run?run=run-g&tenant=globex")
		require.Equal(t, http.StatusOK, status, page)
		require.Equal(t, 3, strings.Count(page, `class="key" href=`))
		require.NotContains(t, page, `id="tenants"`)
		status, page = b.get(t, "/run?run=run-g&tenant=initech")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "No steps found under tenant initech")
		require.Contains(t, page, `href="/run?run=run-g&amp;tenant=globex"`, "and where the run is")
	})

	t.Run("OverviewWindowsLinkEveryCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		b.pending(t)
		old := b.do(t, "refund", json.RawMessage(`{"id":"re_1"}`), nil)
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `UPDATE "`+b.schema+`".pgonce_key SET created_at = created_at - interval '3 hours' WHERE key = $1`,
			pgoncetest.StoredKey(t, string(old.Key)))
		require.NoError(t, err)
		for window, succeeded := range map[string]int{"1h": 0, "24h": 1, "all": 1} {
			status, page := b.get(t, "/?window="+window)
			require.Equal(t, http.StatusOK, status, page)
			require.Contains(t, page, `aria-current="page"`)
			row := regexp.MustCompile(`<tr><td><a href="/keys\?tool=refund">refund</a></td>.*</tr>`).FindString(page)
			require.Regexp(t, `^<tr><td><a href="/keys\?tool=refund">refund</a></td>`+countCells(1, 0, 0, succeeded), row, window)
			links := regexp.MustCompile(`<td class="num"[^>]*><a href="([^"]+)">`).FindAllStringSubmatch(row, -1)
			require.Len(t, links, 7, window)
			for _, link := range links {
				target := html.UnescapeString(link[1])
				if window != "all" {
					require.Contains(t, target, "after=", "%s: %s lists the window", window, target)
				}
				status, listed := b.get(t, target)
				require.Equal(t, http.StatusOK, status, "%s: %s: %s", window, target, listed)
			}
		}
		status, page := b.get(t, "/?window=2h")
		require.Equal(t, http.StatusBadRequest, status, page)
		require.Contains(t, page, `id="problem"`)
	})

	t.Run("ATombstoneSaysWhatItIsAndKeepsItsOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.failed(t)
		_, err := pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(b.schema), pgoncetest.StoredKey(t, string(key)), nil)
		require.NoError(t, err)
		status, page := b.get(t, "/keys/"+string(key))
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `<section class="note" id="tombstone">`)
		require.Contains(t, page, "This key is a tombstone.")
		require.Contains(t, page, `id="expired-from">failed</span>`)
		require.Contains(t, page, "completed: failed, now a tombstone")
		require.NotContains(t, page, "<dt>tool</dt>", "no empty tool row")
		require.NotContains(t, page, `id="attempts"`)
	})

	t.Run("TheResolveFormIsFilledAndItsLabelsBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		b.do(t, "email", json.RawMessage(`{"sent":true,"provider_id":"em_1","tries":2}`), nil)
		key := b.needsReview(t)
		status, page := b.get(t, "/keys/"+string(key)+"/resolve")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `id="args-pretty"`, "the call's arguments")
		body := regexp.MustCompile(`(?s)<textarea name="body" id="body" rows="10">(.*?)</textarea>`).FindStringSubmatch(page)
		require.NotNil(t, body)
		require.JSONEq(t, `{"provider_id":"","sent":false,"tries":0}`, html.UnescapeString(body[1]), "the shape of a recent email response")
		require.Contains(t, page, `id="template"`)
		for _, id := range []string{"outcome-succeeded", "outcome-failed", "outcome-retry", "body", "by", "reason"} {
			require.Contains(t, page, `id="`+id+`"`)
			require.Contains(t, page, `<label for="`+id+`"`, "the label of %s is bound to it", id)
		}

		other := setup(t, driver, console.Config{})
		lone := other.needsReview(t)
		_, page = other.get(t, "/keys/"+string(lone)+"/resolve")
		require.Contains(t, page, `<textarea name="body" id="body" rows="10">{}</textarea>`, "no response to take a shape from")
	})
}

func TestBulk(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testBulk[pgx.Tx], testBulk[*sql.Tx])
}

func testBulk[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	form := func(csrf, action string, keys ...outbox.Key) url.Values {
		v := url.Values{"csrf": {csrf}, "action": {action}, "by": {"ana"}, "reason": {"the customer withdrew every order"}}
		for _, k := range keys {
			v.Add("key", string(k))
		}
		return v
	}
	csrfOf := func(t *testing.T, b *testBundle[TTx]) string {
		t.Helper()
		status, page := b.get(t, "/keys")
		require.Equal(t, http.StatusOK, status, page)
		m := csrfField.FindStringSubmatch(page)
		require.NotNil(t, m, page)
		return m[1]
	}

	t.Run("AtMostBulkMaxKeysAnAction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		pending := b.pending(t)
		keys := []outbox.Key{pending}
		for i := range console.BulkMax {
			sum := sha256.Sum256([]byte(strconv.Itoa(i)))
			keys = append(keys, outbox.Key(outbox.KeyPrefix+hex.EncodeToString(sum[:])))
		}
		csrf := csrfOf(t, b)
		for _, confirm := range []string{"", "yes"} {
			v := form(csrf, "cancel", keys...)
			v.Set("confirm", confirm)
			status, page := b.send(t, http.MethodPost, "/keys/bulk", v, nil)
			require.Equal(t, http.StatusBadRequest, status, page)
			require.Contains(t, page, fmt.Sprintf("At most %d keys at once, got %d. Nothing was changed.", console.BulkMax, console.BulkMax+1))
		}
		require.Equal(t, outbox.StatePending, b.inspect(t, pending).State, "nothing changed")
	})

	t.Run("CancelSeveralWithOneReasonEachAudited", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		first, second, failed := b.pending(t), b.pending(t), b.failed(t)
		csrf := csrfOf(t, b)
		_, list := b.get(t, "/keys")
		require.Contains(t, list, `<form id="bulk"`)
		require.Contains(t, list, `name="key" value="`+string(first)+`" form="bulk"`)

		status, page := b.send(t, http.MethodPost, "/keys/bulk", form(csrf, "cancel", first, second, failed), nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "Confirm cancel of 3 keys")
		require.Equal(t, outbox.StatePending, b.inspect(t, first).State, "the first post only shows what will be done")

		confirmed := form(csrf, "cancel", first, second, failed)
		confirmed.Set("confirm", "yes")
		status, page = b.send(t, http.MethodPost, "/keys/bulk", confirmed, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "2 of 3 keys changed")
		require.Contains(t, page, "cannot cancel key "+string(failed))
		for _, key := range []outbox.Key{first, second} {
			in := b.inspect(t, key)
			require.Equal(t, outbox.StateCancelled, in.State)
			require.Len(t, in.Resolutions, 1)
			require.Equal(t, outbox.ResolutionRecord{Action: outbox.ResolveCancel, By: "ana", Reason: "the customer withdrew every order", ResolvedAt: in.Resolutions[0].ResolvedAt}, in.Resolutions[0])
		}
		require.Equal(t, outbox.StateFailed, b.inspect(t, failed).State)
		require.Empty(t, b.inspect(t, failed).Resolutions)

		retry := form(csrf, "retry", first, failed)
		retry.Set("confirm", "yes")
		status, page = b.send(t, http.MethodPost, "/keys/bulk", retry, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "2 of 2 keys changed")
		require.Equal(t, outbox.StatePending, b.inspect(t, failed).State)
	})

	t.Run("RefusedFormsChangeNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		key := b.pending(t)
		before := b.inspect(t, key)
		csrf := csrfOf(t, b)
		for _, tt := range []struct {
			name   string
			edit   func(url.Values)
			status int
			words  string
		}{
			{"NoCSRF", func(v url.Values) { v.Set("csrf", strings.Repeat("0", 32)) }, http.StatusForbidden, "CSRF token does not match"},
			{"NoBy", func(v url.Values) { v.Set("by", " ") }, http.StatusBadRequest, "Say who you are and why"},
			{"NoReason", func(v url.Values) { v.Del("reason") }, http.StatusBadRequest, "Say who you are and why"},
			{"NoKeys", func(v url.Values) { v.Del("key") }, http.StatusBadRequest, "Select the keys"},
			{"BadKey", func(v url.Values) { v.Add("key", "k1_zz") }, http.StatusBadRequest, "invalid key"},
			{"BadAction", func(v url.Values) { v.Set("action", "resolve") }, http.StatusBadRequest, "want cancel or retry"},
		} {
			v := form(csrf, "cancel", key)
			v.Set("confirm", "yes")
			tt.edit(v)
			status, page := b.send(t, http.MethodPost, "/keys/bulk", v, nil)
			require.Equal(t, tt.status, status, "%s: %s", tt.name, page)
			require.Contains(t, page, tt.words, tt.name)
		}
		v := form(csrf, "cancel", key)
		v.Set("confirm", "yes")
		status, page := b.send(t, http.MethodPost, "/keys/bulk", v, http.Header{"Sec-Fetch-Site": {"cross-site"}})
		require.Equal(t, http.StatusForbidden, status, page)
		unchanged(t, b, key, before)

		ro := setup(t, driver, console.Config{ReadOnly: true})
		roKey := ro.pending(t)
		roBefore := ro.inspect(t, roKey)
		_, list := ro.get(t, "/keys")
		require.NotContains(t, list, `<form id="bulk"`)
		status, page = ro.send(t, http.MethodPost, "/keys/bulk", v, nil)
		require.Equal(t, http.StatusForbidden, status, page)
		unchanged(t, ro, roKey, roBefore)
	})
}

func TestSearchRefusals(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testSearchRefusals[pgx.Tx], testSearchRefusals[*sql.Tx])
}

func testSearchRefusals[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("BadSearchesAre400WithoutDatabaseText", func(t *testing.T) {
		t.Parallel()
		logger, logs := pgoncetest.CaptureLogs()
		b := setup(t, driver, console.Config{Logger: logger})
		b.needsReview(t)
		huge := strings.Repeat("t", 100<<10)
		for _, query := range []string{
			"q=a%00b", "q=%FF%FE", "q=" + huge, "q=x&tenant=a%00b", "q=x&tenant=" + huge,
			"q=x&window=1y", "q=x&in=tool", "run=a%00b", "run=" + huge,
		} {
			path := "/search?" + query
			if strings.HasPrefix(query, "run=") {
				path = "/run?" + query
			}
			status, page := b.get(t, path)
			require.Equal(t, http.StatusBadRequest, status, "%.60s: %.400s", query, page)
			require.Contains(t, page, `id="problem"`)
			for _, text := range []string{"SQLSTATE", "22021", "invalid byte sequence", "pgonce_key"} {
				require.NotContains(t, page, text)
			}
		}
		status, page := b.get(t, "/search")
		require.Equal(t, http.StatusOK, status, "an empty search is a form: %s", page)
		for _, record := range logs.Records() {
			require.Less(t, record.Level, slog.LevelError, "nothing logged at ERROR: %s %v", record.Message, record.Attrs)
		}
	})
}
