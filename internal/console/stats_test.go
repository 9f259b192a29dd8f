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

	"github.com/pgonce/pgonce/internal/console"
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
		require.Regexp(t, `refund</a></td><td class="num">4</td>(<td class="num">\d+</td>){6}<td class="num">3.0</td>`, page)
	})
}
