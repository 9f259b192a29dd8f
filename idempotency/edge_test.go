package idempotency_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// wrapMode builds a middleware of client's driver in config's mode around
// handler: over the test pool (ModeTx) or without one (ModeLease).
func wrapMode[TTx any](t *testing.T, client *outbox.Client[TTx], config idempotency.Config, handler http.Handler) http.Handler {
	t.Helper()
	if config.ScopeFunc == nil {
		config.ScopeFunc = accountScope
	}
	switch c := any(client).(type) {
	case *outbox.Client[pgx.Tx]:
		pool := pgoncetest.Pool(t)
		if config.Mode == idempotency.ModeLease {
			pool = nil
		}
		m, err := idempotency.NewPgx(pool, c, config)
		require.NoError(t, err)
		return m.Handler(handler)
	case *outbox.Client[*sql.Tx]:
		db := pgoncetest.DB(t)
		if config.Mode == idempotency.ModeLease {
			db = nil
		}
		m, err := idempotency.New(db, c, config)
		require.NoError(t, err)
		return m.Handler(handler)
	}
	require.FailNow(t, "no driver", "%T", client)
	return nil
}

// serve serves handler for the test and returns a bundle that posts to it.
func serve(t *testing.T, handler http.Handler) *testBundle {
	t.Helper()
	server := httptest.NewServer(handler)
	t.Cleanup(server.Close)
	return &testBundle{server: server}
}

var modes = []struct {
	name string
	mode idempotency.Mode
}{{"ModeTx", idempotency.ModeTx}, {"ModeLease", idempotency.ModeLease}}

func TestEdges(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testEdges, testEdges)
}

func testEdges[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	for _, tt := range modes {
		t.Run("EmptyImplicit200IsStoredAndReplayed"+tt.name, func(t *testing.T) {
			t.Parallel()
			client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
			var runs atomic.Int64
			b := serve(t, wrapMode(t, client, idempotency.Config{Mode: tt.mode}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				runs.Add(1) // writes nothing: net/http answers 200, empty
			})))
			first := b.post(t, "k-1", "acct_1", `{}`)
			require.Equal(t, http.StatusOK, first.status, first.body)
			require.Empty(t, first.body)
			for range 2 {
				replay := b.post(t, "k-1", "acct_1", `{}`)
				require.Equal(t, http.StatusOK, replay.status, replay.body)
				require.Empty(t, replay.body)
				require.Equal(t, "true", replay.header.Get(idempotency.ReplayedHeader))
			}
			require.Equal(t, int64(1), runs.Load())
		})
	}

	t.Run("QuotedKeyIsAnSFStringOnly", func(t *testing.T) {
		t.Parallel()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
		var runs atomic.Int64
		b := serve(t, wrapMode(t, client, idempotency.Config{}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})))
		for _, key := range []string{
			`"k\x41"`, `"k\u0041"`, `"k\101"`, `"k\n"`, `"k\A"`, `"k\"`, `"kA";p=1`, `"kA" x`, "\"k\tA\"", `"kA`, `"k""A"`,
		} {
			requireProblem(t, b.post(t, key, "acct_1", `{}`), http.StatusBadRequest, "malformed-key")
		}
		require.Equal(t, int64(0), runs.Load(), "no malformed key ran the handler")
		// The two escapes RFC 8941 has name the bare keys they spell.
		require.Equal(t, http.StatusCreated, b.post(t, `"k\"A"`, "acct_1", `{}`).status)
		require.Equal(t, "true", b.post(t, `k"A`, "acct_1", `{}`).header.Get(idempotency.ReplayedHeader))
		require.Equal(t, http.StatusCreated, b.post(t, `"k\\A"`, "acct_1", `{}`).status)
		require.Equal(t, "true", b.post(t, `k\A`, "acct_1", `{}`).header.Get(idempotency.ReplayedHeader))
		require.Equal(t, http.StatusCreated, b.post(t, "kA", "acct_1", `{}`).status, "kA is a key of its own")
		require.Equal(t, int64(3), runs.Load())
	})

	t.Run("LeaseDuplicateWaitsAndReplays", func(t *testing.T) {
		t.Parallel()
		// Every statement of the client reads its clock once: the count
		// says how far the duplicate got.
		var statements atomic.Int64
		client := driver.Client(t, outbox.Config{
			Schema: pgoncetest.Schema(t), Registry: routeRegistry(t),
			NowFunc: func() time.Time { statements.Add(1); return time.Now() },
		})
		hold, started := make(chan struct{}), make(chan struct{}, 1)
		release := sync.OnceFunc(func() { close(hold) })
		var runs atomic.Int64
		b := serve(t, wrapMode(t, client, idempotency.Config{Mode: idempotency.ModeLease, WaitTimeout: time.Minute}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			n := runs.Add(1)
			started <- struct{}{}
			<-hold
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"run":%d}`, n)
		})))
		t.Cleanup(release) // before the server closes: it waits for the held request
		firstDone := make(chan answer, 1)
		go func() {
			a, _ := b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{}`)
			firstDone <- a
		}()
		<-started
		before := statements.Load()
		dupDone := make(chan answer, 1)
		go func() {
			a, _ := b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{}`)
			dupDone <- a
		}()
		// The duplicate claims (an insert that finds the key, a read of
		// it) and then waits, reading the key again; or it answers.
		var dup answer
		answered := false
		require.Eventually(t, func() bool {
			select {
			case dup = <-dupDone:
				answered = true
				return true
			default:
				return statements.Load()-before >= 3
			}
		}, time.Minute, 5*time.Millisecond)
		require.False(t, answered, "the duplicate answered while the first ran: %d %s", dup.status, dup.body)
		release()
		first := <-firstDone
		dup = <-dupDone
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.Equal(t, http.StatusCreated, dup.status, dup.body)
		require.JSONEq(t, `{"run":1}`, dup.body)
		require.Equal(t, "true", dup.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, int64(1), runs.Load())
	})

	t.Run("LeaseDuplicatePastWaitTimeoutIs409", func(t *testing.T) {
		t.Parallel()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
		hold, started := make(chan struct{}), make(chan struct{}, 1)
		release := sync.OnceFunc(func() { close(hold) })
		b := serve(t, wrapMode(t, client, idempotency.Config{Mode: idempotency.ModeLease, WaitTimeout: 50 * time.Millisecond},
			http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				started <- struct{}{}
				<-hold
				w.WriteHeader(http.StatusCreated)
			})))
		t.Cleanup(release) // before the server closes: it waits for the held request
		firstDone := make(chan answer, 1)
		go func() {
			a, _ := b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{}`)
			firstDone <- a
		}()
		<-started
		dup := b.post(t, "k-1", "acct_1", `{}`) // the first is held until this returns
		requireProblem(t, dup, http.StatusConflict, "in-progress")
		require.Equal(t, "1", dup.header.Get("Retry-After"))
		release()
		require.Equal(t, http.StatusCreated, (<-firstDone).status)
	})

	t.Run("LeaseBurstOfDuplicatesNeverGets5xx", func(t *testing.T) {
		t.Parallel()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
		const n = 63
		hold := make(chan struct{})
		release := sync.OnceFunc(func() { close(hold) })
		var runs, arrived atomic.Int64
		allArrived := make(chan struct{})
		handler := wrapMode(t, client, idempotency.Config{Mode: idempotency.ModeLease, WaitTimeout: time.Minute},
			http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				n := runs.Add(1)
				<-hold // a slow handler: it runs until every duplicate is in
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"run":%d}`, n)
			}))
		b := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if arrived.Add(1) == n {
				close(allArrived)
			}
			handler.ServeHTTP(w, r)
		}))
		t.Cleanup(release) // before the server closes: it waits for the held request
		answers := make([]answer, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				answers[i], errs[i] = b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{"amount": 1}`)
			})
		}
		<-allArrived
		release()
		wg.Wait()
		replayed := 0
		for i, a := range answers {
			require.NoError(t, errs[i])
			require.Less(t, a.status, 500, "a duplicate never gets a server error: %s", a.body)
			require.Equal(t, http.StatusCreated, a.status, a.body)
			require.JSONEq(t, `{"run":1}`, a.body)
			if a.header.Get(idempotency.ReplayedHeader) == "true" {
				replayed++
			}
		}
		require.Equal(t, n-1, replayed, "every request but the first is a replay")
		require.Equal(t, int64(1), runs.Load())
	})

	t.Run("OperatorResolutionsReplayWithoutServerErrors", func(t *testing.T) {
		t.Parallel()
		logger, _ := pgoncetest.CaptureLogs()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t), Logger: logger})
		b := serve(t, wrapMode(t, client, idempotency.Config{Mode: idempotency.ModeLease}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic("the outcome is unknown")
		})))
		resolve := func(key string, resolution outbox.Resolution) {
			t.Helper()
			requireProblem(t, b.post(t, key, "acct_1", `{}`), http.StatusConflict, "needs-review")
			listed, err := client.List(t.Context(), outbox.ListParams{States: []outbox.State{outbox.StateNeedsReview}})
			require.NoError(t, err)
			require.Len(t, listed.Keys, 1)
			resolution.By, resolution.Reason = "ana", "checked the provider"
			_, err = client.Resolve(t.Context(), listed.Keys[0].Key, resolution)
			require.NoError(t, err)
		}

		resolve("plain-json", outbox.Resolution{Action: outbox.ResolveSucceeded, Response: json.RawMessage(`{"sent":true}`)})
		a := b.post(t, "plain-json", "acct_1", `{}`)
		require.Equal(t, http.StatusOK, a.status, a.body)
		require.Equal(t, `{"sent":true}`, a.body)
		require.Equal(t, "application/json", a.header.Get("Content-Type"))

		resolve("failed", outbox.Resolution{Action: outbox.ResolveFailed, Failure: json.RawMessage(`{"declined":true}`)})
		requireProblem(t, b.post(t, "failed", "acct_1", `{}`), http.StatusUnprocessableEntity, "failed")

		resolve("failed-envelope", outbox.Resolution{Action: outbox.ResolveFailed, Failure: json.RawMessage(`{"status":402,"body":{"code":"card_declined"}}`)})
		a = b.post(t, "failed-envelope", "acct_1", `{}`)
		require.Equal(t, http.StatusPaymentRequired, a.status, a.body)
		require.JSONEq(t, `{"code":"card_declined"}`, a.body)

		// What earlier versions stored for a handler that wrote nothing.
		resolve("legacy-empty", outbox.Resolution{Action: outbox.ResolveSucceeded, Response: json.RawMessage(`{"status":0}`)})
		a = b.post(t, "legacy-empty", "acct_1", `{}`)
		require.Equal(t, http.StatusOK, a.status, a.body)
		require.Empty(t, a.body)
	})
}

// TestLeaseDuplicatesRideOutAStarvedPool holds every connection of the
// client's pool while duplicates of a running lease-mode request arrive, so
// that each duplicate's claim runs out of the client's StatementTimeout
// waiting for a connection: what a burst of duplicates meets on a busy
// machine. The duplicates wait for the first request as they may, and
// replay its response: none is answered with a server error.
func TestLeaseDuplicatesRideOutAStarvedPool(t *testing.T) {
	t.Parallel()
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	config.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Connect every connection now, outside any StatementTimeout.
	var warm []*pgxpool.Conn
	for range config.MaxConns {
		conn, err := pool.Acquire(t.Context())
		require.NoError(t, err)
		warm = append(warm, conn)
	}
	for _, conn := range warm {
		conn.Release()
	}
	client := drivertest.Pgx().ClientOver(t, pool, outbox.Config{
		Schema: pgoncetest.Schema(t), Registry: routeRegistry(t), StatementTimeout: 2 * time.Second,
		// Waits re-read rather than hold a connection to listen.
		NotifyDisabled: true,
	})
	hold, started := make(chan struct{}), make(chan struct{}, 1)
	release := sync.OnceFunc(func() { close(hold) })
	var runs atomic.Int64
	b := serve(t, wrapMode(t, client, idempotency.Config{Mode: idempotency.ModeLease, WaitTimeout: time.Minute},
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			runs.Add(1)
			started <- struct{}{}
			<-hold
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"re_1"}`))
		})))
	t.Cleanup(release) // before the server closes: it waits for the held request
	firstDone := make(chan answer, 1)
	go func() {
		a, _ := b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{}`)
		firstDone <- a
	}()
	select {
	case <-started:
	case a := <-firstDone:
		require.FailNow(t, "the first request did not run", "%d %s", a.status, a.body)
	}

	// Take every connection: the duplicates' claims time out waiting.
	var held []*pgxpool.Conn
	for range config.MaxConns {
		conn, err := pool.Acquire(t.Context())
		require.NoError(t, err)
		held = append(held, conn)
	}
	releaseConns := sync.OnceFunc(func() {
		for _, conn := range held {
			conn.Release()
		}
	})
	t.Cleanup(releaseConns)
	const n = 8
	canceledBefore := pool.Stat().CanceledAcquireCount()
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i], _ = b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{}`) })
	}
	require.Eventually(t, func() bool { return pool.Stat().CanceledAcquireCount()-canceledBefore >= n },
		time.Minute, 10*time.Millisecond, "every duplicate's claim gave up on the pool at least once")
	releaseConns()
	release()
	wg.Wait()
	require.Equal(t, http.StatusCreated, (<-firstDone).status)
	for _, a := range answers {
		require.Equal(t, http.StatusCreated, a.status, a.body)
		require.JSONEq(t, `{"id":"re_1"}`, a.body)
		require.Equal(t, "true", a.header.Get(idempotency.ReplayedHeader))
	}
	require.Equal(t, int64(1), runs.Load())
}
