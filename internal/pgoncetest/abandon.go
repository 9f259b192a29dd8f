package pgoncetest

import (
	"context"
	"testing"
	"time"

	"github.com/pgonce/pgonce/internal/ident"
)

// AbandonKeys leaves keys of schema as a worker killed in the middle of
// their first call does: in flight under a lease held by a dead worker,
// which ended leaseAgo ago (a negative leaseAgo: a lease that ends in the
// future), first attempted a minute before that. Every key must be pending.
func AbandonKeys[K ~string](tb testing.TB, schema string, leaseAgo time.Duration, keys ...K) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	digests := make([][]byte, len(keys))
	for i, key := range keys {
		digests[i] = StoredKey(tb, string(key))
	}
	tag, err := Pool(tb).Exec(ctx, `
		UPDATE `+ident.Quote(schema)+`.pgonce_key
		SET attempt = 1, worker = 'dead-worker',
			lease_until = now() - $2::bigint * interval '1 microsecond',
			first_attempted_at = now() - $2::bigint * interval '1 microsecond' - interval '1 minute'
		WHERE key = ANY($1::bytea[]) AND state = 'open' AND lease_until IS NULL`,
		digests, leaseAgo.Microseconds())
	if err != nil {
		tb.Fatalf("abandon keys in %s: %v", schema, err)
	}
	if tag.RowsAffected() != int64(len(keys)) {
		tb.Fatalf("abandon keys in %s: %d of %d keys were pending", schema, tag.RowsAffected(), len(keys))
	}
}
