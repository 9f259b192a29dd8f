package outbox

import (
	"context"
	"fmt"
	"math"
)

// Bounds of [Client.RunSteps].
const (
	// RunLimitDefault is the most steps [Client.RunSteps] returns when
	// [RunParams.Limit] is zero.
	RunLimitDefault = 100
	// RunLimitMax is the most steps [Client.RunSteps] returns.
	RunLimitMax = 1000
	// RunGapMax is how many consecutive steps without a key end a run: a
	// run's steps are looked up by number, and after 32 missing steps in a
	// row [Client.RunSteps] stops looking.
	RunGapMax = 32
)

// runBatch is how many steps one statement of [Client.RunSteps] looks up.
const runBatch = 2 * RunGapMax

// RunParams select the steps [Client.RunSteps] returns.
type RunParams struct {
	// Tenant and RunID are the run's: the Tenant and RunID of its step
	// calls. RunID is required.
	Tenant string
	RunID  string
	// FromStep is the first step looked up; zero starts at step 0. Pass
	// [RunResult.NextStep] for the steps after a full page.
	FromStep int64
	// Limit is the most steps returned: 1 to [RunLimitMax]. Zero means
	// [RunLimitDefault].
	Limit int
}

// RunStep is one step of a [RunResult]: the step number and its key as
// [Client.Get] reads it, in any state. A pruned step is its tombstone
// ([StateExpired]: its key and completion time, no tool nor response).
type RunStep struct {
	Step int64
	Result
}

// RunResult is what [Client.RunSteps] found.
type RunResult struct {
	// Steps are the run's steps found, in step order. A missing step number
	// is a step the run never asked for, or one forgotten after its
	// tombstone's horizon.
	Steps []RunStep
	// NextStep, when not zero, is where the run continues: the page was
	// full and a step after it exists. Pass it in [RunParams.FromStep].
	NextStep int64
}

// RunSteps returns the step calls of a run in step order, in every state —
// pending, in flight, succeeded, failed, needs review, cancelled, and the
// tombstones of pruned steps: the tool calls of an agent's run as the model
// issued them. A business-key call ([Call.Key]) is not a step and is not
// returned.
//
// RunSteps needs no index of its own: a step call's scope is a digest of its
// tenant, run and step (KEYSPEC.md), so RunSteps derives the scopes of steps
// FromStep, FromStep+1, … and reads them on the scope's unique index, 64
// steps a statement. It stops after [RunGapMax] consecutive steps without a
// key, so a run whose step numbers leave a larger gap shows only the steps
// before it (ask again with FromStep past the gap), and after Limit steps.
// Each statement is a snapshot of its own; the steps are not one.
//
// It returns [ErrInvalidParams] for a missing or malformed RunID or Tenant,
// a negative FromStep or a limit out of range; nothing runs then.
func (c *Client[TTx]) RunSteps(ctx context.Context, params RunParams) (RunResult, error) {
	limit := params.Limit
	if limit == 0 {
		limit = RunLimitDefault
	}
	switch {
	case params.RunID == "":
		return RunResult{}, fmt.Errorf("%w: RunID is required", ErrInvalidParams)
	case params.FromStep < 0:
		return RunResult{}, fmt.Errorf("%w: FromStep must not be negative, got %d", ErrInvalidParams, params.FromStep)
	case limit < 1 || limit > RunLimitMax:
		return RunResult{}, fmt.Errorf("%w: Limit must be between 1 and %d, got %d", ErrInvalidParams, RunLimitMax, params.Limit)
	}
	for _, field := range [...]struct{ name, value string }{{"Tenant", params.Tenant}, {"RunID", params.RunID}} {
		if reason := callStringProblem(field.value); reason != "" {
			return RunResult{}, fmt.Errorf("%w: %s %s", ErrInvalidParams, field.name, reason)
		}
	}

	var result RunResult
	next, misses := params.FromStep, 0
	for misses < RunGapMax {
		n := runBatch
		if remaining := math.MaxInt64 - next; remaining < int64(n) {
			n = int(remaining) + 1
		}
		scopes := stepScopes(params.Tenant, params.RunID, next, n)
		rows, err := c.store.KeysByScope(ctx, scopes, c.nowParam())
		if err != nil {
			return RunResult{}, fmt.Errorf("read run: %w", err)
		}
		found := make(map[string]RunStep, len(rows))
		for _, row := range rows {
			found[row.Scope] = RunStep{Result: c.resultFromRow(row, false)}
		}
		for i, scope := range scopes {
			step, ok := found[scope]
			if !ok {
				if misses++; misses >= RunGapMax {
					break
				}
				continue
			}
			misses = 0
			step.Step = next + int64(i)
			if len(result.Steps) == limit {
				result.NextStep = step.Step
				return result, nil
			}
			result.Steps = append(result.Steps, step)
		}
		if n < runBatch {
			break // the last step number there is
		}
		next += int64(n)
	}
	return result, nil
}
