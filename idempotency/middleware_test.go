package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// testBundle is a refunds service behind the middleware: the handler
// inserts a refund row in the request's transaction and answers 201 with
// its id, unless told to fail.
type testBundle struct {
	server *httptest.Server
	schema string
	runs   atomic.Int64
	hold   chan struct{} // when not nil, the handler waits on it after writing
	// holdAccount, when set, limits hold to that account's requests.
	holdAccount string
	started     chan struct{} // receives once per handler run
	failing     atomic.Bool   // the handler writes, then answers 500
	large       atomic.Bool   // the handler writes a response past the limit
}

func setup[TTx any](t *testing.T, driver drivertest.Driver[TTx], config idempotency.Config) *testBundle {
	t.Helper()
	schema := pgoncetest.Schema(t)
	_, err := pgoncetest.Pool(t).Exec(t.Context(), `CREATE TABLE `+ident.Quote(schema)+`.refund (id bigserial PRIMARY KEY, account text, amount int)`)
	require.NoError(t, err)
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: routeRegistry(t)})
	if config.ScopeFunc == nil {
		config.ScopeFunc = func(r *http.Request) (string, error) {
			if account := r.Header.Get("Account"); account != "" {
				return account, nil
			}
			return "", fmt.Errorf("no account")
		}
	}
	var handler func(http.Handler) http.Handler
	switch c := any(client).(type) {
	case *outbox.Client[pgx.Tx]:
		m, err := idempotency.NewPgx(pgoncetest.Pool(t), c, config)
		require.NoError(t, err)
		handler = m.Handler
	case *outbox.Client[*sql.Tx]:
		m, err := idempotency.New(pgoncetest.DB(t), c, config)
		require.NoError(t, err)
		handler = m.Handler
	}
	b := &testBundle{schema: schema, started: make(chan struct{}, 64)}
	b.server = httptest.NewServer(handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.runs.Add(1)
		var body struct {
			Amount int `json:"amount"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		var id int64
		insert := `INSERT INTO ` + ident.Quote(schema) + `.refund (account, amount) VALUES ($1, $2) RETURNING id`
		err := errors.New("no transaction in the request")
		if tx, ok := idempotency.Tx[pgx.Tx](r.Context()); ok {
			err = tx.QueryRow(r.Context(), insert, r.Header.Get("Account"), body.Amount).Scan(&id)
		} else if tx, ok := idempotency.Tx[*sql.Tx](r.Context()); ok {
			err = tx.QueryRowContext(r.Context(), insert, r.Header.Get("Account"), body.Amount).Scan(&id)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b.started <- struct{}{}
		if b.hold != nil && (b.holdAccount == "" || b.holdAccount == r.Header.Get("Account")) {
			<-b.hold
		}
		if b.failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":"boom"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/refunds/%d", id))
		w.Header().Set("Set-Cookie", "session=first-request-only")
		w.WriteHeader(http.StatusCreated)
		if b.large.Load() {
			_, _ = w.Write(bytes.Repeat([]byte("x"), 4096))
			return
		}
		_, _ = fmt.Fprintf(w, "{\"id\": %d,  \"amount\": %d, \"account\": %q}\n", id, body.Amount, r.Header.Get("Account"))
	})))
	t.Cleanup(b.server.Close)
	return b
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (b *testBundle) post(t *testing.T, key, account, body string) answer {
	t.Helper()
	a, err := b.send(t.Context(), key, account, body)
	require.NoError(t, err)
	return a
}

// send posts body as account with key, for goroutines that must not
// assert.
func (b *testBundle) send(ctx context.Context, key, account, body string) (answer, error) {
	return b.sendHeader(ctx, key, account, body, nil)
}

// sendHeader is send with header added to the request.
func (b *testBundle) sendHeader(ctx context.Context, key, account, body string, header http.Header) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.server.URL+"/refunds", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if account != "" {
		req.Header.Set("Account", account)
	}
	for name, values := range header {
		req.Header[name] = values
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(data)}, err
}

func (b *testBundle) refunds(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, pgoncetest.Pool(t).QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM `+ident.Quote(b.schema)+`.refund`).Scan(&n))
	return n
}

func requireProblem(t *testing.T, a answer, status int, kind string) {
	t.Helper()
	require.Equal(t, status, a.status, a.body)
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.body), &p))
	require.Equal(t, idempotency.ProblemTypeBase+kind, p.Type)
	require.Equal(t, status, p.Status)
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testMiddleware, testMiddleware)
}

func testMiddleware[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("ConcurrentDuplicatesRunTheHandlerOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{WaitTimeout: time.Minute})
		const n = 32
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i], _ = b.send(t.Context(), "refund-8842", "acct_1", `{"amount": 42}`) })
		}
		wg.Wait()
		require.Equal(t, int64(1), b.runs.Load())
		require.Equal(t, 1, b.refunds(t))
		for _, a := range answers {
			require.Equal(t, http.StatusCreated, a.status)
			require.Equal(t, answers[0].body, a.body, "byte-identical bodies")
			require.Equal(t, answers[0].header.Get("Location"), a.header.Get("Location"))
			require.Equal(t, "application/json", a.header.Get("Content-Type"))
		}
	})

	t.Run("ReplaysAfterCompletionByteForByte", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{})
		first := b.post(t, "k-1", "acct_1", `{"amount": 42}`)
		require.Equal(t, http.StatusCreated, first.status)
		require.Empty(t, first.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, "session=first-request-only", first.header.Get("Set-Cookie"))
		// A respelled JSON body is the same request.
		again := b.post(t, "k-1", "acct_1", `{ "amount" : 42.0 }`)
		require.Equal(t, first.status, again.status)
		require.Equal(t, first.body, again.body)
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
		require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
		require.Empty(t, again.header.Get("Set-Cookie"), "cookies are not stored")
		require.Equal(t, int64(1), b.runs.Load())
	})

	t.Run("ChangedBodyIs422", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{})
		require.Equal(t, http.StatusCreated, b.post(t, "k-1", "acct_1", `{"amount": 42}`).status)
		requireProblem(t, b.post(t, "k-1", "acct_1", `{"amount": 43}`), http.StatusUnprocessableEntity, "key-reused")
		require.Equal(t, int64(1), b.runs.Load())
	})

	t.Run("DuplicateWhileRunningIs409WithRetryAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{WaitTimeout: 100 * time.Millisecond})
		b.hold = make(chan struct{})
		release := sync.OnceFunc(func() { close(b.hold) })
		t.Cleanup(release)
		firstDone := make(chan answer, 1)
		go func() {
			a, _ := b.send(t.Context(), "k-1", "acct_1", `{"amount": 42}`)
			firstDone <- a
		}()
		<-b.started
		dup := b.post(t, "k-1", "acct_1", `{"amount": 42}`)
		requireProblem(t, dup, http.StatusConflict, "in-progress")
		require.Equal(t, "1", dup.header.Get("Retry-After"))
		release()
		first := <-firstDone
		require.Equal(t, http.StatusCreated, first.status)
		// The replay; on a busy machine a claim can outlast the 100ms
		// WaitTimeout by itself and answer 409, so ask until it does not.
		var replay answer
		require.Eventually(t, func() bool {
			a, err := b.send(t.Context(), "k-1", "acct_1", `{"amount": 42}`)
			replay = a
			return err == nil && a.status != http.StatusConflict
		}, time.Minute, 10*time.Millisecond)
		require.Equal(t, first.body, replay.body)
		require.Equal(t, int64(1), b.runs.Load())
	})

	t.Run("KeysAreScopedByAccount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{WaitTimeout: 100 * time.Millisecond})
		one := b.post(t, "shared-key", "acct_1", `{"amount": 42}`)
		two := b.post(t, "shared-key", "acct_2", `{"amount": 7}`)
		require.Equal(t, http.StatusCreated, one.status)
		require.Equal(t, http.StatusCreated, two.status, "another account's key is no conflict")
		require.Contains(t, two.body, `"acct_2"`)
		require.NotContains(t, two.body, `"acct_1"`)
		require.Equal(t, one.body, b.post(t, "shared-key", "acct_1", `{"amount": 42}`).body)
	})

	t.Run("RunningKeyOfOneAccountDoesNotBlockAnother", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{WaitTimeout: time.Minute})
		b.hold, b.holdAccount = make(chan struct{}), "acct_1"
		release := sync.OnceFunc(func() { close(b.hold) })
		t.Cleanup(release)
		done := make(chan answer, 1)
		go func() {
			a, _ := b.send(t.Context(), "busy", "acct_1", `{"amount": 1}`)
			done <- a
		}()
		<-b.started
		other := b.post(t, "busy", "acct_2", `{"amount": 1}`)
		require.Equal(t, http.StatusCreated, other.status, "not blocked by acct_1's running request")
		require.Contains(t, other.body, `"acct_2"`)
		release()
		require.Equal(t, http.StatusCreated, (<-done).status)
		require.Equal(t, int64(2), b.runs.Load())
	})

	t.Run("HandlerFailureAfterWritingRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{})
		b.failing.Store(true)
		failed := b.post(t, "k-1", "acct_1", `{"amount": 42}`)
		require.Equal(t, http.StatusInternalServerError, failed.status)
		require.Equal(t, 0, b.refunds(t), "the handler's write rolled back")
		b.failing.Store(false)
		retried := b.post(t, "k-1", "acct_1", `{"amount": 42}`)
		require.Equal(t, http.StatusCreated, retried.status)
		require.Empty(t, retried.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, int64(2), b.runs.Load(), "the retry ran the handler again")
		require.Equal(t, 1, b.refunds(t))
	})

	t.Run("BadKeysAre400AndChangeNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{KeyRequired: true, MaxKeyLength: 16})
		requireProblem(t, b.post(t, "", "acct_1", `{}`), http.StatusBadRequest, "missing-key")
		requireProblem(t, b.post(t, strings.Repeat("k", 17), "acct_1", `{}`), http.StatusBadRequest, "malformed-key")
		requireProblem(t, b.post(t, `"unterminated`, "acct_1", `{}`), http.StatusBadRequest, "malformed-key")
		requireProblem(t, b.post(t, "k-1", "", `{}`), http.StatusUnauthorized, "unauthorized")
		require.Equal(t, int64(0), b.runs.Load())
		require.Equal(t, 0, b.refunds(t))
		// A quoted key (RFC 8941, as the draft has it) is the bare key.
		require.Equal(t, http.StatusCreated, b.post(t, `"k-2"`, "acct_1", `{"amount": 1}`).status)
		require.Equal(t, "true", b.post(t, "k-2", "acct_1", `{"amount": 1}`).header.Get(idempotency.ReplayedHeader))
	})

	t.Run("ResponsePastTheLimitIsRefusedNotTruncated", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{MaxResponseBytes: 1024})
		b.large.Store(true)
		requireProblem(t, b.post(t, "k-1", "acct_1", `{"amount": 42}`), http.StatusInternalServerError, "response-too-large")
		require.Equal(t, 0, b.refunds(t))
	})

	t.Run("OtherMethodsPassThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, idempotency.Config{KeyRequired: true})
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.server.URL+"/refunds", nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "the handler ran without the middleware's transaction")
	})
}
