package attempt

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
)

// Claimer claims due keys for one claimer over a client's runner: a
// dispatcher, or oncetest's Drain. Both claim through [Claimer.Claim], so
// that a test drain honours what a dispatcher honours: the keys of tools
// with flow control (a row in pgonce_tool: paused, limited in flight or in
// rate, slowed down) through the controlled claim, every other tool's
// through the plain one, and the claims of tools registered with a
// replicated claim committed once the synchronous standbys applied them.
// A Claimer is safe for concurrent use; its claims are not meant to
// overlap.
type Claimer struct {
	runner   *Runner
	config   ClaimerConfig
	controls *controls
}

// ClaimerConfig configures a [Claimer].
type ClaimerConfig struct {
	// Worker is the id written into the leases the claims take.
	Worker string
	// MaxAttempts is the attempts' [Attempt.MaxAttempts]; zero means no
	// limit.
	MaxAttempts int
	// ReadEvery is how often the claims read which tools have flow
	// control when nothing told the claimer that it changed
	// ([Claimer.Invalidate]); zero reads it at every claim.
	ReadEvery time.Duration
	// Observer, when set, is told of every claim.
	Observer observe.Observer
}

// NewClaimer returns a claimer over r's store and tools.
func (r *Runner) NewClaimer(config ClaimerConfig) *Claimer {
	return &Claimer{runner: r, config: config, controls: newControls(config.ReadEvery)}
}

// ClaimParams are the parameters of [Claimer.Claim].
type ClaimParams struct {
	// Tools are the tools whose due keys the claim may take.
	Tools []string
	// Limit is the most keys the claim takes.
	Limit int
	// ClaimAt is the claimer's batch threshold: a tool limited in rate is
	// held until tokens for a claim of that many (or of a quarter of its
	// burst, if fewer) have accrued.
	ClaimAt int
	// Poll is the wait returned when nothing is known sooner.
	Poll time.Duration
}

// Invalidate makes the next claim read the tools' flow control again, and
// claim the tools it held: a changed limit may have given them budget.
func (c *Claimer) Invalidate() { c.controls.invalidate() }

// Controlled marks tool as having flow control at once: the caller just
// gave it a row (a slow-down, say).
func (c *Claimer) Controlled(tool string) { c.controls.add(tool) }

// Claim claims up to p.Limit due keys of p.Tools and returns their
// attempts: those of tools with flow control through the controlled claim,
// the others' through the plain one, every claim committed before it
// returns. wait is how soon a controlled tool may have budget again
// (p.Poll when nothing is known sooner). When the plain claim fails after
// the controlled one took keys, Claim returns those keys' attempts with the
// error: they are claimed, and the caller runs or releases them.
func (c *Claimer) Claim(ctx context.Context, p *ClaimParams) (attempts []Attempt, wait time.Duration, err error) {
	wait = p.Poll
	if len(p.Tools) == 0 {
		return nil, wait, nil
	}
	// A claim that hangs (a connection whose server vanished) would stop
	// the claimer: its deadline drops the connection, and the next claim
	// takes another.
	ctx, cancel := context.WithTimeout(ctx, c.runner.config.StatementTimeout)
	defer cancel()
	claimedAt := time.Now()
	var replicated []string
	for _, name := range p.Tools {
		if tool := c.runner.Tool(name); tool != nil && tool.ReplicatedClaim {
			replicated = append(replicated, name)
		}
	}
	s := c.runner.Store()
	controlled, plain, released, err := c.controls.split(ctx, s, p.Tools, claimedAt)
	if err != nil {
		return nil, wait, fmt.Errorf("read tool flow control: %w", err)
	}
	if !released.IsZero() {
		wait = min(wait, max(released.Sub(claimedAt), time.Millisecond))
	}
	if len(controlled) == 0 && len(plain) == 0 {
		return nil, wait, nil // every tool is held: nothing to claim yet
	}
	var (
		rows  []*store.ClaimedKey
		held  []observe.Held
		limit = p.Limit
	)
	if len(controlled) > 0 {
		var budgets []store.ToolBudget
		rows, budgets, err = s.ClaimControlled(ctx, c.params(controlled, replicated, limit))
		if err != nil {
			return nil, wait, fmt.Errorf("claim controlled outbox batch: %w", err)
		}
		// A controlled tool without a budget has no control row any more:
		// its keys are the plain claim's, from this claim on.
		if len(budgets) < len(controlled) {
			rowless := slices.DeleteFunc(slices.Clone(controlled), func(tool string) bool {
				return slices.ContainsFunc(budgets, func(b store.ToolBudget) bool { return b.Tool == tool })
			})
			c.controls.forget(rowless)
			plain = append(plain, rowless...)
		}
		perTool := make(map[string]int, len(controlled))
		for _, row := range rows {
			perTool[row.Tool]++
		}
		var holds map[string]time.Duration
		wait, holds = controlWait(budgets, perTool, p.ClaimAt, wait)
		for tool, after := range holds {
			c.controls.hold(tool, time.Now().Add(after))
		}
		held = heldTools(budgets, perTool, limit)
		limit -= len(rows)
	}
	if len(plain) > 0 && limit > 0 {
		var more []*store.ClaimedKey
		more, err = s.ClaimBatch(ctx, c.params(plain, replicated, limit))
		rows = append(rows, more...)
	}
	if obs := c.config.Observer; obs != nil {
		observeClaim(ctx, obs, claimedAt, limit, rows, held, err)
	}
	attempts = make([]Attempt, 0, len(rows))
	for _, row := range rows {
		attempts = append(attempts, c.runner.Claimed(row, claimedAt, c.config.MaxAttempts))
	}
	if err != nil {
		return attempts, wait, fmt.Errorf("claim outbox batch: %w", err)
	}
	return attempts, wait, nil
}

// params returns the parameters of a claim of up to limit keys of tools.
// The claim leases by the client's clock ([Config.NowFunc]) when it has
// one, as the client's submits and the reconciler's passes do, so that a
// moved clock moves every window alike.
func (c *Claimer) params(tools, replicated []string, limit int) *store.ClaimBatchParams {
	return &store.ClaimBatchParams{
		Tools:           tools,
		ReplicatedTools: replicated,
		Max:             limit,
		Lease:           c.runner.config.Lease,
		Worker:          c.config.Worker,
		Now:             c.runner.NowParam(),
	}
}

// observeClaim tells obs of a claim sent at began.
func observeClaim(ctx context.Context, obs observe.Observer, began time.Time, limit int, rows []*store.ClaimedKey, held []observe.Held, err error) {
	claim := &observe.Claim{Began: began, Ended: time.Now(), Limit: limit, Err: err, Keys: make([]observe.Key, len(rows)), Held: held}
	for i, row := range rows {
		claim.Keys[i] = observe.Key{
			Key: row.Key, Tool: row.Tool, Attempt: row.Attempt, Metadata: row.Metadata,
			Waited: row.Now.Sub(row.AvailableAt),
		}
	}
	obs.Claimed(ctx, claim)
}

// Throttle applies a provider's slow down of out (out.SlowDown > 0), for
// the claimer that claimed its attempt: out's tool is slowed down for
// every claimer of the schema until out.SlowDown from now (by the client's
// clock), and this claimer counts it as controlled at once. A Retry
// outcome's key goes back to pending without spending its attempt:
// res.Released then says that it needs no recording. Other kinds are
// recorded as usual, and so is out when Throttle fails.
func (c *Claimer) Throttle(ctx context.Context, out *Outcome) (res *store.ThrottleResult, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.runner.config.StatementTimeout)
	defer cancel()
	s := c.runner.Store()
	p := &store.ThrottleParams{Tool: out.Tool, Delay: out.SlowDown, Now: c.runner.NowParam()}
	if !c.runner.config.NotifyDisabled {
		p.Channel = s.WorkChannel
	}
	if out.Kind == Retry {
		p.Key, p.Attempt, p.Ambiguous = out.Key, out.Attempt, out.Ambiguous
		p.LastError = SanitizeText("slowed down: " + out.Err.Error())
	}
	if res, err = s.Throttle(ctx, p); err != nil {
		return nil, err
	}
	c.controls.add(out.Tool)
	return res, nil
}
