package console_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// countingOperator counts the reads of Stats.
type countingOperator struct {
	console.Operator
	stats atomic.Int64
}

func (o *countingOperator) Stats(ctx context.Context) (outbox.Stats, error) {
	o.stats.Add(1)
	return o.Operator.Stats(ctx)
}

func TestOverviewStats(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testOverviewStats[pgx.Tx], testOverviewStats[*sql.Tx])
}

func testOverviewStats[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("CountsOnceAnIntervalAndShowsCallsPerMinute", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		ops := &countingOperator{Operator: b.client}
		var mu sync.Mutex
		now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
		handler, err := console.New(ops, console.Config{StatsInterval: time.Minute, NowFunc: func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return now
		}})
		require.NoError(t, err)
		server := httptest.NewServer(handler)
		t.Cleanup(server.Close)
		b.server = server

		b.pending(t)
		for range 5 {
			status, page := b.get(t, "/")
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, page, "Counted at 2026-01-02 03:00:00Z")
		}
		require.Equal(t, int64(1), ops.stats.Load(), "five overviews in one interval count the table once")

		for range 3 {
			b.pending(t)
		}
		mu.Lock()
		now = now.Add(time.Minute)
		mu.Unlock()
		status, page := b.get(t, "/")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, int64(2), ops.stats.Load())
		require.Regexp(t, `refund</a></td>`+countCells(4)+`(<td class="num"[^>]*><a href="[^"]*">\d+</a></td>){6}<td class="num">3.0</td>`, page)
	})
}

func TestOverviewMarksEstimates(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testOverviewMarksEstimates[pgx.Tx], testOverviewMarksEstimates[*sql.Tx])
}

func testOverviewMarksEstimates[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("EstimatedCountsOfALargeTableAreMarked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		ctx := t.Context()
		// 40,000 succeeded refunds of a kilobyte each: a key table larger
		// than outbox.StatsExactPagesMax, whose succeeded keys are
		// estimated.
		quoted := ident.Quote(b.schema)
		_, err := pgoncetest.Pool(t).Exec(ctx, `
			INSERT INTO `+quoted+`.pgonce_key (key, scope, run_id, step, tool, args, state, attempt, response,
				available_at, updated_at, completed_at, expires_at, forget_at)
			SELECT sha256(int8send(i)), sha256(int8send(-i)), 'bulk', i, 'refund', '{}'::bytea,
				'succeeded', 1, convert_to(repeat('x', 1000), 'UTF8'), NULL, NULL, now(),
				now() + interval '30 days', now() + interval '365 days'
			FROM generate_series(1, 40000) AS i`)
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(ctx, `ANALYZE `+quoted+`.pgonce_key`)
		require.NoError(t, err)
		pending := b.pending(t)
		_, err = pgoncetest.Pool(t).Exec(ctx, `UPDATE `+quoted+`.pgonce_key SET available_at = now() - interval '1 hour' WHERE key = $1`,
			pgoncetest.StoredKey(t, string(pending)))
		require.NoError(t, err)
		b.needsReview(t)

		status, page := b.get(t, "/")
		require.Equal(t, http.StatusOK, status, page)
		// refund: pending 1 (exact), in flight 0, needs review 0, succeeded ≈40000.
		require.Regexp(t, `refund</a></td>`+countCells(1, 0, 0)+`<td class="num estimate" title="[^"]*"><a href="[^"]*">≈\d+</a></td>`, page)
		require.Regexp(t, `email</a></td>`+countCells(0, 0, 1), page)
		require.Contains(t, page, "≈ marks an estimate")
		// The refund's pending key has been due for an hour.
		require.Regexp(t, `refund</a></td>(<td class="num[^"]*"[^>]*><a href="[^"]*">[^<]*</a></td>){7}<td class="num">[^<]*</td><td class="num">1h0m\d+s</td></tr>`, page)
	})
}
