package oncetest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// testSchema is the schema of a test over driver d, made by oncetest's own
// helper for that driver's handle.
func testSchema[TTx any](t *testing.T, d drivertest.Driver[TTx]) string {
	t.Helper()
	if d.Name == drivertest.NamePgx {
		return oncetest.SchemaPgx(t, pgoncetest.Pool(t))
	}
	return oncetest.Schema(t, pgoncetest.DB(t))
}

func refund(run string, order int) outbox.Call {
	return outbox.Call{RunID: run, Step: 1, Tool: "refund", Args: map[string]any{"order": order, "amount": "42.00"}}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testDrain[pgx.Tx], testDrain[*sql.Tx])
}

func testDrain[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	type testBundle struct {
		client   *outbox.Client[TTx]
		clock    *oncetest.Clock
		recorder *oncetest.Recorder
		registry *outbox.Registry
		schema   string
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		bundle := &testBundle{
			clock:    oncetest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
			recorder: &oncetest.Recorder{},
			registry: outbox.NewRegistry(),
			schema:   testSchema(t, d),
		}
		require.NoError(t, bundle.registry.Register("refund", bundle.recorder, outbox.IdempotentByKey))
		bundle.client = d.Client(t, outbox.Config{Schema: bundle.schema, Registry: bundle.registry, NowFunc: bundle.clock.Now})
		return bundle
	}

	t.Run("RunsDueCallsUntilIdle", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		keys := d.SubmitKeys(t, bundle.client, []outbox.Call{refund("run-a", 1), refund("run-b", 2)})
		again, err := bundle.client.Submit(t.Context(), refund("run-a", 1))
		require.NoError(t, err)
		require.False(t, again.Created)

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.ElementsMatch(t, keys, res.Keys)
		require.Equal(t, 2, res.Succeeded)
		require.Equal(t, 2, res.Attempts())
		for _, key := range keys {
			got, err := bundle.client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, got.State)
			require.JSONEq(t, string(oncetest.RecorderResponseDefault), string(got.Response))
		}
		oncetest.RequireCalledOnce(t, bundle.recorder, "refund", map[string]any{"amount": "42.00", "order": 1})
		oncetest.RequireCalledOnce(t, bundle.recorder, "refund", json.RawMessage(`{"order":2.0, "amount":"42.00"}`))

		// Idle: nothing is due, nothing runs.
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Zero(t, res.Attempts())
		require.Len(t, bundle.recorder.Calls(), 2)
	})

	t.Run("PassesTheCallsMetadataAsTheDispatcherDoes", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		var (
			mu   sync.Mutex
			seen []map[string]string
		)
		bundle.recorder.RespondFunc = func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, req.Metadata)
			return json.RawMessage(oncetest.RecorderResponseDefault), nil
		}
		call := refund("run-a", 1)
		call.Metadata = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme"}
		d.SubmitKeys(t, bundle.client, []outbox.Call{call})

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []map[string]string{call.Metadata}, seen)
	})

	t.Run("RunsCallsThatProvidersSubmit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		mails := &oncetest.Recorder{}
		require.NoError(t, bundle.registry.Register("email", mails, outbox.AtMostOnce))
		bundle.recorder.RespondFunc = func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
			_, err := bundle.client.Submit(ctx, outbox.Call{RunID: string(req.Key), Step: 1, Tool: "email", Args: map[string]any{"to": "a@example.com"}})
			return json.RawMessage(`{"refund_id":"re_1"}`), err
		}
		d.SubmitKeys(t, bundle.client, []outbox.Call{refund("run-a", 1)})

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 2, res.Succeeded)
		oncetest.RequireCalledOnce(t, mails, "email", map[string]any{"to": "a@example.com"})
	})

	t.Run("RetriesAfterTheClockPassesTheBackoff", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		var mu sync.Mutex
		fail := 2
		bundle.recorder.RespondFunc = func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
			mu.Lock()
			defer mu.Unlock()
			if fail > 0 {
				fail--
				return nil, errors.New("provider unavailable")
			}
			return json.RawMessage(`{"refund_id":"re_1"}`), nil
		}
		key := d.SubmitKeys(t, bundle.client, []outbox.Call{refund("run-a", 1)})[0]

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, oncetest.DrainResult{Keys: []outbox.Key{key}, Retried: 1}, res)
		got, err := bundle.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State)

		// The default backoff is 1s after the first attempt, by the clock.
		bundle.clock.Advance(999 * time.Millisecond)
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Zero(t, res.Attempts())
		bundle.clock.Advance(time.Millisecond)
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Retried)

		// Then 2s after the second.
		bundle.clock.Advance(2 * time.Second)
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		got, err = bundle.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, got.State)
		require.JSONEq(t, `{"refund_id":"re_1"}`, string(got.Response))
		calls := bundle.recorder.Calls()
		require.Len(t, calls, 3)
		require.Equal(t, []int{1, 2, 3}, []int{calls[0].Attempt, calls[1].Attempt, calls[2].Attempt})
	})

	t.Run("BackoffFuncAndMaxAttempts", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		bundle.recorder.RespondFunc = func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, errors.New("provider unavailable")
		}
		key := d.SubmitKeys(t, bundle.client, []outbox.Call{refund("run-a", 1)})[0]

		// No backoff: every attempt is due at once, until the last.
		res, err := oncetest.Drain(t.Context(), bundle.client, &oncetest.DrainOpts{
			MaxAttempts: 3,
			BackoffFunc: func(int) time.Duration { return 0 },
		})
		require.NoError(t, err)
		require.Equal(t, oncetest.DrainResult{Keys: []outbox.Key{key, key, key}, Retried: 2, Failed: 1}, res)
		got, err := bundle.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, got.State)
	})

	t.Run("StoresPermanentFailuresAndReviews", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		mails := &oncetest.Recorder{RespondFunc: func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, outbox.Ambiguous(errors.New("timeout after sending"))
		}}
		require.NoError(t, bundle.registry.Register("email", mails, outbox.AtMostOnce))
		bundle.recorder.RespondFunc = func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, outbox.Permanent(errors.New("card declined"))
		}
		keys := d.SubmitKeys(t, bundle.client, []outbox.Call{
			refund("run-a", 1),
			{RunID: "run-a", Step: 2, Tool: "email", Args: map[string]any{"to": "a@example.com"}},
		})

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Failed)
		require.Equal(t, 1, res.NeedsReview)
		failed, err := bundle.client.Get(t.Context(), keys[0])
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, failed.State)
		review, err := bundle.client.Get(t.Context(), keys[1])
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, review.State)
	})

	t.Run("LeavesToolsTheClientDoesNotRegister", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		mails := &oncetest.Recorder{}
		require.NoError(t, bundle.registry.Register("email", mails, outbox.AtMostOnce))
		d.SubmitKeys(t, bundle.client, []outbox.Call{
			refund("run-a", 1),
			{RunID: "run-a", Step: 2, Tool: "email", Args: map[string]any{"to": "a@example.com"}},
		})
		refundsOnly := outbox.NewRegistry()
		require.NoError(t, refundsOnly.Register("refund", bundle.recorder, outbox.IdempotentByKey))
		other := d.Client(t, outbox.Config{Schema: bundle.schema, Registry: refundsOnly, NowFunc: bundle.clock.Now})

		res, err := oncetest.Drain(t.Context(), other, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		oncetest.RequireNotCalled(t, mails, "email")
	})

	t.Run("LeavesInlineOnlyToolsToTheirCallers", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		requests := &oncetest.Recorder{}
		require.NoError(t, bundle.registry.RegisterWithOpts("http_request", requests, outbox.IdempotentByKey, &outbox.ToolOpts{InlineOnly: true}))
		d.SubmitKeys(t, bundle.client, []outbox.Call{
			{RunID: "run-b", Step: 1, Tool: "http_request", Args: map[string]any{"path": "/refunds"}},
			refund("run-a", 2),
		})

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		oncetest.RequireNotCalled(t, requests, "http_request")
	})

	t.Run("StopsAtMaxCallsAndReleasesTheRest", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		keys := d.SubmitKeys(t, bundle.client, []outbox.Call{refund("run-a", 1), refund("run-b", 2), refund("run-c", 3)})

		res, err := oncetest.Drain(t.Context(), bundle.client, &oncetest.DrainOpts{MaxCalls: 2})
		require.ErrorIs(t, err, oncetest.ErrDrainLimit)
		require.Equal(t, 2, res.Succeeded)
		require.Len(t, bundle.recorder.Calls(), 2)

		// The key claimed but not run is pending and due again at once.
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		for _, key := range keys {
			got, err := bundle.client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, got.State)
		}
	})

	t.Run("InvalidOptsChangeNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		key := d.SubmitKeys(t, bundle.client, []outbox.Call{refund("run-a", 1)})[0]
		for _, tt := range []struct {
			name string
			opts *oncetest.DrainOpts
		}{
			{"NegativeMaxAttempts", &oncetest.DrainOpts{MaxAttempts: -1}},
			{"NegativeMaxCalls", &oncetest.DrainOpts{MaxCalls: -1}},
		} {
			_, err := oncetest.Drain(t.Context(), bundle.client, tt.opts)
			require.ErrorIs(t, err, oncetest.ErrInvalidOpts, tt.name)
		}
		_, err := oncetest.Drain[TTx](t.Context(), nil, nil)
		require.ErrorIs(t, err, oncetest.ErrInvalidOpts)
		// A zero client has no runner: refused, not a panic.
		_, err = oncetest.Drain(t.Context(), &outbox.Client[TTx]{}, nil)
		require.ErrorIs(t, err, oncetest.ErrInvalidOpts)
		got, err := bundle.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State)
		oncetest.RequireNotCalled(t, bundle.recorder, "refund")
	})

	t.Run("FakeClockDrivesRetention", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		call := refund("run-a", 1)
		key := d.SubmitKeys(t, bundle.client, []outbox.Call{call})[0]
		_, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		done := bundle.clock.Now()

		// Within the retention, a duplicate replays the response.
		bundle.clock.Advance(outbox.RetentionDefault - time.Second)
		pruned, err := bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{}, pruned)
		again, err := bundle.client.Submit(t.Context(), call)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, again.State)

		// Past it, the key is a tombstone: "executed at T", never again.
		bundle.clock.Advance(2 * time.Second)
		pruned, err = bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{Keys: 1}, pruned)
		_, err = bundle.client.Submit(t.Context(), call)
		var expired *outbox.ExpiredError
		require.ErrorAs(t, err, &expired)
		require.True(t, expired.CompletedAt.Equal(done), "completed at %s, want %s", expired.CompletedAt, done)

		// Past the tombstone's retention, the key is forgotten.
		bundle.clock.Set(done.Add(outbox.TombstoneRetentionDefault + time.Second))
		pruned, err = bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{Tombstones: 1}, pruned)
		fresh, err := bundle.client.Submit(t.Context(), call)
		require.NoError(t, err)
		require.True(t, fresh.Created)
		require.Equal(t, key, fresh.Key)
		oncetest.RequireCalledOnce(t, bundle.recorder, "refund", call.Args)
	})
}

// fakeTB records the failures of an assertion instead of failing the test.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	failures []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

// failures runs assertion with a fake testing.TB, in a goroutine of its own
// since a fatal failure ends it, and returns what it reported.
func failures(t *testing.T, assertion func(tb testing.TB)) []string {
	t.Helper()
	fake := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		assertion(fake)
	}()
	<-done
	fake.mu.Lock()
	defer fake.mu.Unlock()
	return fake.failures
}

func TestRecorder(t *testing.T) {
	t.Parallel()

	request := func(tool string, attempt int, args string) outbox.Request {
		return outbox.Request{Key: "k1_test", Tool: tool, Args: json.RawMessage(args), Attempt: attempt}
	}
	call := func(t *testing.T, r *oncetest.Recorder, req outbox.Request) {
		t.Helper()
		resp, err := r.Call(t.Context(), req)
		require.NoError(t, err)
		require.JSONEq(t, string(oncetest.RecorderResponseDefault), string(resp))
	}
	args := map[string]any{"order": 8842, "amount": "42.00"}

	t.Run("CalledOncePassesWhateverTheSpelling", func(t *testing.T) {
		t.Parallel()
		r := &oncetest.Recorder{}
		call(t, r, request("refund", 1, `{"amount":"42.00","order":8842}`))
		call(t, r, request("refund", 1, `{"amount":"42.00","order":1}`))
		call(t, r, request("email", 1, `{"amount":"42.00","order":8842}`))
		require.Empty(t, failures(t, func(tb testing.TB) {
			got := oncetest.RequireCalledOnce(tb, r, "refund", json.RawMessage(`{ "order": 8.842e3, "amount": "42.00" }`))
			require.Equal(t, 1, got.Attempt)
			oncetest.RequireCalledOnce(tb, r, "refund", args)
			oncetest.RequireNotCalled(tb, r, "sms")
		}))
	})

	t.Run("CalledOnceFailsWhenCalledTwice", func(t *testing.T) {
		t.Parallel()
		r := &oncetest.Recorder{}
		call(t, r, request("refund", 1, `{"amount":"42.00","order":8842}`))
		call(t, r, request("refund", 2, `{"amount":"42.00","order":8842}`))
		got := failures(t, func(tb testing.TB) { oncetest.RequireCalledOnce(tb, r, "refund", args) })
		require.Len(t, got, 1)
		require.Contains(t, got[0], "refund called 2 times")
		require.Contains(t, got[0], "attempt 2")
	})

	t.Run("CalledOnceFailsWhenNeverCalledOrOtherArgs", func(t *testing.T) {
		t.Parallel()
		r := &oncetest.Recorder{}
		require.Len(t, failures(t, func(tb testing.TB) { oncetest.RequireCalledOnce(tb, r, "refund", args) }), 1)
		call(t, r, request("refund", 1, `{"amount":"42.01","order":8842}`))
		call(t, r, request("email", 1, `{"amount":"42.00","order":8842}`))
		got := failures(t, func(tb testing.TB) { oncetest.RequireCalledOnce(tb, r, "refund", args) })
		require.Len(t, got, 1)
		require.Contains(t, got[0], "refund called 0 times")
		require.Contains(t, got[0], `"42.01"`)
	})

	t.Run("CalledOnceFailsForArgsWithoutCanonicalForm", func(t *testing.T) {
		t.Parallel()
		r := &oncetest.Recorder{}
		got := failures(t, func(tb testing.TB) {
			oncetest.RequireCalledOnce(tb, r, "refund", json.RawMessage(`{"a":1,"a":2}`))
		})
		require.Len(t, got, 1)
		require.Contains(t, got[0], "expected arguments")
	})

	t.Run("NotCalledFailsWhenCalled", func(t *testing.T) {
		t.Parallel()
		r := &oncetest.Recorder{}
		call(t, r, request("refund", 1, `{}`))
		got := failures(t, func(tb testing.TB) { oncetest.RequireNotCalled(tb, r, "refund") })
		require.Len(t, got, 1)
		require.Contains(t, got[0], "want never")
		r.Reset()
		require.Empty(t, failures(t, func(tb testing.TB) { oncetest.RequireNotCalled(tb, r, "refund") }))
	})

	t.Run("RespondFuncAnswers", func(t *testing.T) {
		t.Parallel()
		declined := outbox.Permanent(errors.New("card declined"))
		r := &oncetest.Recorder{RespondFunc: func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, declined
		}}
		_, err := r.Call(t.Context(), request("refund", 1, `{}`))
		require.ErrorIs(t, err, declined)
		require.Len(t, r.Calls(), 1, "a failed call is a call the provider received")
	})
}

func TestClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	clock := oncetest.NewClock(start)
	require.Equal(t, start.Truncate(time.Microsecond), clock.Now())
	require.Equal(t, start.Add(time.Hour).Truncate(time.Microsecond), clock.Advance(time.Hour))
	clock.Set(start)
	require.Equal(t, start.Truncate(time.Microsecond), clock.Now())
	require.WithinDuration(t, time.Now(), oncetest.NewClock(time.Time{}).Now(), time.Minute)
}

func TestSchema(t *testing.T) {
	t.Parallel()
	exists := func(t *testing.T, schema string) bool {
		t.Helper()
		var found bool
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
			`SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&found))
		return found
	}
	for _, name := range []string{drivertest.NamePgx, drivertest.NameDatabaseSQL} {
		t.Run(name+"/MigratedThenDropped", func(t *testing.T) {
			t.Parallel()
			var schema string
			t.Run("Inner", func(t *testing.T) {
				if name == drivertest.NamePgx {
					schema = oncetest.SchemaPgx(t, pgoncetest.Pool(t))
				} else {
					schema = oncetest.Schema(t, pgoncetest.DB(t))
				}
				require.True(t, exists(t, schema))
				var count int
				require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
					`SELECT count(*) FROM `+`"`+schema+`".pgonce_key`).Scan(&count))
				require.Zero(t, count)
			})
			require.Regexp(t, `^oncetest_[0-9a-f]{16}$`, schema)
			require.False(t, exists(t, schema), "schema %s outlived its test", schema)
		})
	}
}
