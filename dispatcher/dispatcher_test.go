package dispatcher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// ledger is a provider that records every effect it performs, per key.
type ledger struct {
	mu      sync.Mutex
	effects map[outbox.Key]int
	calls   map[outbox.Key]int
	// actFunc decides, per call, whether the effect happens and what the
	// call returns. nil: act and succeed.
	actFunc func(req outbox.Request) (act bool, err error)
	lookups atomic.Int64
	// dedup makes the ledger deduplicate on the key, as a provider of an
	// IdempotentByKey tool does: a repeated key acts no more.
	dedup bool
}

func newLedger() *ledger {
	return &ledger{effects: map[outbox.Key]int{}, calls: map[outbox.Key]int{}}
}

func (l *ledger) Call(_ context.Context, req outbox.Request) (json.RawMessage, error) {
	act, err := true, error(nil)
	if l.actFunc != nil {
		act, err = l.actFunc(req)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[req.Key]++
	if act && (!l.dedup || l.effects[req.Key] == 0) {
		l.effects[req.Key]++
	}
	if err != nil {
		return nil, err
	}
	return json.RawMessage(fmt.Sprintf(`{"key":%q,"attempt":%d}`, req.Key, req.Attempt)), nil
}

func (l *ledger) Lookup(_ context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	l.lookups.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.effects[req.Key] == 0 {
		return nil, false, nil
	}
	return json.RawMessage(fmt.Sprintf(`{"key":%q,"found":true}`, req.Key)), true, nil
}

// lookupProvider calls one provider and looks up with another.
type lookupProvider struct {
	outbox.Provider
	lookuper outbox.Lookuper
}

func (p lookupProvider) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	return p.lookuper.Lookup(ctx, req)
}

func (l *ledger) count(key outbox.Key) (calls, effects int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[key], l.effects[key]
}

type testBundle[TTx any] struct {
	client   *outbox.Client[TTx]
	driver   drivertest.Driver[TTx]
	ledger   *ledger
	registry *outbox.Registry
	schema   string
}

func setup[TTx any](t *testing.T, driver drivertest.Driver[TTx]) *testBundle[TTx] {
	t.Helper()
	schema := pgoncetest.Schema(t)
	l := newLedger()
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", l, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("provision", l, outbox.LookupByNaturalID))
	require.NoError(t, registry.Register("email", l, outbox.AtMostOnce))
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry})
	return &testBundle[TTx]{client: client, driver: driver, ledger: l, registry: registry, schema: schema}
}

// clientWith returns a client of the bundle's driver over the bundle's
// schema that serves registry.
func (b *testBundle[TTx]) clientWith(t *testing.T, registry *outbox.Registry) *outbox.Client[TTx] {
	t.Helper()
	return b.driver.Client(t, outbox.Config{Schema: b.schema, Registry: registry})
}

// submitAll submits calls through client in one transaction of the
// bundle's driver, and returns their keys.
func (b *testBundle[TTx]) submitAll(t *testing.T, client *outbox.Client[TTx], calls []outbox.Call) []outbox.Key {
	t.Helper()
	return b.driver.SubmitKeys(t, client, calls)
}

// fastConfig is the dispatcher config of the tests: quick polls and
// retries. It is the one place the tests set the call timeout.
func fastConfig() dispatcher.Config {
	return dispatcher.Config{
		PollInterval: 20 * time.Millisecond,
		BackoffMin:   time.Millisecond,
		BackoffMax:   5 * time.Millisecond,
	}
}

// halfOpenStatementTimeout is the statement deadline of clients behind a
// black-hole proxy. It ends a statement on a half-open connection, and lies
// far beyond what a statement on a live connection takes on a loaded
// machine: a live claim cut off by its deadline may have committed on the
// server, and its keys then stay in flight, under a lease no test here
// waits out, with nobody to run them.
const halfOpenStatementTimeout = 2 * time.Second

// start runs d until the test ends, and fails the test if Run errs.
func start[TTx any](t *testing.T, d *dispatcher.Dispatcher[TTx]) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(time.Minute):
				t.Error("dispatcher did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// call is the call of tool at step that the tests submit.
func call(tool string, step int64) outbox.Call {
	return outbox.Call{
		RunID: "run", Step: step, Tool: tool, NaturalID: fmt.Sprintf("nat-%d", step),
		Args: map[string]any{"step": step},
	}
}

// callsFrom is call of tool at each step from first to first+n-1.
func callsFrom(tool string, first int64, n int) []outbox.Call {
	out := make([]outbox.Call, n)
	for i := range out {
		out[i] = call(tool, first+int64(i))
	}
	return out
}

func submit[TTx any](t *testing.T, client *outbox.Client[TTx], tool string, step int64) outbox.Key {
	t.Helper()
	res, err := client.Submit(t.Context(), call(tool, step))
	require.NoError(t, err)
	require.True(t, res.Created)
	return res.Key
}

func awaitState[TTx any](t *testing.T, client *outbox.Client[TTx], key outbox.Key, want outbox.State) outbox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var res outbox.Result
	require.Eventually(t, func() bool {
		var err error
		res, err = client.Get(ctx, key)
		return err == nil && res.State == want
	}, time.Minute, 5*time.Millisecond, "key %s never reached %s", key, want)
	return res
}

func TestDispatcher(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testDispatcher[pgx.Tx], testDispatcher[*sql.Tx])
}

// TestDispatcherDirect holds the dispatcher tests that bring a pool of
// their own to the server (a shifted clock in its search_path, a pool
// whose backends they kill, one behind a proxy that goes half-open, one
// they find in pg_stat_activity by its application_name): none of these
// is a pool through a transaction pooler, so they run on the direct
// drivers only.
func TestDispatcherDirect(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testDispatcherDirect[pgx.Tx], testDispatcherDirect[*sql.Tx])
}

func testDispatcher[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("ThreeDispatchersDrainEachRowOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.dedup = true

		const rows = 3000
		keys := bundle.submitAll(t, bundle.client, callsFrom("refund", 0, rows))

		for range 3 {
			config := fastConfig()
			config.BatchSize, config.Concurrency = 50, 8
			d, err := dispatcher.New(bundle.client, config)
			require.NoError(t, err)
			start(t, d)
		}
		require.Eventually(t, func() bool {
			var open int
			err := pgoncetest.Pool(t).QueryRow(context.Background(),
				`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE state <> 'succeeded'`).Scan(&open)
			return err == nil && open == 0
		}, 2*time.Minute, 10*time.Millisecond)

		// Effects, not calls: on a busy machine a key may be presented again
		// (its outcome's record failed, or its lease ran out first), which
		// a provider that deduplicates on the key survives. What must hold
		// is one effect per key, and no more calls than the key's attempts
		// (a requeue takes an attempt without a call): no two dispatchers
		// ran the same attempt.
		attempts := map[string]int{}
		claims, err := pgoncetest.Pool(t).Query(t.Context(),
			`SELECT key, attempt FROM "`+bundle.schema+`".pgonce_key`)
		require.NoError(t, err)
		for claims.Next() {
			var (
				stored  []byte
				attempt int
			)
			require.NoError(t, claims.Scan(&stored, &attempt))
			attempts[string(stored)] = attempt
		}
		require.NoError(t, claims.Err())
		for _, key := range keys {
			calls, effects := bundle.ledger.count(key)
			require.Equal(t, 1, effects, "key %s", key)
			require.Positive(t, calls, "key %s", key)
			require.LessOrEqual(t, calls, attempts[string(pgoncetest.StoredKey(t, string(key)))], "key %s: a call per attempt at most", key)
		}
		var outboxRows int
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
			`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE state = 'open'`).Scan(&outboxRows))
		require.Zero(t, outboxRows)
	})

	t.Run("ClaimsAndLeasesByTheClientsClock", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The client's clock is an hour ahead of the database's: its submit
		// makes the key due an hour from now by the database's clock. The
		// dispatcher claims by the client's clock, as the reconciler
		// resolves by it, so that a test that moves the clock moves every
		// window alike.
		const ahead = time.Hour
		leaseLeft := make(chan float64, 1)
		provider := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
			var left float64
			err := pgoncetest.Pool(t).QueryRow(ctx, `SELECT extract(epoch FROM lease_until - pg_catalog.now())::float8
				FROM "`+bundle.schema+`".pgonce_key WHERE key = $1`, pgoncetest.StoredKey(t, string(req.Key))).Scan(&left)
			if err != nil {
				return nil, err
			}
			select {
			case leaseLeft <- left:
			default:
			}
			return bundle.ledger.Call(ctx, req)
		})
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{
			Schema: bundle.schema, Registry: registry,
			NowFunc: func() time.Time { return time.Now().Add(ahead) },
		})
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, client, "refund", 1)
		awaitState(t, client, key, outbox.StateSucceeded)
		left := <-leaseLeft
		require.Greater(t, left, ahead.Seconds(), "the lease runs from the client's clock")
		_, effects := bundle.ledger.count(key)
		require.Equal(t, 1, effects)
	})

	t.Run("RetriesWithBackoffReachSuccess", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.actFunc = func(req outbox.Request) (bool, error) {
			if req.Attempt < 3 {
				return false, errors.New("503 upstream")
			}
			return true, nil
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		res := awaitState(t, bundle.client, key, outbox.StateSucceeded)
		require.Equal(t, 3, res.Attempts)
		calls, effects := bundle.ledger.count(key)
		require.Equal(t, 3, calls)
		require.Equal(t, 1, effects)
	})

	t.Run("MaxAttemptsExhaustionFailsWithLastError", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.actFunc = func(req outbox.Request) (bool, error) {
			return false, fmt.Errorf("503 upstream on attempt %d", req.Attempt)
		}
		config := fastConfig()
		config.MaxAttempts = 3
		d, err := dispatcher.New(bundle.client, config)
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		res := awaitState(t, bundle.client, key, outbox.StateFailed)
		require.Contains(t, string(res.Failure), "503 upstream on attempt 3")
		calls, _ := bundle.ledger.count(key)
		require.Equal(t, 3, calls)
	})

	t.Run("BadErrorTextCostsNoOutcome", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		const rows = 60
		keys := bundle.submitAll(t, bundle.client, callsFrom("refund", 0, rows))
		// Every first attempt returns together, so that the outcomes share
		// record statements; two return error text PostgreSQL rejects in a
		// text column: a NUL byte and invalid UTF-8.
		permanent, retried := keys[7], keys[42]
		var arrived atomic.Int64
		together := make(chan struct{})
		bundle.ledger.actFunc = func(req outbox.Request) (bool, error) {
			if req.Attempt == 1 {
				if arrived.Add(1) == rows {
					close(together)
				}
				select {
				case <-together:
				case <-time.After(30 * time.Second): // fail, rather than hang, if the claims split
				}
			}
			switch {
			case req.Key == permanent:
				return false, outbox.Permanent(errors.New("card \x00 declined \xff\xfe"))
			case req.Key == retried && req.Attempt == 1:
				return false, errors.New("503 \x00 upstream \xc3")
			}
			return true, nil
		}
		config := fastConfig()
		config.Concurrency, config.BatchSize = rows, rows
		d, err := dispatcher.New(bundle.client, config)
		require.NoError(t, err)
		start(t, d)

		failed := awaitState(t, bundle.client, permanent, outbox.StateFailed)
		require.True(t, utf8.Valid(failed.Failure), "the failure body is valid UTF-8")
		require.True(t, json.Valid(failed.Failure))
		require.NotContains(t, string(failed.Failure), `\u0000`)
		require.Contains(t, string(failed.Failure), "declined")
		require.Equal(t, "permanent: card \uFFFD declined \uFFFD", failed.LastError)
		for _, key := range keys {
			if key == permanent {
				continue
			}
			res := awaitState(t, bundle.client, key, outbox.StateSucceeded)
			if key == retried {
				require.Equal(t, 2, res.Attempts)
			} else {
				require.Equal(t, 1, res.Attempts, "key %s", key)
			}
		}
		calls, _ := bundle.ledger.count(permanent)
		require.Equal(t, 1, calls, "a permanent failure is recorded, and never called again")
	})

	t.Run("PermanentFailureIsReplayedBySubmit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			return false, outbox.Permanent(errors.New("card declined"))
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		failed := awaitState(t, bundle.client, key, outbox.StateFailed)
		replay, err := bundle.client.Submit(t.Context(), call("refund", 1))
		require.NoError(t, err)
		require.True(t, replay.Replayed())
		require.Equal(t, []byte(failed.Failure), []byte(replay.Failure))
		calls, _ := bundle.ledger.count(key)
		require.Equal(t, 1, calls)
	})

	t.Run("PanicIsRecoveredAndRetried", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.actFunc = func(req outbox.Request) (bool, error) {
			if req.Attempt == 1 {
				panic("nil map write")
			}
			return true, nil
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		res := awaitState(t, bundle.client, key, outbox.StateSucceeded)
		require.Equal(t, 2, res.Attempts)
	})

	t.Run("PanicAfterActingIsAnUncertainOutcome", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The provider acts on the first attempt, then panics.
		actThenPanic := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
			resp, err := bundle.ledger.Call(ctx, req)
			if req.Attempt == 1 {
				panic("nil map write")
			}
			return resp, err
		})
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("provision", lookupProvider{actThenPanic, bundle.ledger}, outbox.LookupByNaturalID))
		require.NoError(t, registry.Register("email", actThenPanic, outbox.AtMostOnce))
		client := bundle.clientWith(t, registry)
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		provisioned := submit(t, client, "provision", 1)
		emailed := submit(t, client, "email", 2)

		res := awaitState(t, client, provisioned, outbox.StateSucceeded)
		require.JSONEq(t, fmt.Sprintf(`{"key":%q,"found":true}`, provisioned), string(res.Response),
			"the next attempt looked up first and found the effect")
		res = awaitState(t, client, emailed, outbox.StateNeedsReview)
		require.Contains(t, res.LastError, "nil map write")
		for _, key := range []outbox.Key{provisioned, emailed} {
			calls, effects := bundle.ledger.count(key)
			require.Equal(t, 1, calls, "key %s", key)
			require.Equal(t, 1, effects, "key %s", key)
		}
	})

	t.Run("NaturalIDReadsBeforeWriteAfterAmbiguousError", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The provider acts, but the response is lost.
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			return true, outbox.Ambiguous(errors.New("connection reset after send"))
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "provision", 1)
		res := awaitState(t, bundle.client, key, outbox.StateSucceeded)
		require.JSONEq(t, fmt.Sprintf(`{"key":%q,"found":true}`, key), string(res.Response))
		calls, effects := bundle.ledger.count(key)
		require.Equal(t, 1, calls)
		require.Equal(t, 1, effects)
		require.Equal(t, int64(1), bundle.ledger.lookups.Load())
	})

	t.Run("AtMostOnceAmbiguousNeedsReview", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			return true, context.DeadlineExceeded
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "email", 1)
		awaitState(t, bundle.client, key, outbox.StateNeedsReview)
		calls, _ := bundle.ledger.count(key)
		require.Equal(t, 1, calls)
	})

	t.Run("AmbiguousPastProviderKeyRetentionNeedsReview", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		var calls atomic.Int64
		forgetful := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			calls.Add(1)
			return nil, outbox.Ambiguous(errors.New("timeout after send"))
		})
		registry := outbox.NewRegistry()
		// The provider forgets keys at once: a retry by key is never safe.
		require.NoError(t, registry.RegisterWithOpts("charge", forgetful, outbox.IdempotentByKey,
			&outbox.ToolOpts{KeyRetention: time.Nanosecond}))
		client := bundle.clientWith(t, registry)
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, client, "charge", 1)
		awaitState(t, client, key, outbox.StateNeedsReview)
		require.Equal(t, int64(1), calls.Load())
	})

	t.Run("LeasesNeverExceedConcurrency", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		var maxLeased atomic.Int64
		counting := outbox.ProviderFunc(func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
			var leased int64
			err := pgoncetest.Pool(t).QueryRow(ctx,
				`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE lease_until IS NOT NULL`).Scan(&leased)
			if err != nil {
				return nil, err
			}
			for {
				seen := maxLeased.Load()
				if leased <= seen || maxLeased.CompareAndSwap(seen, leased) {
					break
				}
			}
			return json.RawMessage(`{}`), nil
		})
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", counting, outbox.IdempotentByKey))
		client := bundle.clientWith(t, registry)
		keys := bundle.submitAll(t, client, callsFrom("refund", 0, 60))
		config := fastConfig()
		config.Concurrency, config.BatchSize = 4, 4
		d, err := dispatcher.New(client, config)
		require.NoError(t, err)
		start(t, d)
		for _, key := range keys {
			awaitState(t, client, key, outbox.StateSucceeded)
		}
		require.Positive(t, maxLeased.Load())
		require.LessOrEqual(t, maxLeased.Load(), int64(4))
	})

	t.Run("UnregisteredToolIsNotClaimed", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// This process serves refund only.
		only := outbox.NewRegistry()
		require.NoError(t, only.Register("refund", bundle.ledger, outbox.IdempotentByKey))
		narrow := bundle.clientWith(t, only)
		d, err := dispatcher.New(narrow, fastConfig())
		require.NoError(t, err)
		start(t, d)

		email := submit(t, bundle.client, "email", 1)
		refund := submit(t, bundle.client, "refund", 2)
		awaitState(t, bundle.client, refund, outbox.StateSucceeded)
		res, err := bundle.client.Get(t.Context(), email)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)
		require.Zero(t, res.Attempts)
	})

	t.Run("InlineOnlyToolIsNeitherClaimedNorReported", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// This process serves refund, and registers inline for its callers
		// alone; email it does not register.
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.ledger, outbox.IdempotentByKey))
		require.NoError(t, registry.RegisterWithOpts("inline", bundle.ledger, outbox.IdempotentByKey, &outbox.ToolOpts{InlineOnly: true}))
		narrow := bundle.clientWith(t, registry)
		email := bundle.submitAll(t, bundle.client, []outbox.Call{call("email", 1)})[0]
		// The inline key is due first: a claim that took it would take it
		// with the refund, in the same batch.
		keys := bundle.submitAll(t, narrow, []outbox.Call{call("inline", 2), call("refund", 3)})
		inline, refund := keys[0], keys[1]

		logger, logs := pgoncetest.CaptureLogs()
		config := fastConfig()
		config.Logger, config.UnservedAfter = logger, time.Millisecond
		d, err := dispatcher.New(narrow, config)
		require.NoError(t, err)
		stop := start(t, d)
		awaitState(t, bundle.client, refund, outbox.StateSucceeded)
		unserved := func(tool string) func(pgoncetest.LogRecord) bool {
			return func(r pgoncetest.LogRecord) bool {
				return r.Message == "pgonce: pending rows of a tool no dispatcher here serves" && r.Attrs["tool"] == tool
			}
		}
		logs.Await(t, unserved("email")) // the report ran, over both keys
		stop()

		require.Empty(t, logs.Matching(unserved("inline")), "an inline-only tool's pending key is not unserved")
		res, err := narrow.Get(t.Context(), inline)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)
		require.Zero(t, res.Attempts)
		calls, _ := bundle.ledger.count(inline)
		require.Zero(t, calls, "no dispatcher calls an inline-only tool")
		res, err = bundle.client.Get(t.Context(), email)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)

		// Its caller's Do claims the pending key at once.
		res, err = narrow.Do(t.Context(), call("inline", 2), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		calls, effects := bundle.ledger.count(inline)
		require.Equal(t, 1, calls)
		require.Equal(t, 1, effects)
	})

	t.Run("ServedToolsDrainPastAnUnservedBacklog", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// This process serves refund and provision; 200 emails, due
		// first, wait for another.
		served := outbox.NewRegistry()
		require.NoError(t, served.Register("refund", bundle.ledger, outbox.IdempotentByKey))
		require.NoError(t, served.Register("provision", bundle.ledger, outbox.LookupByNaturalID))
		narrow := bundle.clientWith(t, served)
		emails := bundle.submitAll(t, bundle.client, callsFrom("email", 0, 200))
		mixed := make([]outbox.Call, 40)
		for i := range mixed {
			mixed[i] = call([]string{"refund", "provision"}[i%2], int64(1000+i))
		}
		keys := bundle.submitAll(t, bundle.client, mixed)
		config := fastConfig()
		config.Concurrency, config.BatchSize = 8, 8 // many claims, each over both tools
		d, err := dispatcher.New(narrow, config)
		require.NoError(t, err)
		start(t, d)

		for _, key := range keys {
			awaitState(t, bundle.client, key, outbox.StateSucceeded)
			calls, effects := bundle.ledger.count(key)
			require.Equal(t, 1, calls, "key %s", key)
			require.Equal(t, 1, effects, "key %s", key)
		}
		for _, key := range emails {
			res, err := bundle.client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, outbox.StatePending, res.State)
			require.Zero(t, res.Attempts)
		}
	})

	t.Run("ShutdownLetsCallsInFlightFinish", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		entered, release := make(chan struct{}), make(chan struct{})
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			close(entered)
			<-release
			return true, nil
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		stop := start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		<-entered
		stopped := make(chan struct{})
		go func() {
			stop()
			close(stopped)
		}()
		close(release)
		<-stopped
		res, err := bundle.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
	})

	t.Run("ShutdownTimeoutLeavesRowInFlight", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		entered := make(chan struct{})
		bundle.ledger.actFunc = nil
		slow := outbox.ProviderFunc(func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", slow, outbox.IdempotentByKey))
		client := bundle.clientWith(t, registry)
		config := fastConfig()
		config.ShutdownTimeout = -1
		d, err := dispatcher.New(client, config)
		require.NoError(t, err)
		stop := start(t, d)

		key := submit(t, client, "refund", 1)
		<-entered
		stop()
		res, err := client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateInFlight, res.State)
	})

	t.Run("ListenerSurvivesTerminatedConnection", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		config := fastConfig()
		config.PollInterval = time.Hour // only notifications can wake it
		d, err := dispatcher.New(bundle.client, config)
		require.NoError(t, err)
		start(t, d)

		listenerPID := func() int { return listenerPID(t, bundle.client) }
		var first int
		require.Eventually(t, func() bool { first = listenerPID(); return first != 0 }, time.Minute, 5*time.Millisecond)
		awaitState(t, bundle.client, submit(t, bundle.client, "refund", 1), outbox.StateSucceeded)

		_, err = pgoncetest.Pool(t).Exec(t.Context(), `SELECT pg_terminate_backend($1)`, first)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			pid := listenerPID()
			return pid != 0 && pid != first
		}, time.Minute, 5*time.Millisecond)
		awaitState(t, bundle.client, submit(t, bundle.client, "refund", 2), outbox.StateSucceeded)
	})
}

func testDispatcherDirect[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("KeyRetentionIsMeasuredOnTheDatabaseClock", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The database's clock is an hour ahead of this process's.
		registry := outbox.NewRegistry()
		require.NoError(t, registry.RegisterWithOpts("refund", bundle.ledger, outbox.IdempotentByKey,
			&outbox.ToolOpts{KeyRetention: time.Hour}))
		client := driver.ClientOver(t, pgoncetest.ShiftedClockPool(t, time.Hour),
			outbox.Config{Schema: bundle.schema, Registry: registry})

		// An uncertain first attempt that acted 90 minutes ago by the
		// database's clock (30 by the local one): the provider has forgotten
		// its key, so a retry by key would act twice.
		key := submit(t, client, "refund", 1)
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `UPDATE "`+bundle.schema+`".pgonce_key
			SET attempt = 1, ambiguous = true, first_attempted_at = pg_catalog.now() - interval '30 minutes'
			WHERE key = $1`, pgoncetest.StoredKey(t, string(key)))
		require.NoError(t, err)
		bundle.ledger.mu.Lock()
		bundle.ledger.effects[key] = 1
		bundle.ledger.mu.Unlock()

		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		res := awaitState(t, client, key, outbox.StateSucceeded)
		require.JSONEq(t, fmt.Sprintf(`{"key":%q,"found":true}`, key), string(res.Response),
			"past the provider's key retention the attempt looks up first")
		calls, effects := bundle.ledger.count(key)
		require.Zero(t, calls, "no retry by a forgotten key")
		require.Equal(t, 1, effects)
	})

	t.Run("OutcomeSurvivesAKilledConnection", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The provider acts, and then the server kills every connection of
		// the dispatcher's pool: recording the outcome meets a dead one.
		pool, kill := pgoncetest.KillablePool(t)
		killing := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
			resp, err := bundle.ledger.Call(ctx, req)
			if err != nil {
				return nil, err
			}
			return resp, kill(ctx)
		})
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", killing, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", killing, outbox.AtMostOnce))
		// No listener, and one call at a time: nothing else in the
		// dispatcher uses, and so replaces, the dead connections.
		client := driver.ClientOver(t, pool, outbox.Config{Schema: bundle.schema, Registry: registry, NotifyDisabled: true})
		config := fastConfig()
		config.Concurrency = 1
		d, err := dispatcher.New(client, config)
		require.NoError(t, err)
		start(t, d)

		// The test submits and reads through a pool of its own, so that only
		// the dispatcher meets the dead connections.
		for step, tool := range []string{"refund", "email"} {
			key := submit(t, bundle.client, tool, int64(step))
			var res outbox.Result
			require.Eventually(t, func() bool {
				res, err = bundle.client.Get(t.Context(), key)
				return err == nil && res.State == outbox.StateSucceeded
			}, 15*time.Second, 5*time.Millisecond, "%s: the provider's success was not recorded", tool)
			require.Equal(t, 1, res.Attempts)
			calls, effects := bundle.ledger.count(key)
			require.Equal(t, 1, calls, tool)
			require.Equal(t, 1, effects, tool)
		}
	})

	t.Run("ClaimsAgainAfterAHalfOpenConnection", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The dispatcher reaches the database through a proxy that can make
		// its connections half-open: the server gone without a word.
		// Room for new connections: one dropped by its deadline keeps its
		// slot while pgx drains it, for up to 15s.
		proxy, pool := pgoncetest.NewBlackHoleProxy(t, 8)
		// A claim sent just before the hole opens can reach the server,
		// wait there behind the submits below (a busy machine), claim
		// their keys and commit, its answer lost in the hole: as when a
		// server vanishes after a commit, those keys are in flight until
		// their lease ends, and maintenance hands them back. The lease is
		// short so that this happens within the test; a live call that
		// outlives it is retried by key, hence effects are counted.
		bundle.ledger.dedup = true
		client := driver.ClientOver(t, pool, outbox.Config{
			Schema: bundle.schema, Registry: bundle.registry, NotifyDisabled: true,
			StatementTimeout: halfOpenStatementTimeout,
			CallTimeout:      5 * time.Second, Lease: 10 * time.Second,
		})
		d, err := dispatcher.New(client, maintenanceConfig())
		require.NoError(t, err)
		start(t, d)

		// The test submits and reads through the shared pool.
		first := submit(t, bundle.client, "refund", 1)
		awaitState(t, bundle.client, first, outbox.StateSucceeded)

		proxy.BlackHole()
		keys := bundle.submitAll(t, bundle.client, callsFrom("refund", 2, 5))
		for _, key := range keys {
			var last outbox.Result
			require.Eventually(t, func() bool {
				res, err := bundle.client.Get(t.Context(), key)
				last = res
				return err == nil && res.State == outbox.StateSucceeded
			}, 2*time.Minute, 10*time.Millisecond, "the dispatcher never claimed %s; last seen: %+v", key, &last)
			_, effects := bundle.ledger.count(key)
			require.Equal(t, 1, effects)
		}
	})

	t.Run("ClaimsAgainSoonAfterAFailedClaim", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		keys := bundle.submitAll(t, bundle.client, callsFrom("refund", 1, 3))
		// The pool's one idle connection goes half-open, so the first
		// claim fails on its deadline. Nothing else wakes the dispatcher:
		// no notifications, and a poll an hour from now.
		proxy, pool := pgoncetest.NewBlackHoleProxy(t, 8)
		require.NoError(t, pool.Ping(t.Context()))
		proxy.BlackHole()
		client := driver.ClientOver(t, pool, outbox.Config{
			Schema: bundle.schema, Registry: bundle.registry, NotifyDisabled: true,
			StatementTimeout: halfOpenStatementTimeout,
		})
		config := fastConfig()
		config.PollInterval = time.Hour
		d, err := dispatcher.New(client, config)
		require.NoError(t, err)
		start(t, d)

		for _, key := range keys {
			require.Eventually(t, func() bool {
				res, err := bundle.client.Get(t.Context(), key)
				return err == nil && res.State == outbox.StateSucceeded
			}, time.Minute, 10*time.Millisecond, "no claim after the failed one ran %s", key)
			calls, _ := bundle.ledger.count(key)
			require.Equal(t, 1, calls)
		}
	})

	t.Run("NotifyCooldownTrailingClaimFindsSuppressedKeys", func(t *testing.T) {
		t.Parallel()
		bundle, client, stop := startWithCooldown(t, driver, 2*time.Second)

		var second outbox.Key
		notified := pgoncetest.WorkNotifications(t, bundle.schema, func() {
			// The first submit notifies. Once its call is recorded, the
			// freed slot makes the dispatcher claim once more, find
			// nothing, and wait.
			first := awaitState(t, bundle.client, submit(t, client, "refund", 1), outbox.StateSucceeded)
			awaitIdleClaim(t, bundle.schema, first.CompletedAt, first.CompletedAt)
			// The second, within the cooldown, does not notify: only the
			// claim one cooldown after the first notification can find it.
			second = submit(t, client, "refund", 2)
		})
		require.Equal(t, 1, notified, "the second submit, within the cooldown, must not notify")
		awaitState(t, bundle.client, second, outbox.StateSucceeded)
		stop()
	})

	t.Run("ASubmitInTheCooldownOfAMissedNotificationIsClaimed", func(t *testing.T) {
		t.Parallel()
		const cooldown = 5 * time.Second
		bundle, client := cooldownClient(t, driver, cooldown)

		var first, second outbox.Key
		notified := pgoncetest.WorkNotifications(t, bundle.schema, func() {
			// The first submit notifies before any dispatcher listens: the
			// dispatcher finds its key by catching up once it listens.
			first = submit(t, client, "refund", 1)
			startCooldownDispatcher(t, client)
			done := awaitState(t, bundle.client, first, outbox.StateSucceeded)
			awaitIdleClaim(t, bundle.schema, done.CompletedAt, done.CompletedAt)
			// The second, within the cooldown of the notification the
			// dispatcher never heard, does not notify: only a trailing
			// claim armed by the catch-up finds it (the dispatcher polls
			// once an hour).
			second = submit(t, client, "refund", 2)
		})
		require.Equal(t, 1, notified, "the second submit, within the cooldown, must not notify")
		awaitState(t, bundle.client, second, outbox.StateSucceeded)
	})

	t.Run("ALoneSubmitIsClaimedOnItsNotificationUnderTheDefaultCooldown", func(t *testing.T) {
		t.Parallel()
		bundle, client, stop := startWithCooldown(t, driver, 0)
		cooldown := client.Config().NotifyCooldown
		require.Equal(t, outbox.NotifyCooldownDefault, cooldown)

		var lone outbox.Key
		notified := pgoncetest.WorkNotifications(t, bundle.schema, func() {
			first := awaitState(t, bundle.client, submit(t, client, "refund", 1), outbox.StateSucceeded)
			// Once the first call is recorded the dispatcher claims again,
			// finds nothing, and waits. The trailing claim one cooldown
			// after the first notification comes and goes before two
			// cooldowns past the first call's completion, on the one clock
			// of this machine. From then on only a notification wakes it.
			awaitIdleClaim(t, bundle.schema, first.CompletedAt, first.CompletedAt.Add(2*cooldown))
			lone = submit(t, client, "refund", 2)
		})
		require.Equal(t, 2, notified, "a submit after a quiet cooldown must notify")
		res := awaitState(t, bundle.client, lone, outbox.StateSucceeded)
		t.Logf("the lone call was recorded %s after its submit", res.CompletedAt.Sub(res.CreatedAt))
		stop()
	})
}

// startWithCooldown starts a dispatcher whose client submits under
// cooldown (0: the default), over a pool of its own named after the bundle's schema, so that
// its claims can be told from other tests' statements (awaitIdleClaim). It
// polls once an hour: only notifications, and the trailing claim after
// one, wake it. It returns once the dispatcher listens.
func startWithCooldown[TTx any](t *testing.T, driver drivertest.Driver[TTx], cooldown time.Duration) (*testBundle[TTx], *outbox.Client[TTx], func()) {
	t.Helper()
	bundle, client := cooldownClient(t, driver, cooldown)
	return bundle, client, startCooldownDispatcher(t, client)
}

// cooldownClient returns the client of startWithCooldown, with no
// dispatcher yet.
func cooldownClient[TTx any](t *testing.T, driver drivertest.Driver[TTx], cooldown time.Duration) (*testBundle[TTx], *outbox.Client[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	poolConfig, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	poolConfig.ConnConfig.RuntimeParams["application_name"] = bundle.schema
	pool, err := pgxpool.NewWithConfig(t.Context(), poolConfig)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	client := driver.ClientOver(t, pool, outbox.Config{
		Schema: bundle.schema, Registry: bundle.registry, NotifyCooldown: cooldown,
	})
	return bundle, client
}

// startCooldownDispatcher starts the dispatcher of startWithCooldown over
// client and returns once it listens.
func startCooldownDispatcher[TTx any](t *testing.T, client *outbox.Client[TTx]) func() {
	t.Helper()
	config := fastConfig()
	config.PollInterval = time.Hour
	d, err := dispatcher.New(client, config)
	require.NoError(t, err)
	stop := start(t, d)
	require.Eventually(t, func() bool { return listenerPID(t, client) != 0 }, time.Minute, 5*time.Millisecond)
	return stop
}

// awaitIdleClaim waits until the dispatcher of startWithCooldown over
// schema has finished a claim begun after since, and the database's clock
// has passed notBefore. It reads through another pool, so that the
// dispatcher's connections show their last statements.
func awaitIdleClaim(t *testing.T, schema string, since, notBefore time.Time) {
	t.Helper()
	require.Eventually(t, func() bool {
		var idle bool
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(), `
			SELECT now() > $3 AND EXISTS (
				SELECT 1 FROM pg_stat_activity
				WHERE application_name = $1
					AND query LIKE '-- name: OutboxClaimBatch %'
					AND state = 'idle'
					AND query_start > $2
			)`, schema, since, notBefore).Scan(&idle))
		return idle
	}, time.Minute, time.Millisecond, "the dispatcher never claimed after %s", since)
}

// listenerPID returns the backend pid of the connection that listens on
// client's work channel, or 0.
func listenerPID[TTx any](t *testing.T, client *outbox.Client[TTx]) int {
	t.Helper()
	var pid int
	err := pgoncetest.Pool(t).QueryRow(context.Background(), `
		SELECT coalesce(max(pid), 0) FROM pg_stat_activity
		WHERE query = 'LISTEN "`+ident.WorkChannel(client.Config().Schema)+`"'`).Scan(&pid)
	require.NoError(t, err)
	return pid
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testNewRefusesInvalidConfig[pgx.Tx], testNewRefusesInvalidConfig[*sql.Tx])
}

func testNewRefusesInvalidConfig[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	for _, tt := range []struct {
		name   string
		config dispatcher.Config
	}{
		{"NegativeConcurrency", dispatcher.Config{Concurrency: -1}},
		{"NegativeBatch", dispatcher.Config{BatchSize: -1}},
		{"BackoffMinAboveMax", dispatcher.Config{BackoffMin: time.Hour, BackoffMax: time.Minute}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := dispatcher.New(bundle.client, tt.config)
			require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
		})
	}
}

// TestNewRefusesAClientNotMadeByNew: a zero outbox.Client has no runner;
// New says so with ErrInvalidConfig instead of panicking.
func TestNewRefusesAClientNotMadeByNew(t *testing.T) {
	t.Parallel()
	_, err := dispatcher.New(&outbox.Client[pgx.Tx]{}, dispatcher.Config{})
	require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
	_, err = dispatcher.New(&outbox.Client[*sql.Tx]{}, dispatcher.Config{MaintenanceDisabled: true})
	require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
}
