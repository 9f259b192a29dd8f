package dispatcher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// metadataRecorder records the metadata of every request, by key.
type metadataRecorder struct {
	mu       sync.Mutex
	metadata map[outbox.Key][]map[string]string
}

func (m *metadataRecorder) Call(_ context.Context, req outbox.Request) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.metadata[req.Key] = append(m.metadata[req.Key], req.Metadata)
	return json.RawMessage(`{}`), nil
}

func (m *metadataRecorder) calls(key outbox.Key) []map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.metadata[key]
}

func TestScheduleAndMetadata(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testScheduleAndMetadata[pgx.Tx], testScheduleAndMetadata[*sql.Tx])
}

func testScheduleAndMetadata[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	setupRecorder := func(t *testing.T) (*testBundle[TTx], *outbox.Client[TTx], *metadataRecorder) {
		t.Helper()
		bundle := setup(t, driver)
		recorder := &metadataRecorder{metadata: map[outbox.Key][]map[string]string{}}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", recorder, outbox.IdempotentByKey))
		return bundle, bundle.clientWith(t, registry), recorder
	}

	t.Run("ClaimsAScheduledKeyOnlyOnceDue", func(t *testing.T) {
		t.Parallel()
		_, client, recorder := setupRecorder(t)
		ctx := t.Context()
		later := call("refund", 1)
		later.Delay = time.Hour
		soon := call("refund", 2)
		soon.Delay = 300 * time.Millisecond
		now := call("refund", 3)
		var keys []outbox.Key
		for _, c := range []outbox.Call{later, soon, now} {
			res, err := client.Submit(ctx, c)
			require.NoError(t, err)
			keys = append(keys, res.Key)
		}
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		awaitState(t, client, keys[2], outbox.StateSucceeded)
		ran := awaitState(t, client, keys[1], outbox.StateSucceeded)
		require.GreaterOrEqual(t, ran.CompletedAt.Sub(ran.CreatedAt), soon.Delay, "never claimed before it was due")
		pending, err := client.Get(ctx, keys[0])
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, pending.State)
		require.Empty(t, recorder.calls(keys[0]), "a key due in an hour never ran")
	})

	t.Run("ProviderGetsStoredMetadata", func(t *testing.T) {
		t.Parallel()
		_, client, recorder := setupRecorder(t)
		ctx := t.Context()
		c := call("refund", 1)
		c.Metadata = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
		res, err := client.Submit(ctx, c)
		require.NoError(t, err)
		plain, err := client.Submit(ctx, call("refund", 2))
		require.NoError(t, err)
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)
		awaitState(t, client, res.Key, outbox.StateSucceeded)
		awaitState(t, client, plain.Key, outbox.StateSucceeded)
		require.Equal(t, []map[string]string{c.Metadata}, recorder.calls(res.Key))
		require.Equal(t, []map[string]string{nil}, recorder.calls(plain.Key))
	})
}
