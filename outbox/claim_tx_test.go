package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

func TestClaimTxCompleteTx(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testClaimTxCompleteTx, testClaimTxCompleteTx)
}

func testClaimTxCompleteTx[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	setup := func(t *testing.T) *outbox.Client[TTx] {
		t.Helper()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("http_request", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, errors.New("never dispatched")
		}), outbox.AtMostOnce))
		return driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry})
	}
	call := outbox.Call{Tenant: "acct_1", Tool: "http_request", Key: "k-1", Args: map[string]any{"path": "/refunds"}}

	t.Run("ClaimAndCompleteCommitTogether", func(t *testing.T) {
		t.Parallel()
		client := setup(t)
		require.NoError(t, driver.InTx(t, t.Context(), func(tx TTx) error {
			claimed, err := client.ClaimTx(t.Context(), tx, call)
			require.NoError(t, err)
			require.True(t, claimed.Created)
			require.Equal(t, outbox.StateInFlight, claimed.State)
			done, err := client.CompleteTx(t.Context(), tx, claimed, json.RawMessage(`{"status":201}`))
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, done.State)
			return nil
		}))
		res, err := client.Submit(t.Context(), call)
		require.NoError(t, err)
		require.False(t, res.Created)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, `{"status":201}`, string(res.Response))
	})

	t.Run("RolledBackLeavesNothing", func(t *testing.T) {
		t.Parallel()
		client := setup(t)
		rollback := errors.New("rollback")
		err := driver.InTx(t, t.Context(), func(tx TTx) error {
			claimed, err := client.ClaimTx(t.Context(), tx, call)
			require.NoError(t, err)
			_, err = client.CompleteTx(t.Context(), tx, claimed, json.RawMessage(`{}`))
			require.NoError(t, err)
			return rollback
		})
		require.ErrorIs(t, err, rollback)
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		_, err = client.Get(t.Context(), key)
		require.ErrorIs(t, err, outbox.ErrNotFound)
	})

	t.Run("CompleteTxRefusesWhatItDidNotClaim", func(t *testing.T) {
		t.Parallel()
		client := setup(t)
		res, err := client.Submit(t.Context(), call)
		require.NoError(t, err)
		require.NoError(t, driver.InTx(t, t.Context(), func(tx TTx) error {
			// A pending key submitted elsewhere is in progress, not ours.
			again, err := client.ClaimTx(t.Context(), tx, call)
			require.ErrorIs(t, err, outbox.ErrInProgress)
			_, err = client.CompleteTx(t.Context(), tx, again, json.RawMessage(`{}`))
			require.ErrorIs(t, err, outbox.ErrNotClaimed)
			// A forged Result naming the key does not pass the fence.
			forged := res
			forged.Created, forged.State, forged.Attempts = true, outbox.StateInFlight, 1
			_, err = client.CompleteTx(t.Context(), tx, forged, json.RawMessage(`{}`))
			require.ErrorIs(t, err, outbox.ErrNotClaimed)
			return nil
		}))
		got, err := client.Get(t.Context(), res.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State, "nothing changed")
	})

	t.Run("BadInputChangesNothing", func(t *testing.T) {
		t.Parallel()
		client := setup(t)
		var nilTx TTx
		_, err := client.ClaimTx(t.Context(), nilTx, call)
		require.ErrorIs(t, err, outbox.ErrInvalidTx)
		_, err = client.CompleteTx(t.Context(), nilTx, outbox.Result{}, nil)
		require.ErrorIs(t, err, outbox.ErrInvalidTx)
		require.NoError(t, driver.InTx(t, t.Context(), func(tx TTx) error {
			scheduled := call
			scheduled.Delay = 1
			_, err := client.ClaimTx(t.Context(), tx, scheduled)
			require.ErrorIs(t, err, outbox.ErrInvalidCall)
			return nil
		}))
	})
}
