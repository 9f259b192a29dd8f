package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestObservationReplayed proves the rule of replayed: of all the requests
// that derive one key, the one that created it gets its outcome without
// replayed, whether it ran the action or waited for it, and every other one
// gets replayed, in any process.
func TestObservationReplayed(t *testing.T) {
	t.Parallel()
	eachHarness(t, testObservationReplayed[pgx.Tx], testObservationReplayed[*sql.Tx])
}

func testObservationReplayed[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		// client submits and waits, as the service that takes the request.
		client *outbox.Client[TTx]
		// other is another process: it runs the action, or asks again.
		other *outbox.Client[TTx]
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund",
			&countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("charge",
			&countingProvider{err: outbox.Permanent(errors.New("card declined"))}, outbox.IdempotentByKey))
		config := outbox.Config{Schema: schema, Registry: registry}
		return &testBundle{client: h.newClient(t, config), other: h.newClient(t, config)}
	}
	call := func(tool, runID string) outbox.Call {
		c := refundCall(runID)
		c.Tool = tool
		return c
	}
	submitTx := func(t *testing.T, client *outbox.Client[TTx], c outbox.Call) outbox.Result {
		t.Helper()
		tx := h.begin(t, nil)
		res, err := client.SubmitTx(t.Context(), tx, c)
		require.NoError(t, err)
		require.NoError(t, h.commit(tx))
		return res
	}
	// waitInBackground starts waitFunc and returns what it returns once it
	// does.
	waitInBackground := func(waitFunc func(ctx context.Context) (outbox.Result, error)) func(t *testing.T) outbox.Result {
		type answer struct {
			res outbox.Result
			err error
		}
		answers := make(chan answer, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := waitFunc(ctx)
			answers <- answer{res, err}
		}()
		return func(t *testing.T) outbox.Result {
			t.Helper()
			got := <-answers
			require.NoError(t, got.err)
			return got.res
		}
	}
	requireReplayed := func(t *testing.T, res outbox.Result, replayed bool) {
		t.Helper()
		require.Equal(t, replayed, res.Replayed(), "Replayed of %+v", res)
		var doc map[string]any
		require.NoError(t, json.Unmarshal(res.Observation().JSON(), &doc))
		if replayed {
			require.Equal(t, true, doc["replayed"])
		} else {
			require.NotContains(t, doc, "replayed")
		}
	}

	for _, tt := range []struct {
		name  string
		tool  string
		state outbox.State
	}{
		{"Succeeded", "refund", outbox.StateSucceeded},
		{"Failed", "charge", outbox.StateFailed},
	} {
		t.Run("SubmitterThatWaitsIsNoReplay"+tt.name, func(t *testing.T) {
			t.Parallel()
			bundle := setup(t)

			res := submitTx(t, bundle.client, call(tt.tool, "run-waits"))
			require.True(t, res.Created)
			waited := waitInBackground(func(ctx context.Context) (outbox.Result, error) {
				return bundle.client.WaitResult(ctx, res)
			})
			// Another process runs the action: a duplicate's Do that took
			// the pending key, so its answer is a replay.
			ran, err := bundle.other.Do(t.Context(), call(tt.tool, "run-waits"), nil)
			require.NoError(t, err)
			require.Equal(t, tt.state, ran.State)
			requireReplayed(t, ran, true)

			got := waited(t)
			require.Equal(t, tt.state, got.State)
			require.True(t, got.Created)
			requireReplayed(t, got, false)

			// Wait knows the key alone: its answer reads as a replay.
			byKey, err := bundle.client.Wait(t.Context(), res.Key)
			require.NoError(t, err)
			require.False(t, byKey.Created)
			requireReplayed(t, byKey, true)
		})

		t.Run("DuplicateThatWaitsIsReplay"+tt.name, func(t *testing.T) {
			t.Parallel()
			bundle := setup(t)

			first := submitTx(t, bundle.client, call(tt.tool, "run-dup"))
			require.True(t, first.Created)
			dup, err := bundle.other.Submit(t.Context(), call(tt.tool, "run-dup"))
			require.NoError(t, err)
			require.False(t, dup.Created)
			waited := waitInBackground(func(ctx context.Context) (outbox.Result, error) {
				return bundle.other.WaitResult(ctx, dup)
			})
			_, err = bundle.client.Do(t.Context(), call(tt.tool, "run-dup"), nil)
			require.NoError(t, err)

			got := waited(t)
			require.Equal(t, tt.state, got.State)
			requireReplayed(t, got, true)
			again, err := bundle.client.WaitResult(t.Context(), first)
			require.NoError(t, err)
			requireReplayed(t, again, false)
		})
	}

	t.Run("ResultHandedToAnotherProcess", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		res := submitTx(t, bundle.client, call("refund", "run-handed"))
		// The submitter hands its Result to a worker elsewhere, as JSON.
		handed, err := json.Marshal(res)
		require.NoError(t, err)
		var received outbox.Result
		require.NoError(t, json.Unmarshal(handed, &received))

		_, err = bundle.client.Do(t.Context(), call("refund", "run-handed"), nil)
		require.NoError(t, err)
		got, err := bundle.other.WaitResult(t.Context(), received)
		require.NoError(t, err)
		require.True(t, got.Created)
		requireReplayed(t, got, false)
	})

	t.Run("RolledBackClaimIsNotTheCreator", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		tx := h.begin(t, nil)
		rolledBack, err := bundle.client.SubmitTx(t.Context(), tx, call("refund", "run-rollback"))
		require.NoError(t, err)
		require.True(t, rolledBack.Created)
		require.NoError(t, h.rollback(tx))

		// Another request claims the key for real and runs it.
		created, err := bundle.other.Do(t.Context(), call("refund", "run-rollback"), nil)
		require.NoError(t, err)
		require.True(t, created.Created)
		requireReplayed(t, created, false)

		// The Result of the rolled-back claim no longer names the creator.
		got, err := bundle.client.WaitResult(t.Context(), rolledBack)
		require.NoError(t, err)
		require.False(t, got.Created)
		requireReplayed(t, got, true)
	})

	t.Run("ExactlyOneRequestIsNoReplay", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)

		const submitters = 12
		var (
			mu      sync.Mutex
			answers []outbox.Result
			wg      sync.WaitGroup
		)
		record := func(res outbox.Result, err error) {
			if err != nil {
				t.Errorf("ask: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			answers = append(answers, res)
		}
		start := make(chan struct{})
		for i := range submitters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				client := bundle.client
				if i%2 == 1 {
					client = bundle.other
				}
				res, err := client.Submit(ctx, call("refund", "run-race"))
				if err == nil {
					res, err = client.WaitResult(ctx, res)
				}
				record(res, err)
			}()
		}
		// One Do among them runs the action, whoever created the key.
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			record(bundle.other.Do(context.Background(), call("refund", "run-race"), nil))
		}()
		close(start)
		wg.Wait()

		require.Len(t, answers, submitters+1)
		own := 0
		for _, res := range answers {
			require.Equal(t, outbox.StateSucceeded, res.State)
			if !res.Replayed() {
				own++
			}
		}
		require.Equal(t, 1, own, "exactly one request created the key and sees its outcome as its own")
	})
}
