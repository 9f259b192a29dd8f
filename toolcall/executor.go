package toolcall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// WaitDefault is how long a call waits for an outcome by default: see
// [Config.Wait].
const WaitDefault = 10 * time.Second

// Mode says how an [Executor] runs a call.
type Mode int

const (
	// Inline runs each call with [outbox.Client.Do], in the calling
	// goroutine's process, with the tool's registered provider: the claim
	// commits before the provider is called, and the outcome is recorded
	// before Run returns. No dispatcher is needed.
	Inline Mode = iota
	// Dispatched submits each call with [outbox.Client.Submit] and waits
	// for a dispatcher to run it, at most [Config.Wait].
	Dispatched
)

// String returns "inline" or "dispatched".
func (m Mode) String() string {
	switch m {
	case Inline:
		return "inline"
	case Dispatched:
		return "dispatched"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

// Config configures an [Executor]. Its zero value works.
type Config struct {
	// Mode says how calls run. Defaults to [Inline].
	Mode Mode

	// Wait is how long a call waits for an outcome that is not there yet:
	// in [Dispatched] mode, for the dispatcher that runs it; in [Inline]
	// mode, for another attempt that holds the same action (a duplicate
	// ask, a second worker). Past it, or when the caller's ctx ends first,
	// the model reads in_progress with a retry-after hint, and asking again
	// later gets the outcome. Defaults to [WaitDefault]; negative never
	// waits.
	Wait time.Duration

	// ToolNameFunc maps the name a model called to the name of the tool
	// registered in the client's registry, for SDK tool names that are not
	// pgonce tool names (which match ^[a-z][a-z0-9_.:-]{0,63}$). A name it
	// maps to no registered tool reads as unknown_tool. Defaults to the name
	// itself.
	ToolNameFunc func(name string) string
}

func (c Config) withDefaults() Config {
	if c.Wait == 0 {
		c.Wait = WaitDefault
	}
	if c.ToolNameFunc == nil {
		c.ToolNameFunc = func(name string) string { return name }
	}
	return c
}

func (c Config) validate() error {
	if c.Mode != Inline && c.Mode != Dispatched {
		return fmt.Errorf("%w: Mode must be Inline or Dispatched, got %v", ErrInvalidConfig, c.Mode)
	}
	return nil
}

// Executor runs a model's tool calls through a pgonce client, exactly once
// per action whatever the retries, and turns each outcome into what the model
// reads. It is safe for concurrent use.
type Executor[TTx any] struct {
	client *outbox.Client[TTx]
	config Config
}

// NewExecutor returns an executor over client, whose registry holds the
// tools the model may call. It returns [ErrInvalidConfig] for a nil client or
// an invalid config.
func NewExecutor[TTx any](client *outbox.Client[TTx], config Config) (*Executor[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client is nil", ErrInvalidConfig)
	}
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	return &Executor[TTx]{client: client, config: config}, nil
}

// Client returns the executor's client.
func (e *Executor[TTx]) Client() *outbox.Client[TTx] { return e.client }

// Config returns the executor's configuration, with defaults filled in.
func (e *Executor[TTx]) Config() Config { return e.config }

// OutboxCall returns the pgonce call a tool call stands for: its canonical
// arguments, its registered tool name and the model's id as metadata. It
// returns an error matching [ErrInvalidArguments] for arguments that cannot
// be used.
func (e *Executor[TTx]) OutboxCall(c Call) (outbox.Call, error) {
	args, err := Arguments(c.Arguments)
	if err != nil {
		return outbox.Call{}, err
	}
	return outbox.Call{
		Tenant:   c.Tenant,
		RunID:    c.RunID,
		Step:     c.Step,
		Tool:     e.config.ToolNameFunc(c.Tool),
		Args:     args,
		Metadata: metadata(c.ID),
	}, nil
}

// Run runs calls, concurrently, and returns their outcomes in the same
// order: each call at most once per action, whoever else asks for it. A call
// whose action finished earlier gets the stored outcome without running; one
// that another attempt holds is waited for, at most [Config.Wait]. Every
// failure is an outcome, never a panic: invalid arguments, an unknown tool, a
// conflict, a store that cannot be reached (unavailable) each read as their
// observation.
//
// An inline call, once claimed, runs to its outcome and is recorded even if
// ctx ends meanwhile (the provider runs under the client's
// [outbox.Config.CallTimeout]), as a dispatcher drains its calls before it
// stops: cut off, the action would stay in flight until its lease expired and
// a reconciler settled it. ctx bounds the rest: a call not yet started, and
// every wait.
//
// After [Executor.SubmitTx] and its commit, Run with the same calls runs (or
// waits for) what was submitted.
func (e *Executor[TTx]) Run(ctx context.Context, calls ...Call) []Outcome {
	outs := make([]Outcome, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { outs[i] = e.run(ctx, c) })
	}
	wg.Wait()
	return outs
}

func (e *Executor[TTx]) run(ctx context.Context, c Call) Outcome {
	out := Outcome{Call: c}
	call, err := e.OutboxCall(c)
	if err != nil {
		out.Err = err
		return out
	}
	var res outbox.Result
	switch e.config.Mode {
	case Dispatched:
		res, err = e.client.Submit(ctx, call)
		if err == nil && res.State.InProgress() {
			return e.wait(ctx, out, res, err)
		}
	default:
		if err := ctx.Err(); err != nil {
			out.Err = err // not started: nothing claimed
			return out
		}
		// Once claimed, the call runs to its outcome and is recorded even
		// if ctx ends meanwhile, under the client's CallTimeout: an attempt
		// cut off would leave the action in flight until its lease expired
		// and a reconciler settled it.
		res, err = e.client.Do(context.WithoutCancel(ctx), call, nil)
		// Another attempt holds the action (or it is scheduled): wait for
		// it. A provider failure of this attempt left the key pending, and
		// the next ask retries it at once: nothing to wait for.
		if errors.Is(err, outbox.ErrInProgress) {
			return e.wait(ctx, out, res, err)
		}
	}
	out.Result, out.Err = res, err
	return out
}

// wait waits for the outcome of res, in progress, at most the configured
// wait; without one, the outcome is res and err as they are.
func (e *Executor[TTx]) wait(ctx context.Context, out Outcome, res outbox.Result, err error) Outcome {
	out.Result, out.Err = res, err
	if e.config.Wait < 0 {
		return out
	}
	waitCtx, cancel := context.WithTimeout(ctx, e.config.Wait)
	defer cancel()
	waited, err := e.client.WaitResult(waitCtx, res)
	if waited.Key == "" {
		// Nothing read before the wait ended: the key stands as it was.
		waited = res
	}
	out.Result, out.Err = waited, err
	return out
}

// SubmitTx claims calls in tx, the caller's own transaction, beside the
// runtime's record of the message that asked for them: the claims and the
// record commit together, or, rolled back, neither exists. It returns each
// call's outcome as submitted (in progress for a new claim; the stored
// outcome for an action that finished earlier), in order.
//
// A call refused before it was written (invalid arguments, an unknown tool,
// a conflict, an expired action) is an outcome, and tx stays usable. Any
// other error (a transaction already done or aborted, a lock timeout, a
// serialization failure) is returned with the outcomes so far: roll tx back
// and retry the whole transaction.
//
// After the commit, [Executor.Run] with the same calls runs them (in
// [Inline] mode; a dispatcher may take them first, and Run then waits) or
// waits for the dispatcher ([Dispatched] mode).
func (e *Executor[TTx]) SubmitTx(ctx context.Context, tx TTx, calls ...Call) ([]Outcome, error) {
	outs := make([]Outcome, len(calls))
	for i, c := range calls {
		outs[i].Call = c
		call, err := e.OutboxCall(c)
		if err != nil {
			outs[i].Err = err
			continue
		}
		res, err := e.client.SubmitTx(ctx, tx, call)
		outs[i].Result, outs[i].Err = res, err
		if err != nil && !refused(err) {
			return outs[:i+1], fmt.Errorf("submit tool call %d: %w", i, err)
		}
	}
	return outs, nil
}

// refused reports whether err answers a call without writing anything or
// aborting the caller's transaction.
func refused(err error) bool {
	for _, target := range []error{
		outbox.ErrInvalidCall, outbox.ErrNotCanonical, outbox.ErrUnknownTool,
		outbox.ErrKeyConflict, outbox.ErrExpired,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
