package attempt

import (
	"context"
	"sync"
	"time"

	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
)

// controlPollMin is how soon a claimer looks again at a tool held back by
// its limit on calls in flight while keys of it wait: a call that another
// claimer finishes frees budget without waking this one.
const controlPollMin = 50 * time.Millisecond

// controls is a claimer's view of which of its tools have flow control (a
// row in pgonce_tool): their keys are claimed by the controlled claim,
// every other tool's by the plain one, which never reads pgonce_tool. It is
// read at the first claim, again at the claim after the claimer was told
// that it changed ([Claimer.Invalidate]: a dispatcher is, when a
// notification says a tool's flow control changed or its listener
// (re)connected, as notifications sent while it was not listening are
// lost), and otherwise every readEvery (a dispatcher's
// MaintenanceInterval; zero for every claim): the bound on how late a
// claimer that hears no notification learns that a tool without a row got
// one. A tool that loses
// its row needs no notification: the controlled claim finds it rowless and
// hands its keys to the plain claim at once.
//
// A controlled tool whose claim found no budget for its due keys until a
// known time (the next tokens of its rate, the end of a slow-down) is held
// until then, or until the next read: the claims in between, which a freed
// slot or a notification of new work starts, leave it out and do not lock
// its row for nothing.
type controls struct {
	mu        sync.Mutex
	tools     map[string]bool
	held      map[string]time.Time
	readAt    time.Time
	stale     bool
	readEvery time.Duration
}

func newControls(readEvery time.Duration) *controls {
	return &controls{readEvery: readEvery, stale: true}
}

// invalidate makes the next claim read the tools' flow control again, and
// claim the tools it held: a changed limit may have given them budget.
func (c *controls) invalidate() {
	c.mu.Lock()
	c.stale = true
	clear(c.held)
	c.mu.Unlock()
}

// hold leaves tool out of the claims until until.
func (c *controls) hold(tool string, until time.Time) {
	c.mu.Lock()
	if c.held == nil {
		c.held = map[string]time.Time{}
	}
	c.held[tool] = until
	c.mu.Unlock()
}

// add marks tool as controlled at once: its claimer just gave it a row.
func (c *controls) add(tool string) {
	c.mu.Lock()
	if c.tools == nil {
		c.tools = map[string]bool{}
	}
	c.tools[tool] = true
	c.mu.Unlock()
}

// forget marks tools as not controlled at once: a claim found that they
// have no row.
func (c *controls) forget(tools []string) {
	c.mu.Lock()
	for _, tool := range tools {
		delete(c.tools, tool)
		delete(c.held, tool)
	}
	c.mu.Unlock()
}

// split returns which of tools are controlled and which are not, reading
// the flow control again first when it is due. Controlled tools held at
// now are in neither: released is the earliest time one of them may be
// claimed again (zero when none is held).
func (c *controls) split(ctx context.Context, s *store.Store, tools []string, now time.Time) (controlled, plain []string, released time.Time, err error) {
	c.mu.Lock()
	due := c.stale || time.Since(c.readAt) >= c.readEvery
	c.mu.Unlock()
	if due {
		rows, err := s.ToolControls(ctx, nil)
		if err != nil {
			return nil, nil, time.Time{}, err
		}
		read := make(map[string]bool, len(rows))
		for _, row := range rows {
			read[row.Tool] = true
		}
		c.mu.Lock()
		c.tools, c.readAt, c.stale = read, time.Now(), false
		// A held tool's row may have changed unnotified (a slow-down
		// ended early, a limit raised): the read bounds how long a
		// claimer that hears no notification holds it on old news.
		clear(c.held)
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tools) == 0 {
		return nil, tools, time.Time{}, nil
	}
	for _, tool := range tools {
		switch until, held := c.held[tool]; {
		case !c.tools[tool]:
			plain = append(plain, tool)
		case held && now.Before(until):
			if released.IsZero() || until.Before(released) {
				released = until
			}
		default:
			delete(c.held, tool)
			controlled = append(controlled, tool)
		}
	}
	return controlled, plain, released, nil
}

// controlWait is how soon the controlled tools in budgets may have budget
// again, given how many keys of each the claim took (claimed), the claim's
// batch threshold (claimAt), and poll, the wait when nothing is known
// sooner. A paused tool waits for its resume's notification, or poll.
// holds are the tools whose due keys have no budget before a known time,
// the end of a slow-down or the tokens of a worthwhile claim, and how long
// from the claim (the budgets' clock) until then: claims sooner would
// find none, whatever frees a slot meanwhile.
func controlWait(budgets []store.ToolBudget, claimed map[string]int, claimAt int, poll time.Duration) (wait time.Duration, holds map[string]time.Duration) {
	wait = poll
	hold := func(tool string, d time.Duration) {
		d = max(d, time.Millisecond)
		if holds == nil {
			holds = map[string]time.Duration{}
		}
		holds[tool] = d
		wait = min(wait, d)
	}
	for _, b := range budgets {
		if !b.Waiting || b.Paused {
			continue
		}
		if b.NotBefore != nil {
			hold(b.Tool, b.NotBefore.Sub(b.Now)+time.Millisecond)
			continue
		}
		if b.Rate > 0 {
			// Come back when enough tokens for a worthwhile claim have
			// accrued, not for every single one. The bucket holds
			// Tokens at Now less what the claim spent, and fills at Rate
			// from there: the claim refilled it to its own, later clock
			// and no further, so that no token is lost in between.
			want := max(1, min(float64(claimAt), float64(b.Burst)/4))
			if left := b.Tokens - float64(claimed[b.Tool]); left < want {
				hold(b.Tool, time.Duration((want-left)/b.Rate*float64(time.Second))+time.Millisecond)
				continue
			}
		}
		if b.MaxInFlight > 0 {
			wait = min(wait, controlPollMin)
		}
	}
	return max(wait, time.Millisecond), holds
}

// heldTools returns the controlled tools whose due keys the claim left
// waiting for their flow control, given how many keys of each it took and
// the most it could take.
func heldTools(budgets []store.ToolBudget, claimed map[string]int, limit int) []observe.Held {
	var held []observe.Held
	for _, b := range budgets {
		switch {
		case !b.Waiting:
		case b.Paused:
			held = append(held, observe.Held{Tool: b.Tool, Reason: "paused"})
		case b.NotBefore != nil:
			held = append(held, observe.Held{Tool: b.Tool, Reason: "slowed_down"})
		case (b.MaxInFlight > 0 || b.Rate > 0) && claimed[b.Tool] < limit:
			held = append(held, observe.Held{Tool: b.Tool, Reason: "limited"})
		}
	}
	return held
}
