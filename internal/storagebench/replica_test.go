package storagebench_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestReplicaReadsLikeItsTemplate runs the scale benchmark's replication on
// a few keys, so that a migration that changes the key table's columns
// fails here, in every test run, and not only when someone runs make
// bench-scale: every replica must be accepted by the table, keep the
// store's invariants (checked when the schema is dropped), and read through
// the public API like the real finished key it was copied from.
func TestReplicaReadsLikeItsTemplate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgoncetest.Schema(t)
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: refundRegistry(t)})
	require.NoError(t, err)
	const templates, copies = 10, 3
	keys := submitBulk(t, client, pgoncetest.Pool(t), templates)
	drain(t, client, schema, templates)
	template, err := client.Get(ctx, keys[0])
	require.NoError(t, err)

	statement := replicaStatements(t, schema)
	copyTemplates(t, schema)
	require.Equal(t, int64(templates*copies), replicate(t, statement, schema, 1, copies))
	sample := sampleReplicaKeys(t, statement, schema, templates, copies, templates*copies)
	dropTemplates(t, schema)

	require.Len(t, sample, templates*copies)
	for _, key := range sample {
		res, err := client.Get(ctx, outbox.Key(key))
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, template.Tool, res.Tool)
		require.Equal(t, template.Attempts, res.Attempts)
		require.Len(t, res.Response, refundResponseBytes)
		require.False(t, res.CompletedAt.IsZero())
	}
	stats, err := client.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(templates*(copies+1)), stats.Keys[refundTool][outbox.StateSucceeded])
}
