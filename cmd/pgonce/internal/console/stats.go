package console

import (
	"context"
	"sync"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// statsCache keeps the last [outbox.Stats] and the one before, so that the
// overview reads the key table at most once an interval and can tell how
// many keys each tool gained between the two: its calls per minute.
type statsCache struct {
	mu             sync.Mutex
	last, previous outbox.Stats
	lastAt, prevAt time.Time
	// windows keeps the last counts of each window of the overview.
	windows map[time.Duration]countsSnapshot
}

// countsSnapshot is what [outbox.Client.CountCreated] counted in the
// window from Since, at At.
type countsSnapshot struct {
	Counts outbox.CreatedCounts
	Since  time.Time
	At     time.Time
}

// readCounts returns the counts of the keys created in the last span,
// read at most once an interval, as the overview's totals are.
func (h *Handler) readCounts(ctx context.Context, span time.Duration) (countsSnapshot, error) {
	c := &h.stats
	c.mu.Lock()
	defer c.mu.Unlock()
	now := h.config.NowFunc()
	if snap, ok := c.windows[span]; ok && now.Sub(snap.At) < h.config.StatsInterval {
		return snap, nil
	}
	since := now.Add(-span)
	counts, err := h.ops.CountCreated(ctx, outbox.CountCreatedParams{CreatedAfter: since})
	if err != nil {
		return countsSnapshot{}, err
	}
	if c.windows == nil {
		c.windows = map[time.Duration]countsSnapshot{}
	}
	snap := countsSnapshot{Counts: counts, Since: since, At: now}
	c.windows[span] = snap
	return snap, nil
}

type statsSnapshot struct {
	Stats outbox.Stats
	At    time.Time
	// PerMinute is the keys each tool gained per minute between the last
	// two reads; nil until there are two.
	PerMinute map[string]float64
}

func (h *Handler) readStats(ctx context.Context) (statsSnapshot, error) {
	c := &h.stats
	c.mu.Lock()
	defer c.mu.Unlock()
	now := h.config.NowFunc()
	if c.lastAt.IsZero() || now.Sub(c.lastAt) >= h.config.StatsInterval {
		stats, err := h.ops.Stats(ctx)
		if err != nil {
			return statsSnapshot{}, err
		}
		if !c.lastAt.IsZero() {
			c.previous, c.prevAt = c.last, c.lastAt
		}
		c.last, c.lastAt = stats, now
	}
	snap := statsSnapshot{Stats: c.last, At: c.lastAt}
	if !c.prevAt.IsZero() {
		minutes := c.lastAt.Sub(c.prevAt).Minutes()
		snap.PerMinute = make(map[string]float64, len(c.last.Keys))
		for tool, counts := range c.last.Keys {
			gained := total(counts) - total(c.previous.Keys[tool])
			snap.PerMinute[tool] = max(0, float64(gained)) / minutes
		}
	}
	return snap, nil
}

func total(counts map[outbox.State]int64) int64 {
	var n int64
	for _, c := range counts {
		n += c
	}
	return n
}
