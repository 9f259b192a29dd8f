package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestClient(t *testing.T) {
	t.Parallel()
	eachHarness(t, testClient[pgx.Tx], testClient[*sql.Tx])
}

func refundCall(runID string) outbox.Call {
	return outbox.Call{
		RunID: runID,
		Step:  3,
		Tool:  "refund",
		Args:  json.RawMessage(`{"order": 8842, "amount": 42.00}`),
	}
}

func testClient[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client   *outbox.Client[TTx]
		provider *countingProvider
		schema   string
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		provider := &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
		client := h.newClient(t, outbox.Config{Schema: schema, Registry: registry})
		return &testBundle{client: client, provider: provider, schema: schema}
	}

	t.Run("SubmitTxCreatesKeyAndOutboxRow", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		tx := h.begin(t, nil)
		res, err := bundle.client.SubmitTx(t.Context(), tx, refundCall("run-1"))
		require.NoError(t, err)
		require.True(t, res.Created)
		require.Equal(t, outbox.StatePending, res.State)
		want, err := outbox.DeriveKey(refundCall("run-1"))
		require.NoError(t, err)
		require.Equal(t, want, res.Key)
		require.NoError(t, h.commit(tx))

		keys, rows := rowCounts(t, bundle.schema)
		require.Equal(t, 1, keys)
		require.Equal(t, 1, rows)

		got, err := bundle.client.Get(t.Context(), res.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State)
		require.False(t, got.Created)
		require.Positive(t, got.RetryAfter)
	})

	t.Run("EverySubmitNotifiesWithoutCooldown", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.provider, outbox.IdempotentByKey))
		client := h.newClient(t, outbox.Config{Schema: bundle.schema, Registry: registry, NotifyCooldown: -1})
		notified := pgoncetest.WorkNotifications(t, bundle.schema, func() {
			for i := range 3 {
				tx := h.begin(t, nil)
				_, err := client.SubmitTx(t.Context(), tx, refundCall(fmt.Sprintf("run-%d", i)))
				require.NoError(t, err)
				require.NoError(t, h.commit(tx))
			}
		})
		require.Equal(t, 3, notified)
	})

	t.Run("NotifyCooldownNotifiesOncePerCooldown", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.provider, outbox.IdempotentByKey))
		client := h.newClient(t, outbox.Config{Schema: bundle.schema, Registry: registry, NotifyCooldown: time.Hour})
		// A key that exists already: its duplicate inserts nothing.
		existing, err := bundle.client.Submit(t.Context(), refundCall("run-existing"))
		require.NoError(t, err)

		notified := pgoncetest.WorkNotifications(t, bundle.schema, func() {
			// The duplicate does not notify, and gives the window back.
			res, err := client.Submit(t.Context(), refundCall("run-existing"))
			require.NoError(t, err)
			require.False(t, res.Created)
			require.Equal(t, existing.Key, res.Key)
			for i := range 3 {
				tx := h.begin(t, nil)
				res, err := client.SubmitTx(t.Context(), tx, refundCall(fmt.Sprintf("run-%d", i)))
				require.NoError(t, err)
				require.True(t, res.Created)
				require.NoError(t, h.commit(tx))
			}
		})
		require.Equal(t, 1, notified, "one notification per cooldown, none for the duplicate")
	})

	t.Run("RollbackLeavesNothingAndResubmitCreates", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		tx := h.begin(t, nil)
		res, err := bundle.client.SubmitTx(t.Context(), tx, refundCall("run-1"))
		require.NoError(t, err)
		require.True(t, res.Created)
		require.NoError(t, h.rollback(tx))

		keys, rows := rowCounts(t, bundle.schema)
		require.Zero(t, keys)
		require.Zero(t, rows)
		_, err = bundle.client.Get(t.Context(), res.Key)
		require.ErrorIs(t, err, outbox.ErrNotFound)

		res, err = bundle.client.Submit(t.Context(), refundCall("run-1"))
		require.NoError(t, err)
		require.True(t, res.Created)
	})

	t.Run("ConcurrentTransactionsCreateOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		const racers = 64
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			created int
			states  = map[outbox.State]int{}
		)
		start := make(chan struct{})
		errs := make(chan error, racers)
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := bundle.client.Submit(context.Background(), refundCall("run-race"))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if res.Created {
					created++
				}
				states[res.State]++
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, 1, created)
		require.Equal(t, racers, states[outbox.StatePending])
		keys, rows := rowCounts(t, bundle.schema)
		require.Equal(t, 1, keys)
		require.Equal(t, 1, rows)
	})

	t.Run("SecondTransactionWaitsForFirstCommit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		first := h.begin(t, nil)
		res, err := bundle.client.SubmitTx(t.Context(), first, refundCall("run-wait"))
		require.NoError(t, err)
		require.True(t, res.Created)

		second := h.begin(t, nil)
		secondPID := h.backendPID(t, second)
		done := make(chan outbox.Result, 1)
		go func() {
			res, err := bundle.client.SubmitTx(context.Background(), second, refundCall("run-wait"))
			if err != nil {
				t.Errorf("second submit: %v", err)
			}
			done <- res
		}()
		awaitLockWait(t, secondPID)
		require.NoError(t, h.commit(first))

		select {
		case res := <-done:
			require.False(t, res.Created)
			require.Equal(t, outbox.StatePending, res.State)
		case <-time.After(30 * time.Second):
			t.Fatal("second submit never returned")
		}
		require.NoError(t, h.commit(second))
	})

	t.Run("SecondTransactionWinsAfterFirstRollsBack", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		first := h.begin(t, nil)
		_, err := bundle.client.SubmitTx(t.Context(), first, refundCall("run-rollback"))
		require.NoError(t, err)

		second := h.begin(t, nil)
		secondPID := h.backendPID(t, second)
		done := make(chan outbox.Result, 1)
		go func() {
			res, err := bundle.client.SubmitTx(context.Background(), second, refundCall("run-rollback"))
			if err != nil {
				t.Errorf("second submit: %v", err)
			}
			done <- res
		}()
		awaitLockWait(t, secondPID)
		require.NoError(t, h.rollback(first))

		select {
		case res := <-done:
			require.True(t, res.Created)
		case <-time.After(30 * time.Second):
			t.Fatal("second submit never returned")
		}
		require.NoError(t, h.commit(second))
		keys, _ := rowCounts(t, bundle.schema)
		require.Equal(t, 1, keys)
	})

	t.Run("SerializableLoserGetsRetryableError", func(t *testing.T) {
		t.Parallel()
		for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
			bundle := setup(t)
			opts := &sql.TxOptions{Isolation: level}
			first := h.begin(t, opts)
			_, err := bundle.client.SubmitTx(t.Context(), first, refundCall("run-ser"))
			require.NoError(t, err)

			second := h.begin(t, opts)
			secondPID := h.backendPID(t, second)
			// Take the snapshot before the first commits.
			_, err = bundle.client.Get(t.Context(), mustKey(t, refundCall("other")))
			require.ErrorIs(t, err, outbox.ErrNotFound)
			errs := make(chan error, 1)
			go func() {
				_, err := bundle.client.SubmitTx(context.Background(), second, refundCall("run-ser"))
				errs <- err
			}()
			awaitLockWait(t, secondPID)
			require.NoError(t, h.commit(first))
			select {
			case err := <-errs:
				require.ErrorIs(t, err, outbox.ErrSerialization, "isolation %s", level)
			case <-time.After(30 * time.Second):
				t.Fatal("second submit never returned")
			}
			require.NoError(t, h.rollback(second))

			// The retry sees the winner's key, and nothing ran twice.
			retry := h.begin(t, opts)
			res, err := bundle.client.SubmitTx(t.Context(), retry, refundCall("run-ser"))
			require.NoError(t, err)
			require.False(t, res.Created)
			require.NoError(t, h.commit(retry))
			keys, rows := rowCounts(t, bundle.schema)
			require.Equal(t, 1, keys)
			require.Equal(t, 1, rows)
		}
	})

	t.Run("ConflictWhenStepAskedWithOtherArgs", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		call := refundCall("run-replan")
		call.Args = map[string]any{"order": 8842, "amount": 42}
		_, err := bundle.client.Submit(t.Context(), call)
		require.NoError(t, err)

		replanned := call
		replanned.Args = map[string]any{"order": 8842, "amount": "42.00"}
		_, err = bundle.client.Submit(t.Context(), replanned)
		require.ErrorIs(t, err, outbox.ErrKeyConflict)
		var conflict *outbox.KeyConflictError
		require.ErrorAs(t, err, &conflict)
		require.NotEqual(t, conflict.Fingerprint, conflict.ExistingFingerprint)
		require.Equal(t, "refund", conflict.ExistingTool)

		otherTool := call
		otherTool.Tool = "email"
		_, err = bundle.client.Submit(t.Context(), otherTool)
		require.ErrorIs(t, err, outbox.ErrKeyConflict)

		keys, rows := rowCounts(t, bundle.schema)
		require.Equal(t, 1, keys)
		require.Equal(t, 1, rows)
	})

	t.Run("ConflictWhenExplicitKeyReused", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		call := outbox.Call{Key: "refund-order-8842", Tool: "refund", Args: map[string]any{"amount": "42.00"}}
		_, err := bundle.client.Submit(t.Context(), call)
		require.NoError(t, err)

		// The same business key from another run is the same action.
		again := call
		again.RunID, again.Step = "another-run", 9
		res, err := bundle.client.Submit(t.Context(), again)
		require.NoError(t, err)
		require.False(t, res.Created)

		otherArgs := call
		otherArgs.Args = map[string]any{"amount": "43.00"}
		_, err = bundle.client.Submit(t.Context(), otherArgs)
		require.ErrorIs(t, err, outbox.ErrKeyConflict)

		otherTool := call
		otherTool.Tool = "email"
		_, err = bundle.client.Submit(t.Context(), otherTool)
		require.ErrorIs(t, err, outbox.ErrKeyConflict)

		keys, _ := rowCounts(t, bundle.schema)
		require.Equal(t, 1, keys)
	})

	t.Run("TenantsNeverShareKeys", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		acme, globex := refundCall("run-1"), refundCall("run-1")
		acme.Tenant, globex.Tenant = "acme", "globex"
		resAcme, err := bundle.client.Submit(t.Context(), acme)
		require.NoError(t, err)
		resGlobex, err := bundle.client.Submit(t.Context(), globex)
		require.NoError(t, err)
		require.True(t, resAcme.Created)
		require.True(t, resGlobex.Created)
		require.NotEqual(t, resAcme.Key, resGlobex.Key)
	})

	t.Run("UnknownToolWritesNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		call := refundCall("run-1")
		call.Tool = "wire_transfer"
		_, err := bundle.client.Submit(t.Context(), call)
		require.ErrorIs(t, err, outbox.ErrUnknownTool)
		_, err = bundle.client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrUnknownTool)
		keys, _ := rowCounts(t, bundle.schema)
		require.Zero(t, keys)
	})

	t.Run("BadArgumentsWriteNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		call := refundCall("run-1")
		call.Args = json.RawMessage(`{"amount": 9007199254740993}`)
		_, err := bundle.client.Submit(t.Context(), call)
		require.ErrorIs(t, err, outbox.ErrNotCanonical)
		call.Args = json.RawMessage(`{"a":1,"a":2}`)
		_, err = bundle.client.Submit(t.Context(), call)
		require.ErrorIs(t, err, outbox.ErrNotCanonical)
		keys, _ := rowCounts(t, bundle.schema)
		require.Zero(t, keys)
	})

	t.Run("GetErrors", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		_, err := bundle.client.Get(t.Context(), mustKey(t, refundCall("never")))
		require.ErrorIs(t, err, outbox.ErrNotFound)
		_, err = bundle.client.Get(t.Context(), "not-a-key")
		require.ErrorIs(t, err, outbox.ErrInvalidKey)
	})

	t.Run("ReplaysStoredResponseByteForByte", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		odd := json.RawMessage("{ \"z\" : 1,\n  \"amount\": 42.00, \"name\": \"\\u00e9t\u00e9\", \"a\":[1 , 2] }")
		provider := &countingProvider{response: odd}
		res, err := bundle.client.Do(t.Context(), refundCall("run-odd"), provider)
		require.NoError(t, err)
		require.True(t, res.Created)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, []byte(odd), []byte(res.Response))

		for range 3 {
			replay, err := bundle.client.Submit(t.Context(), refundCall("run-odd"))
			require.NoError(t, err)
			require.True(t, replay.Replayed())
			require.Equal(t, []byte(odd), []byte(replay.Response))
			again, err := bundle.client.Do(t.Context(), refundCall("run-odd"), provider)
			require.NoError(t, err)
			require.Equal(t, []byte(odd), []byte(again.Response))
		}
		got, err := bundle.client.Get(t.Context(), res.Key)
		require.NoError(t, err)
		require.Equal(t, []byte(odd), []byte(got.Response))
		require.Equal(t, int64(1), provider.calls.Load())

		require.Contains(t, string(got.Observation().JSON()), `"response":`+string(odd))
		marshaled, err := json.Marshal(got.Observation())
		require.NoError(t, err)
		require.JSONEq(t, string(got.Observation().JSON()), string(marshaled))
	})

	t.Run("ConcurrentDosCallProviderOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		provider := &countingProvider{response: json.RawMessage(`{"ok":true}`), hold: make(chan struct{})}
		const racers = 32
		var wg sync.WaitGroup
		var mu sync.Mutex
		var inProgress, succeeded int
		errs := make(chan error, racers)
		losers := make(chan struct{}, racers)
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := bundle.client.Do(context.Background(), refundCall("run-do"), provider)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, outbox.ErrInProgress) && res.State.InProgress():
					inProgress++
					losers <- struct{}{}
				case err != nil:
					errs <- err
				case res.State == outbox.StateSucceeded:
					succeeded++
				}
			}()
		}
		// The winner's provider holds until every loser has returned.
		for range racers - 1 {
			select {
			case <-losers:
			case <-time.After(30 * time.Second):
				t.Fatal("losers never returned")
			}
		}
		close(provider.hold)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int64(1), provider.calls.Load())
		require.Equal(t, racers-1, inProgress)
		require.Equal(t, 1, succeeded)
	})

	t.Run("PermanentFailureIsStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		provider := &countingProvider{err: outbox.Permanent(errors.New("card declined"))}
		res, err := bundle.client.Do(t.Context(), refundCall("run-perm"), provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State)
		require.JSONEq(t, `{"error":"card declined"}`, string(res.Failure))

		again, err := bundle.client.Do(t.Context(), refundCall("run-perm"), provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, again.State)
		require.True(t, again.Replayed())
		require.Equal(t, []byte(res.Failure), []byte(again.Failure))
		submitted, err := bundle.client.Submit(t.Context(), refundCall("run-perm"))
		require.NoError(t, err)
		require.Equal(t, []byte(res.Failure), []byte(submitted.Failure))
		require.Equal(t, int64(1), provider.calls.Load())
	})

	t.Run("RetryableFailureLeavesKeyPending", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		provider := &countingProvider{err: errors.New("503 from upstream")}
		res, err := bundle.client.Do(t.Context(), refundCall("run-retry"), provider)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.Equal(t, outbox.StatePending, res.State)

		got, err := bundle.client.Get(t.Context(), res.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State)
		require.Equal(t, 1, got.Attempts)

		provider.err = nil
		provider.response = json.RawMessage(`{"refund_id":"re_2"}`)
		res, err = bundle.client.Do(t.Context(), refundCall("run-retry"), provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, 2, res.Attempts)
		require.Equal(t, int64(2), provider.calls.Load())
	})

	t.Run("PanicIsAnUncertainOutcome", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		// The provider acts, then panics: whether it acted is unknown.
		var calls atomic.Int64
		panicking := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			calls.Add(1)
			panic("nil map write")
		})
		res, err := bundle.client.Do(t.Context(), refundCall("run-panic"), panicking)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.ErrorContains(t, err, "nil map write")
		require.True(t, outbox.IsAmbiguous(err), "a panic is an uncertain outcome")
		require.Equal(t, outbox.StatePending, res.State, "idempotent by key: retried with the same key")

		call := refundCall("run-panic-email")
		call.Tool = "email"
		res, err = bundle.client.Do(t.Context(), call, panicking)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, res.State, "at most once: never called again")
		require.Contains(t, res.LastError, "nil map write")
		again, err := bundle.client.Do(t.Context(), call, panicking)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, again.State)
		require.Equal(t, int64(2), calls.Load())
	})

	t.Run("AmbiguousAtMostOnceNeedsReview", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		provider := &countingProvider{err: outbox.Ambiguous(errors.New("connection reset after send"))}
		call := refundCall("run-email")
		call.Tool = "email"
		res, err := bundle.client.Do(t.Context(), call, provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, res.State)
		require.Contains(t, res.LastError, "connection reset after send")

		again, err := bundle.client.Do(t.Context(), call, provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, again.State)
		require.Equal(t, int64(1), provider.calls.Load())
	})

	t.Run("WaitWokenByCompletion", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		res, err := bundle.client.Submit(t.Context(), refundCall("run-waited"))
		require.NoError(t, err)

		waited := make(chan outbox.Result, 1)
		go func() {
			res, err := bundle.client.Wait(context.Background(), res.Key)
			if err != nil {
				t.Errorf("wait: %v", err)
			}
			waited <- res
		}()
		// Another client on another connection completes the key.
		other := h.newClient(t, bundle.client.Config())
		done, err := other.Do(t.Context(), refundCall("run-waited"), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)

		select {
		case got := <-waited:
			require.Equal(t, outbox.StateSucceeded, got.State)
			require.Equal(t, []byte(done.Response), []byte(got.Response))
		case <-time.After(30 * time.Second):
			t.Fatal("wait never returned")
		}
	})

	t.Run("WaitReturnsLastStateOnCancel", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		deadlines := newReadDeadlines(bundle.client)
		res, err := bundle.client.Submit(t.Context(), refundCall("run-cancel"))
		require.NoError(t, err)
		// The deadline passes once the wait has read the key, however long
		// that takes.
		got, err := bundle.client.Wait(deadlines.after(t.Context(), res.Key), res.Key)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, outbox.StatePending, got.State)

		_, err = bundle.client.Wait(t.Context(), mustKey(t, refundCall("never")))
		require.ErrorIs(t, err, outbox.ErrNotFound)
	})

	t.Run("ExpiredKeyIsRefused", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		call := refundCall("run-old")
		key := mustKey(t, call)
		completed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		// A tombstone as retention leaves it: the key's row, state expired,
		// without response or arguments.
		_, err := bundle.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		calls := bundle.provider.calls.Load()
		_, err = pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(bundle.schema),
			pgoncetest.StoredKey(t, string(key)), completed)
		require.NoError(t, err)

		_, err = bundle.client.Submit(t.Context(), call)
		require.ErrorIs(t, err, outbox.ErrExpired)
		var expired *outbox.ExpiredError
		require.ErrorAs(t, err, &expired)
		require.True(t, completed.Equal(expired.CompletedAt))

		_, err = bundle.client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrExpired)
		got, err := bundle.client.Get(t.Context(), key)
		require.ErrorIs(t, err, outbox.ErrExpired)
		require.Equal(t, outbox.StateExpired, got.State)
		require.Equal(t, outbox.ObservationExpired, got.Observation().Status)
		require.Equal(t, calls, bundle.provider.calls.Load())

		// Another action asked at the expired step is refused too.
		replanned := call
		replanned.Args = map[string]any{"order": 1}
		_, err = bundle.client.Submit(t.Context(), replanned)
		require.ErrorIs(t, err, outbox.ErrExpired)
	})
}

func mustKey(t *testing.T, call outbox.Call) outbox.Key {
	t.Helper()
	key, err := outbox.DeriveKey(call)
	require.NoError(t, err)
	return key
}

// awaitLockWait waits until the backend pid, that of the second of two
// racing transactions, is blocked by another backend: on the unique index,
// behind the first. Only that backend counts, so the lock waits of tests
// running beside it satisfy nothing.
func awaitLockWait(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var blocked bool
		err := pgoncetest.Pool(t).QueryRow(context.Background(),
			`SELECT cardinality(pg_blocking_pids($1)) > 0`, pid).Scan(&blocked)
		return err == nil && blocked
	}, 30*time.Second, 5*time.Millisecond, "backend %d never waited on a lock", pid)
}

func TestDoLookupByNaturalID(t *testing.T) {
	t.Parallel()

	t.Run("LooksUpBeforeRetryingAnAmbiguousAttempt", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		provider := &lookupProvider{}
		provider.err = outbox.Ambiguous(errors.New("timeout after send"))
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("provision", provider, outbox.LookupByNaturalID))
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry})
		require.NoError(t, err)

		call := outbox.Call{RunID: "run-1", Step: 1, Tool: "provision", NaturalID: "vm-42", Args: map[string]any{"size": "m"}}
		res, err := client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.Equal(t, outbox.StatePending, res.State)

		// The first attempt did act: the lookup finds it, and no second
		// call is made.
		provider.found = json.RawMessage(`{"vm":"vm-42","state":"running"}`)
		res, err = client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.JSONEq(t, `{"vm":"vm-42","state":"running"}`, string(res.Response))
		require.Equal(t, int64(1), provider.calls.Load())
		require.Equal(t, int64(1), provider.lookups.Load())
	})

	t.Run("RegisterRefusesProviderWithoutLookup", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		err := registry.Register("provision", &countingProvider{}, outbox.LookupByNaturalID)
		require.ErrorIs(t, err, outbox.ErrInvalidRegistration)
		require.Nil(t, registry.Lookup("provision"))
		require.ErrorIs(t, registry.Register("Bad Name", &countingProvider{}, outbox.IdempotentByKey), outbox.ErrInvalidRegistration)
		require.ErrorIs(t, registry.Register("refund", nil, outbox.IdempotentByKey), outbox.ErrInvalidRegistration)
		require.NoError(t, registry.Register("refund", &countingProvider{}, outbox.IdempotentByKey))
		require.ErrorIs(t, registry.Register("refund", &countingProvider{}, outbox.IdempotentByKey), outbox.ErrInvalidRegistration)
	})
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name   string
		config outbox.Config
		want   error
	}{
		{"HostileSchema", outbox.Config{Schema: `x"; DROP TABLE users; --`}, outbox.ErrInvalidSchema},
		{"LeaseNotLongerThanCallTimeout", outbox.Config{CallTimeout: time.Minute, Lease: time.Minute}, outbox.ErrInvalidConfig},
		{"NegativeRetention", outbox.Config{Retention: -time.Hour}, outbox.ErrInvalidConfig},
		{"TombstonesShorterThanRetention", outbox.Config{Retention: 48 * time.Hour, TombstoneRetention: 24 * time.Hour}, outbox.ErrInvalidConfig},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := outbox.NewPgx(pgoncetest.Pool(t), tt.config)
			require.ErrorIs(t, err, tt.want)
			_, err = outbox.New(pgoncetest.DB(t), tt.config)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func TestObservationShapes(t *testing.T) {
	t.Parallel()

	key := outbox.Key("k1_" + strings.Repeat("ab", 32))
	for _, tt := range []struct {
		name   string
		result outbox.Result
		want   string
	}{
		{
			"InProgress",
			outbox.Result{Key: key, State: outbox.StateInFlight, RetryAfter: 250 * time.Millisecond},
			`{"status":"in_progress","key":"` + string(key) + `","retry_after_ms":250,"message":"the action is in progress; ask again later with the same arguments, never with new ones"}`,
		},
		{
			"Failed",
			outbox.Result{Key: key, State: outbox.StateFailed, Failure: json.RawMessage(`{"error":"declined"}`)},
			`{"status":"failed","key":"` + string(key) + `","replayed":true,"failure":{"error":"declined"}}`,
		},
		{
			"NeedsReview",
			outbox.Result{Key: key, State: outbox.StateNeedsReview},
			`{"status":"needs_review","key":"` + string(key) + `","message":"the outcome of this action is unknown and waits for an operator; do not retry it"}`,
		},
		{
			"SucceededFirstTime",
			outbox.Result{Key: key, State: outbox.StateSucceeded, Created: true, Response: json.RawMessage(`{"id": 1}`)},
			`{"status":"succeeded","key":"` + string(key) + `","response":{"id": 1}}`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, string(tt.result.Observation().JSON()))
		})
	}
}
