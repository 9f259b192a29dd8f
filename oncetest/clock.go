package oncetest

import (
	"sync"
	"time"
)

// Clock is a fake clock for [outbox.Config.NowFunc]: it stands still until
// moved with [Clock.Advance] or [Clock.Set]. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads start. A zero start means the current
// time. The time is truncated to the microsecond, PostgreSQL's resolution,
// so that what pgonce stores compares equal to what the clock said.
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = time.Now()
	}
	return &Clock{now: start.Truncate(time.Microsecond)}
}

// Now returns the clock's time. Pass it as [outbox.Config.NowFunc].
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (back, for a negative d) and returns
// the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d).Truncate(time.Microsecond)
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t.Truncate(time.Microsecond)
}
