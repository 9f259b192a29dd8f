package outbox

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// ToolLimits are a tool's flow-control limits, enforced by the database
// across every dispatcher of the schema. A zero field is no limit of that
// kind.
type ToolLimits struct {
	// MaxInFlight is the most calls of the tool in flight at once.
	MaxInFlight int
	// Rate is the most calls started per second, on average.
	Rate float64
	// Burst is how many calls may start at once after the tool was idle.
	// Defaults, with a Rate, to the Rate rounded up; it must be 0 without
	// one.
	Burst int
}

// Maximums of [ToolLimits].
const (
	ToolMaxInFlightMax = 1_000_000
	ToolRateMax        = 1_000_000
	ToolBurstMax       = 1_000_000
)

func (l ToolLimits) withDefaults() ToolLimits {
	if l.Rate > 0 && l.Burst == 0 {
		l.Burst = int(math.Ceil(l.Rate))
	}
	return l
}

func (l ToolLimits) validate() error {
	switch {
	case l.MaxInFlight < 0 || l.MaxInFlight > ToolMaxInFlightMax:
		return fmt.Errorf("%w: MaxInFlight must be between 0 and %d", ErrInvalidParams, ToolMaxInFlightMax)
	case math.IsNaN(l.Rate) || l.Rate < 0 || l.Rate > ToolRateMax:
		return fmt.Errorf("%w: Rate must be between 0 and %d", ErrInvalidParams, ToolRateMax)
	case l.Burst < 0 || l.Burst > ToolBurstMax:
		return fmt.Errorf("%w: Burst must be between 0 and %d", ErrInvalidParams, ToolBurstMax)
	case l.Burst > 0 && l.Rate == 0:
		return fmt.Errorf("%w: Burst needs a Rate", ErrInvalidParams)
	}
	return nil
}

// ToolStatus is a tool's flow control, as [Client.Tools] reads it.
type ToolStatus struct {
	// Tool is the tool's name.
	Tool string
	// Limits are the tool's limits; zero fields are none.
	Limits ToolLimits
	// Paused reports that an operator paused the tool ([Client.Pause]):
	// its keys wait, submits still add to them. PausedAt, PausedBy and
	// PausedReason say when, by whom and why.
	Paused       bool
	PausedAt     time.Time
	PausedBy     string
	PausedReason string
	// SlowedUntil, when after the read, is when the tool's provider may be
	// called again after it asked to slow down ([SlowDown]).
	SlowedUntil time.Time
	// UpdatedAt is when the tool's flow control last changed.
	UpdatedAt time.Time
	// Known reports that a call may use the tool now: it is registered in
	// the client's [Config.Registry], or a key of it is pending or in
	// flight in the schema. A tool that is not known is most often a
	// misspelt name; its flow control applies to calls yet to come. A
	// client without a registry, as the CLI's, knows a tool by its keys
	// alone, and a tool whose keys have all finished is not known to it.
	Known bool
}

// SlowedDown reports whether the tool was slowed down at now.
func (s ToolStatus) SlowedDown(now time.Time) bool { return s.SlowedUntil.After(now) }

// PauseParams say who pauses a tool and why, for [Client.Pause].
type PauseParams struct {
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Required, with the same rules as By.
	Reason string
}

// ResumeParams say who resumes a tool and why, for [Client.Resume].
type ResumeParams struct {
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Optional, with the same rules as By otherwise.
	Reason string
}

// EndSlowDownParams say who ends a tool's slow-down early and why, for
// [Client.EndSlowDown].
type EndSlowDownParams struct {
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Required, with the same rules as By: the decision
	// overrides what the tool's provider asked for.
	Reason string
}

// LimitParams say who sets a tool's limits and why, for
// [Client.SetToolLimits].
type LimitParams struct {
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Required, with the same rules as By.
	Reason string
}

// CheckToolName returns nil when tool is a name a [Call.Tool] may have,
// and otherwise an error matching [ErrInvalidParams] that names the rule:
// ^[a-z][a-z0-9_.:-]{0,63}$. [Client.Pause], [Client.Resume] and
// [Client.SetToolLimits] apply it, so that no flow control is set on a name
// that no call can use; it is exported for front ends that want to refuse a
// name before they ask anything else.
func CheckToolName(tool string) error {
	switch {
	case tool == "":
		return fmt.Errorf("%w: tool is required", ErrInvalidParams)
	case !validToolName(tool):
		return fmt.Errorf("%w: tool %s must match %s", ErrInvalidParams, quoteShort(tool), toolNamePattern)
	}
	return nil
}

// Pause pauses a tool across every dispatcher of the schema: none claims
// its keys until [Client.Resume], and calls already in flight finish.
// Submits still accept the tool's keys, which wait, pending. The decision
// is recorded with who and why ([Client.ToolActions]); pausing a paused
// tool keeps the first pause and records nothing. How soon dispatchers
// stop claiming the tool's keys (at once when they listen) is in
// docs/flow-control.md, "How soon a change reaches the dispatchers".
//
// [Client.Do] is not paused: an inline call runs when its caller asks.
//
// It returns [ErrInvalidParams] for a tool name no call can have
// ([CheckToolName]) or missing or malformed params, and changes nothing
// then.
func (c *Client[TTx]) Pause(ctx context.Context, tool string, params PauseParams) (ToolStatus, error) {
	if err := CheckToolName(tool); err != nil {
		return ToolStatus{}, err
	}
	if err := validateAudit(params.By, params.Reason); err != nil {
		return ToolStatus{}, err
	}
	p := &store.ToolActParams{Tool: tool, By: params.By, Reason: params.Reason, Channel: c.workChannel(), Now: c.nowParam()}
	if _, err := c.store.ToolPause(ctx, p); err != nil {
		return ToolStatus{}, fmt.Errorf("pause tool: %w", err)
	}
	return c.Tool(ctx, tool)
}

// Resume ends a tool's pause: dispatchers claim its keys again, within its
// limits. The decision is recorded with who and why; resuming a tool that
// is not paused changes nothing and records nothing. A slow-down its
// provider asked for stays until it ends or [Client.EndSlowDown].
//
// It returns [ErrInvalidParams] for a tool name no call can have
// ([CheckToolName]) or missing or malformed params, and changes nothing
// then.
func (c *Client[TTx]) Resume(ctx context.Context, tool string, params ResumeParams) (ToolStatus, error) {
	if err := CheckToolName(tool); err != nil {
		return ToolStatus{}, err
	}
	reason := params.Reason
	if strings.TrimSpace(reason) == "" {
		reason = "-" // validateAudit requires one; the record shows none was given
	}
	if err := validateAudit(params.By, reason); err != nil {
		return ToolStatus{}, err
	}
	p := &store.ToolActParams{Tool: tool, By: params.By, Reason: params.Reason, Channel: c.workChannel(), Now: c.nowParam()}
	if _, err := c.store.ToolResume(ctx, p); err != nil {
		return ToolStatus{}, fmt.Errorf("resume tool: %w", err)
	}
	return c.Tool(ctx, tool)
}

// EndSlowDown ends a tool's slow-down ([SlowDown]) before the time its
// provider asked for: dispatchers claim its keys again at once, within its
// limits and unless it is paused, and its pending keys that the slow-down
// held (those due before its end) are due now. It is an operator's
// override: a provider that still cannot keep up answers with another slow
// down, which starts a new one. The decision is recorded with who and why
// (action "end_slow_down"); ending the slow-down of a tool that is not
// slowed down changes nothing and records nothing. [Client.Resume] and
// clearing the limits leave a slow-down in place.
//
// It returns [ErrInvalidParams] for a tool name no call can have
// ([CheckToolName]) or missing or malformed params, and changes nothing
// then.
func (c *Client[TTx]) EndSlowDown(ctx context.Context, tool string, params EndSlowDownParams) (ToolStatus, error) {
	if err := CheckToolName(tool); err != nil {
		return ToolStatus{}, err
	}
	if err := validateAudit(params.By, params.Reason); err != nil {
		return ToolStatus{}, err
	}
	p := &store.ToolActParams{Tool: tool, By: params.By, Reason: params.Reason, Channel: c.workChannel(), Now: c.nowParam()}
	if _, err := c.store.ToolEndSlowDown(ctx, p); err != nil {
		return ToolStatus{}, fmt.Errorf("end tool slow-down: %w", err)
	}
	return c.Tool(ctx, tool)
}

// SetToolLimits sets a tool's limits, enforced by the database across every
// dispatcher of the schema: a claim never takes more of the tool's keys
// than its free budget. Zero limits clear them (a slow-down stays:
// [Client.EndSlowDown]). A tool without limits, a pause or a slow-down
// costs its claims nothing; one with any has its claims take its budget
// one after the other (see docs/flow-control.md).
// The decision is recorded with who and why.
//
// It returns [ErrInvalidParams] for a tool name no call can have
// ([CheckToolName]) or missing or malformed limits or params, and changes
// nothing then.
func (c *Client[TTx]) SetToolLimits(ctx context.Context, tool string, limits ToolLimits, params LimitParams) (ToolStatus, error) {
	if err := CheckToolName(tool); err != nil {
		return ToolStatus{}, err
	}
	limits = limits.withDefaults()
	if err := limits.validate(); err != nil {
		return ToolStatus{}, err
	}
	if err := validateAudit(params.By, params.Reason); err != nil {
		return ToolStatus{}, err
	}
	p := &store.ToolActParams{Tool: tool, By: params.By, Reason: params.Reason, Channel: c.workChannel(), Now: c.nowParam()}
	if limits.MaxInFlight > 0 {
		p.MaxInFlight = &limits.MaxInFlight
	}
	if limits.Rate > 0 {
		p.Rate, p.Burst = &limits.Rate, &limits.Burst
	}
	if _, err := c.store.ToolSetLimits(ctx, p); err != nil {
		return ToolStatus{}, fmt.Errorf("set tool limits: %w", err)
	}
	return c.Tool(ctx, tool)
}

// Tools returns the flow control of every tool that has any (limits, a
// pause, a slow-down now or earlier), by name.
func (c *Client[TTx]) Tools(ctx context.Context) ([]ToolStatus, error) {
	controls, err := c.store.ToolControls(ctx, c.nowParam())
	if err != nil {
		return nil, fmt.Errorf("read tools: %w", err)
	}
	statuses := make([]ToolStatus, 0, len(controls))
	for _, tc := range controls {
		s := toolStatus(tc)
		s.Known = tc.OpenKeys || c.config.Registry.Lookup(tc.Tool) != nil
		statuses = append(statuses, s)
	}
	return statuses, nil
}

// Tool returns the flow control of tool: a status with only its name and
// Known when it has none.
func (c *Client[TTx]) Tool(ctx context.Context, tool string) (ToolStatus, error) {
	statuses, err := c.Tools(ctx)
	if err != nil {
		return ToolStatus{}, err
	}
	for _, s := range statuses {
		if s.Tool == tool {
			return s, nil
		}
	}
	status := ToolStatus{Tool: tool, Known: c.config.Registry.Lookup(tool) != nil}
	if !status.Known {
		if status.Known, err = c.store.ToolOpenKeys(ctx, tool); err != nil {
			return ToolStatus{}, fmt.Errorf("read tool: %w", err)
		}
	}
	return status, nil
}

// ToolAction is an operator's decision on a tool: a pause, a resume,
// limits set or a slow-down ended.
type ToolAction struct {
	At time.Time
	// Action is "pause", "resume", "limit" or "end_slow_down".
	Action string
	By     string
	Reason string
}

// ToolActions returns up to 100 of the operator decisions on tool, newest
// first. It returns [ErrInvalidParams] for a tool name no call can have
// ([CheckToolName]).
func (c *Client[TTx]) ToolActions(ctx context.Context, tool string) ([]ToolAction, error) {
	if err := CheckToolName(tool); err != nil {
		return nil, err
	}
	rows, err := c.store.ToolActions(ctx, tool, 100)
	if err != nil {
		return nil, fmt.Errorf("read tool actions: %w", err)
	}
	actions := make([]ToolAction, 0, len(rows))
	for _, r := range rows {
		actions = append(actions, ToolAction(r))
	}
	return actions, nil
}

func toolStatus(tc *store.ToolControl) ToolStatus {
	s := ToolStatus{
		Tool:         tc.Tool,
		Limits:       ToolLimits{MaxInFlight: tc.MaxInFlight, Rate: tc.Rate, Burst: tc.Burst},
		PausedBy:     tc.PausedBy,
		PausedReason: tc.PausedReason,
		UpdatedAt:    tc.UpdatedAt,
	}
	if tc.PausedAt != nil {
		s.Paused, s.PausedAt = true, *tc.PausedAt
	}
	if tc.NotBefore != nil {
		s.SlowedUntil = *tc.NotBefore
	}
	return s
}

// workChannel is the channel that wakes dispatchers, empty when
// notifications are disabled.
func (c *Client[TTx]) workChannel() string {
	if c.config.NotifyDisabled {
		return ""
	}
	return c.store.WorkChannel
}
