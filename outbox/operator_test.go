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
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// recordingProvider records every request it receives, and answers with
// err when set, {} otherwise. hold, when not nil, blocks calls until
// closed; started is closed at the first call.
type recordingProvider struct {
	mu       sync.Mutex
	requests []outbox.Request
	err      error
	hold     chan struct{}
	started  chan struct{}
	once     sync.Once
}

func (p *recordingProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	p.mu.Lock()
	p.requests = append(p.requests, req)
	err := p.err
	p.mu.Unlock()
	if p.started != nil {
		p.once.Do(func() { close(p.started) })
	}
	if p.hold != nil {
		select {
		case <-p.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	return json.RawMessage(`{}`), nil
}

func (p *recordingProvider) calls(key outbox.Key) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, req := range p.requests {
		if req.Key == key {
			n++
		}
	}
	return n
}

type opsBundle[TTx any] struct {
	client   *outbox.Client[TTx]
	provider *recordingProvider
	schema   string
	driver   drivertest.Driver[TTx]
}

func opsSetup[TTx any](t *testing.T, driver drivertest.Driver[TTx]) *opsBundle[TTx] {
	t.Helper()
	schema := pgoncetest.Schema(t)
	provider := &recordingProvider{}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
	return &opsBundle[TTx]{
		client:   driver.Client(t, outbox.Config{Schema: schema, Registry: registry}),
		provider: provider,
		schema:   schema,
		driver:   driver,
	}
}

func opsCall(step int64) outbox.Call {
	return outbox.Call{RunID: "run-ops", Step: step, Tool: "refund", Args: map[string]any{"order": step}}
}

var (
	cancelBy    = outbox.CancelParams{By: "alice", Reason: "customer withdrew"}
	retryBy     = outbox.RetryParams{By: "bob", Reason: "card updated"}
	waitTimeout = 30 * time.Second
)

func TestCancel(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testCancel[pgx.Tx], testCancel[*sql.Tx])
}

func testCancel[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("CancelsPendingKeyAndDuplicatesReplayIt", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		submitted, err := b.client.Submit(ctx, call)
		require.NoError(t, err)

		res, err := b.client.Cancel(ctx, submitted.Key, cancelBy)
		require.NoError(t, err)
		require.Equal(t, outbox.StateCancelled, res.State)
		require.False(t, res.CompletedAt.IsZero())

		dup, err := b.client.Submit(ctx, call)
		require.NoError(t, err)
		require.False(t, dup.Created)
		require.Equal(t, outbox.StateCancelled, dup.State)
		obs := dup.Observation()
		require.Equal(t, outbox.ObservationCancelled, obs.Status)
		require.NotEmpty(t, obs.Message)

		done, err := b.client.Do(ctx, call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateCancelled, done.State)
		require.Zero(t, b.provider.calls(submitted.Key), "a cancelled key never runs")

		waited, err := b.client.Wait(ctx, submitted.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateCancelled, waited.State)

		inspection, err := b.client.Inspect(ctx, submitted.Key)
		require.NoError(t, err)
		require.Len(t, inspection.Resolutions, 1)
		require.Equal(t, outbox.ResolveCancel, inspection.Resolutions[0].Action)
		require.Equal(t, "alice", inspection.Resolutions[0].By)
		require.Equal(t, "customer withdrew", inspection.Resolutions[0].Reason)
	})

	t.Run("RefusesInFlightKey", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		b.provider.hold, b.provider.started = make(chan struct{}), make(chan struct{})
		call := opsCall(1)
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		done := make(chan outbox.Result, 1)
		go func() {
			res, _ := b.client.Do(context.WithoutCancel(ctx), call, nil)
			done <- res
		}()
		select {
		case <-b.provider.started:
		case <-time.After(waitTimeout):
			t.Fatal("the provider was never called")
		}

		res, err := b.client.Cancel(ctx, key, cancelBy)
		require.ErrorIs(t, err, outbox.ErrNotCancellable)
		var stateErr *outbox.KeyStateError
		require.ErrorAs(t, err, &stateErr)
		require.Equal(t, outbox.StateInFlight, stateErr.State)
		require.Equal(t, outbox.StateInFlight, res.State)

		close(b.provider.hold)
		require.Equal(t, outbox.StateSucceeded, (<-done).State, "the attempt finishes as if no cancel was asked")
		inspection, err := b.client.Inspect(ctx, key)
		require.NoError(t, err)
		require.Empty(t, inspection.Resolutions, "a refused cancel records nothing")
	})

	t.Run("RefusesFinishedKeysAndBadParams", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		finished, err := b.client.Do(ctx, opsCall(1), nil)
		require.NoError(t, err)
		_, err = b.client.Cancel(ctx, finished.Key, cancelBy)
		require.ErrorIs(t, err, outbox.ErrNotCancellable)

		pending, err := b.client.Submit(ctx, opsCall(2))
		require.NoError(t, err)
		for _, params := range []outbox.CancelParams{
			{Reason: "no one"},
			{By: "alice"},
			{By: "alice", Reason: strings.Repeat("x", 2001)},
			{By: "al\x00ice", Reason: "nul"},
			{By: "alice", Reason: "\xff"},
		} {
			_, err := b.client.Cancel(ctx, pending.Key, params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams)
		}
		got, err := b.client.Get(ctx, pending.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State, "bad params change nothing")

		unknown, err := outbox.DeriveKey(opsCall(99))
		require.NoError(t, err)
		_, err = b.client.Cancel(ctx, unknown, cancelBy)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		_, err = b.client.Cancel(ctx, "k1_nope", cancelBy)
		require.ErrorIs(t, err, outbox.ErrInvalidKey)
	})

	t.Run("RacesClaimsWithoutEverTouchingAnAttempt", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		const keys = 40
		calls := make([]outbox.Call, keys)
		for i := range calls {
			calls[i] = opsCall(int64(i + 1))
		}
		submitted := b.driver.SubmitKeys(t, b.client, calls)
		var cancelled sync.Map
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, key := range submitted {
			wg.Go(func() {
				<-start
				_, err := b.client.Do(ctx, calls[i], nil)
				if err != nil && !errors.Is(err, outbox.ErrInProgress) {
					t.Errorf("do %s: %v", key, err)
				}
			})
			wg.Go(func() {
				<-start
				_, err := b.client.Cancel(ctx, key, cancelBy)
				switch {
				case err == nil:
					cancelled.Store(key, true)
				case !errors.Is(err, outbox.ErrNotCancellable):
					t.Errorf("cancel %s: %v", key, err)
				}
			})
		}
		close(start)
		wg.Wait()
		won := 0
		for _, key := range submitted {
			res, err := b.client.Get(ctx, key)
			require.NoError(t, err)
			if _, ok := cancelled.Load(key); ok {
				won++
				require.Equal(t, outbox.StateCancelled, res.State)
				require.Zero(t, b.provider.calls(key), "a cancelled key's provider never runs")
				continue
			}
			require.Equal(t, outbox.StateSucceeded, res.State, "a refused cancel left the attempt alone")
			require.Equal(t, 1, b.provider.calls(key))
		}
		t.Logf("cancels won %d of %d races", won, keys)
	})
}

func TestRetry(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRetry[pgx.Tx], testRetry[*sql.Tx])
}

func testRetry[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("RetriesFailedKeyUnderNewAttempt", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		b.provider.err = outbox.Permanent(errors.New("card declined"))
		failed, err := b.client.Do(ctx, call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, failed.State)

		b.provider.mu.Lock()
		b.provider.err = nil
		b.provider.mu.Unlock()
		res, err := b.client.Retry(ctx, failed.Key, retryBy)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)
		require.Nil(t, res.Failure)

		done, err := b.client.Do(ctx, call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		require.Equal(t, failed.Attempts+1, done.Attempts, "the retry runs under a new attempt")
		require.Equal(t, 2, b.provider.calls(failed.Key))

		inspection, err := b.client.Inspect(ctx, failed.Key)
		require.NoError(t, err)
		require.Len(t, inspection.Resolutions, 1)
		require.Equal(t, outbox.ResolveRetry, inspection.Resolutions[0].Action)
		require.Equal(t, "bob", inspection.Resolutions[0].By)
	})

	t.Run("RetriesCancelledKey", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		submitted, err := b.client.Submit(ctx, call)
		require.NoError(t, err)
		_, err = b.client.Cancel(ctx, submitted.Key, cancelBy)
		require.NoError(t, err)
		_, err = b.client.Retry(ctx, submitted.Key, retryBy)
		require.NoError(t, err)
		done, err := b.client.Do(ctx, call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		inspection, err := b.client.Inspect(ctx, submitted.Key)
		require.NoError(t, err)
		require.Len(t, inspection.Resolutions, 2)
		require.Equal(t, outbox.ResolveCancel, inspection.Resolutions[0].Action)
		require.Equal(t, outbox.ResolveRetry, inspection.Resolutions[1].Action)
	})

	t.Run("RefusesOtherStates", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		succeeded, err := b.client.Do(ctx, opsCall(1), nil)
		require.NoError(t, err)
		pending, err := b.client.Submit(ctx, opsCall(2))
		require.NoError(t, err)
		for _, key := range []outbox.Key{succeeded.Key, pending.Key} {
			before, err := b.client.Get(ctx, key)
			require.NoError(t, err)
			_, err = b.client.Retry(ctx, key, retryBy)
			require.ErrorIs(t, err, outbox.ErrNotRetryable)
			after, err := b.client.Get(ctx, key)
			require.NoError(t, err)
			require.Equal(t, before, after, "a refused retry changes nothing")
		}
		_, err = b.client.Retry(ctx, succeeded.Key, outbox.RetryParams{By: "bob"})
		require.ErrorIs(t, err, outbox.ErrInvalidParams)
	})

	t.Run("RefusesInFlightKey", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		b.provider.hold, b.provider.started = make(chan struct{}), make(chan struct{})
		call := opsCall(1)
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = b.client.Do(context.WithoutCancel(ctx), call, nil)
		}()
		select {
		case <-b.provider.started:
		case <-time.After(waitTimeout):
			t.Fatal("the provider was never called")
		}
		_, err = b.client.Retry(ctx, key, retryBy)
		require.ErrorIs(t, err, outbox.ErrNotRetryable)
		close(b.provider.hold)
		<-done
		require.Equal(t, 1, b.provider.calls(key))
	})

	t.Run("ConcurrentRetriesRequeueOnce", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		b.provider.err = outbox.Permanent(errors.New("card declined"))
		failed, err := b.client.Do(ctx, opsCall(1), nil)
		require.NoError(t, err)
		var won, refused atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				_, err := b.client.Retry(ctx, failed.Key, retryBy)
				switch {
				case err == nil:
					won.Add(1)
				case errors.Is(err, outbox.ErrNotRetryable):
					refused.Add(1)
				default:
					t.Errorf("retry: %v", err)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, won.Load())
		require.EqualValues(t, 15, refused.Load())
		inspection, err := b.client.Inspect(ctx, failed.Key)
		require.NoError(t, err)
		require.Len(t, inspection.Resolutions, 1)
	})
}

func TestSchedule(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testSchedule[pgx.Tx], testSchedule[*sql.Tx])
}

func testSchedule[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("DelayedKeyIsNotClaimedBeforeItsTime", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		call.Delay = time.Hour
		res, err := b.client.Submit(ctx, call)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)
		require.Greater(t, res.RetryAfter, 59*time.Minute, "the hint says when the key is due")

		unscheduled := opsCall(1)
		_, err = b.client.Do(ctx, unscheduled, nil)
		require.ErrorIs(t, err, outbox.ErrInProgress, "Do never claims a key before its not-before time")
		require.Zero(t, b.provider.calls(res.Key))
	})

	t.Run("DoOfScheduledCallSubmitsIt", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		call.NotBefore = time.Now().Add(time.Hour)
		res, err := b.client.Do(ctx, call, nil)
		require.ErrorIs(t, err, outbox.ErrInProgress)
		require.Equal(t, outbox.StatePending, res.State)
		require.True(t, res.Created)
		require.Greater(t, res.RetryAfter, 59*time.Minute)
		require.Zero(t, b.provider.calls(res.Key))
	})

	t.Run("PastNotBeforeRunsNow", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		call := opsCall(1)
		call.NotBefore = time.Now().Add(-time.Hour)
		res, err := b.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
	})

	t.Run("ScheduleNeverChangesTheKey", func(t *testing.T) {
		t.Parallel()
		call := opsCall(1)
		plain, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		call.Delay, call.Metadata = time.Minute, map[string]string{"trace": "abc"}
		scheduled, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		require.Equal(t, plain, scheduled)
	})

	t.Run("BadScheduleWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		negative := opsCall(1)
		negative.Delay = -time.Second
		both := opsCall(1)
		both.Delay, both.NotBefore = time.Second, time.Now()
		for _, call := range []outbox.Call{negative, both} {
			_, err := b.client.Submit(ctx, call)
			require.ErrorIs(t, err, outbox.ErrInvalidCall)
			var invalid *outbox.InvalidCallError
			require.ErrorAs(t, err, &invalid)
			require.Equal(t, "Delay", invalid.Field)
		}
		keys, _ := rowCounts(t, b.schema)
		require.Zero(t, keys)
	})
}

func TestMetadata(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testMetadata[pgx.Tx], testMetadata[*sql.Tx])
}

func testMetadata[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("ReachesProviderAndInspectButNeverTheKey", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		call.Metadata = map[string]string{"traceparent": "00-abc-def-01", "asked_by": "user-7"}
		plain := opsCall(1)
		plainKey, err := outbox.DeriveKey(plain)
		require.NoError(t, err)

		res, err := b.client.Do(ctx, call, nil)
		require.NoError(t, err)
		require.Equal(t, plainKey, res.Key, "metadata is not hashed")
		b.provider.mu.Lock()
		require.Equal(t, call.Metadata, b.provider.requests[0].Metadata)
		b.provider.mu.Unlock()

		other := opsCall(1)
		other.Metadata = map[string]string{"traceparent": "00-other-01"}
		dup, err := b.client.Submit(ctx, other)
		require.NoError(t, err, "other metadata is the same action, not a conflict")
		require.False(t, dup.Created)
		require.Equal(t, res.Key, dup.Key)

		inspection, err := b.client.Inspect(ctx, res.Key)
		require.NoError(t, err)
		require.Equal(t, call.Metadata, inspection.Metadata, "the first submit's metadata is kept")
	})

	t.Run("DispatchedCallsCarryStoredMetadata", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		call := opsCall(1)
		call.Metadata = map[string]string{"request_id": "r-1"}
		submitted, err := b.client.Submit(ctx, call)
		require.NoError(t, err)
		_, err = b.client.Do(ctx, opsCall(1), nil)
		require.NoError(t, err)
		b.provider.mu.Lock()
		defer b.provider.mu.Unlock()
		require.Len(t, b.provider.requests, 1)
		require.Equal(t, submitted.Key, b.provider.requests[0].Key)
		require.Equal(t, call.Metadata, b.provider.requests[0].Metadata, "the provider gets what the key stored")
	})

	t.Run("AbsentMetadataIsNull", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		withEmpty := opsCall(2)
		withEmpty.Metadata = map[string]string{}
		for _, call := range []outbox.Call{opsCall(1), withEmpty} {
			_, err := b.client.Submit(ctx, call)
			require.NoError(t, err)
		}
		var stored int
		require.NoError(t, pgoncetest.Pool(t).QueryRow(ctx,
			`SELECT count(*) FROM "`+b.schema+`".pgonce_key WHERE metadata IS NOT NULL`).Scan(&stored))
		require.Zero(t, stored)
	})

	t.Run("BoundedAndValidated", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		many := map[string]string{}
		for i := range outbox.MetadataMaxEntries + 1 {
			many[fmt.Sprint(i)] = "v"
		}
		for name, metadata := range map[string]map[string]string{
			"TooMany":   many,
			"TooLarge":  {"blob": strings.Repeat("x", outbox.MetadataMaxBytes)},
			"EmptyName": {"": "v"},
			"NulValue":  {"a": "b\x00"},
			"BadUTF8":   {"a": "\xff"},
		} {
			call := opsCall(1)
			call.Metadata = metadata
			_, err := b.client.Submit(ctx, call)
			require.ErrorIs(t, err, outbox.ErrInvalidCall, name)
		}
		keys, _ := rowCounts(t, b.schema)
		require.Zero(t, keys, "bad metadata writes nothing")
	})
}
