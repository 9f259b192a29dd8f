package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// BenchmarkBatchPlans times one 256-outcome Finish and one 256-attempt
// Release on a table of 200,000 in-flight keys, sent as a prepared
// statement (which PostgreSQL may run with a generic plan after five
// executions) and as an unnamed one (a custom plan every time), side by
// side. It is the measurement behind finishExecMode and releaseExecMode:
//
//	go test -run='^$' -bench=BatchPlans -benchtime=100x ./internal/store
func BenchmarkBatchPlans(b *testing.B) {
	const (
		rows  = 200_000
		batch = 256
	)
	ctx := context.Background()
	schema := pgoncetest.Schema(b)
	pool := pgoncetest.Pool(b)
	_, err := pool.Exec(ctx, `INSERT INTO `+ident.Quote(schema)+`.pgonce_key
		(key, scope, tenant, run_id, step, business_key, tool, natural_id, fingerprint, args,
		 attempt, lease_until, worker, first_attempted_at)
		SELECT 'k1_' || lpad(i::text, 64, '0'), 's_' || i, '', 'run', i, '', 'refund', '', 'f', '{}'::bytea,
		 1, now() + interval '1 hour', 'bench', now()
		FROM generate_series(1, $1::integer) AS i`, rows)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `ANALYZE `+ident.Quote(schema)+`.pgonce_key`)
	require.NoError(b, err)
	driver, err := NewPgxDriver(pool, schema)
	require.NoError(b, err)
	s := driver.Store()

	// Every batch takes keys no earlier batch took, in random order.
	order := rand.Perm(rows)
	var next atomic.Int64
	take := func(b *testing.B) []string {
		start := int(next.Add(batch)) - batch
		if start+batch > rows {
			b.Fatalf("out of in-flight keys: run with a smaller -benchtime")
		}
		keys := make([]string, batch)
		for i, n := range order[start : start+batch] {
			keys[i] = fmt.Sprintf("k1_%064d", n+1)
		}
		return keys
	}

	for _, mode := range []struct {
		name string
		mode execMode
	}{{"Prepared", execDefault}, {"Unnamed", execUnnamed}} {
		b.Run("Finish/"+mode.name, func(b *testing.B) {
			defer func(previous execMode) { finishExecMode = previous }(finishExecMode)
			finishExecMode = mode.mode
			for b.Loop() {
				b.StopTimer()
				params := &FinishParams{TombstoneRetention: time.Hour}
				for _, key := range take(b) {
					params.Outcomes = append(params.Outcomes, Outcome{
						Key: key, Attempt: 1, State: StateSucceeded, Response: []byte(`{"ok":true}`), Retention: time.Hour,
					})
				}
				b.StartTimer()
				written, err := s.Finish(ctx, params)
				require.NoError(b, err)
				require.Len(b, written, batch)
			}
		})
		b.Run("Release/"+mode.name, func(b *testing.B) {
			defer func(previous execMode) { releaseExecMode = previous }(releaseExecMode)
			releaseExecMode = mode.mode
			for b.Loop() {
				b.StopTimer()
				params := &ReleaseParams{}
				for _, key := range take(b) {
					params.Releases = append(params.Releases, Release{Key: key, Attempt: 1, Delay: time.Second, LastError: "e"})
				}
				b.StartTimer()
				written, err := s.Release(ctx, params)
				require.NoError(b, err)
				require.Len(b, written, batch)
			}
		})
	}
}
