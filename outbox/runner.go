package outbox

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/pgonce/pgonce/internal/attempt"
)

// runnerHandle is the handle through which the dispatcher and reconciler
// packages reach a client's runner ([attempt.Of]); unexported, so that it
// stays out of the client's documentation.
type runnerHandle = attempt.Handle

// newRunner returns the attempt runner of a client with config.
func newRunner[TTx any](c *Client[TTx]) *attempt.Runner {
	registry := c.config.Registry
	return attempt.New(c.store, attempt.Config{
		CallTimeout:        c.config.CallTimeout,
		Lease:              c.config.Lease,
		Retention:          c.config.Retention,
		TombstoneRetention: c.config.TombstoneRetention,
		StatementTimeout:   c.config.StatementTimeout,
		NotifyDisabled:     c.config.NotifyDisabled,
		Logger:             c.config.Logger,
		NowFunc:            c.config.NowFunc,
		ToolFunc: func(name string) *attempt.Tool {
			tool := registry.Lookup(name)
			if tool == nil {
				return nil
			}
			return c.attemptTool(tool, nil)
		},
		Classify:      classifyError,
		FailureBody:   failureBody,
		AmbiguousFunc: Ambiguous,
		Observer:      c.observer,
	})
}

// attemptTool adapts a registered tool to the attempt machinery; p, when not
// nil, replaces its provider. The client's middleware runs outside the
// tool's. A transactional tool's attempts open a transaction of the
// client's.
func (c *Client[TTx]) attemptTool(tool *Tool, p Provider) *attempt.Tool {
	middleware := c.config.Middleware
	if p == nil {
		p = tool.Provider
	}
	t := &attempt.Tool{
		Name: tool.Name,
		Call: func(ctx context.Context, req attempt.Request) (json.RawMessage, error) {
			return p.Call(ctx, providerRequest(req))
		},
		Delivery:        tool.Delivery,
		KeyRetention:    tool.Opts.KeyRetention,
		Retention:       tool.Opts.Retention,
		ReplicatedClaim: tool.Opts.ReplicatedClaim,
		Wrap:            wrapFunc(middleware, tool.Opts.Middleware),
	}
	if tool.Delivery == Transactional {
		t.Call, t.Begin = nil, c.beginFunc(tool.Name, p)
	}
	if lookuper, ok := p.(Lookuper); ok {
		t.Lookup = func(ctx context.Context, req attempt.Request) (json.RawMessage, bool, error) {
			return lookuper.Lookup(ctx, providerRequest(req))
		}
	}
	return t
}

func providerRequest(req attempt.Request) Request {
	return Request{
		Key:       Key(req.Key),
		NaturalID: req.NaturalID,
		Tool:      req.Tool,
		Args:      req.Args,
		Attempt:   req.Attempt,
		Metadata:  decodeMetadata(req.Metadata),
	}
}

// classifyError tells a provider's errors apart: [Permanent] first, then
// uncertain ones ([IsAmbiguous]).
func classifyError(err error) attempt.ErrorKind {
	var permanent *PermanentError
	switch {
	case errors.As(err, &permanent):
		return attempt.Permanent
	case IsAmbiguous(err):
		return attempt.Ambiguous
	}
	return attempt.Retryable
}
