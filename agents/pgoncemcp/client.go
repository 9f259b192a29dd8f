package pgoncemcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// ClientConfig configures a [Caller]. Its zero value works.
type ClientConfig struct {
	// TenantFunc returns the tenant of a call's key, for an agent with
	// tenants of its own. Defaults to none.
	TenantFunc func(ctx context.Context) string

	// ToolNameFunc maps a remote tool's MCP name to the name it is
	// registered under in pgonce's registry, for MCP names that are not
	// pgonce tool names (^[a-z][a-z0-9_.:-]{0,63}$). Defaults to the name
	// itself.
	ToolNameFunc func(name string) string
}

// Caller makes an agent's calls of remote MCP tools exactly-once from the
// agent's side. It is a sending middleware: add [Caller.Middleware] to the
// client ([mcp.Client.AddSendingMiddleware]), and register each remote tool
// with side effects with [Caller.Register].
//
// A call of a registered tool names its action in its _meta, by the run and
// the call's step in it ([StepMeta], [CallParams]) or by a key
// ([KeyMeta]). The caller derives the pgonce key on the agent's side, runs
// the call through pgonce ([outbox.Client.Do]) and sends it with the key in
// its _meta ([MetaKey]) in place of the run and step, so that a server that
// honours it (one guarded by a [Guard]) runs the action once whatever the
// agent's retries. The server's result is stored on the agent's side too,
// and every later call of the action gets it back without sending anything.
//
// How a call whose outcome is unknown (a lost connection, a crash of the
// agent after sending) is made certain is the tool's delivery: exactly once
// end to end with [outbox.IdempotentByKey], for a server that honours the
// key, which is sent again; at most once, or reviewed by an operator, with
// [outbox.AtMostOnce], for a server that does not.
//
// A result the server marks as an error is the tool's answer, stored and
// replayed like a success, unless the server's guard made it ([MetaObservation]
// in its _meta: an action in progress there, say), which is handed back and
// leaves the action to run again at the next call. A JSON-RPC error and a
// transport error are returned as they are; the next call of the action
// sends it again (after a transport error, only for an IdempotentByKey tool).
// Calls of tools not registered are sent untouched. A result the caller
// answers carries its own mark in its _meta ([MetaAction]): the key it
// derived, and whether the result is a replay (stored on the agent's side,
// or replayed by the server). A Caller is safe for concurrent use.
type Caller[TTx any] struct {
	client *outbox.Client[TTx]
	config ClientConfig
	mu     sync.RWMutex
	tools  map[string]string // MCP name to pgonce name, of the registered tools
}

// NewCaller returns a caller over client, whose registry the remote tools are
// registered in. It returns an error matching [ErrInvalidConfig] for a nil
// client.
func NewCaller[TTx any](client *outbox.Client[TTx], config ClientConfig) (*Caller[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client is nil", ErrInvalidConfig)
	}
	if config.TenantFunc == nil {
		config.TenantFunc = func(context.Context) string { return "" }
	}
	if config.ToolNameFunc == nil {
		config.ToolNameFunc = func(name string) string { return name }
	}
	return &Caller[TTx]{client: client, config: config, tools: map[string]string{}}, nil
}

// Register makes calls of the remote tool named tool exactly-once, with
// delivery: [outbox.IdempotentByKey] for a server that honours the key it is
// sent, [outbox.AtMostOnce] for one that does not. The tool is registered in
// the client's registry under its name (mapped by
// [ClientConfig.ToolNameFunc]), run only through the caller
// ([outbox.ToolOpts.InlineOnly]). It returns an error matching
// [ErrInvalidTool] for a name that is not a pgonce tool name, a name already
// registered, or [outbox.LookupByNaturalID].
func (c *Caller[TTx]) Register(tool string, delivery outbox.Delivery) error {
	name := c.config.ToolNameFunc(tool)
	if err := register(c.client.Config().Registry, name, delivery); err != nil {
		return fmt.Errorf("register tool %q: %w", tool, err)
	}
	c.mu.Lock()
	c.tools[tool] = name
	c.mu.Unlock()
	return nil
}

// Middleware is the caller as an [mcp.Middleware]: add it to the client with
// [mcp.Client.AddSendingMiddleware]. It handles tools/call requests of
// registered tools and passes every other request on.
//
// A call of a registered tool that names no action returns [ErrNoAction],
// one that names it in a malformed way returns [ErrInvalidMeta], and one whose arguments are not a JSON object with a canonical form returns
// a result marked as an error with the invalid_arguments observation; nothing
// is sent.
func (c *Caller[TTx]) Middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != methodCallTool {
			return next(ctx, method, req)
		}
		call, ok := req.GetParams().(*mcp.CallToolParams)
		if !ok || call == nil {
			return next(ctx, method, req)
		}
		c.mu.RLock()
		name, registered := c.tools[call.Name]
		c.mu.RUnlock()
		if !registered {
			return next(ctx, method, req)
		}
		act, err := actionOf(call.Meta)
		if errors.Is(err, errNoAction) {
			return nil, fmt.Errorf("%w (tool %q)", ErrNoAction, call.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidMeta, err)
		}
		args, err := arguments(call.Arguments)
		if err != nil {
			return answer(outbox.Result{}, err), nil
		}
		oc := outbox.Call{
			Tenant: c.config.TenantFunc(ctx), Tool: name, Args: args,
			Key: act.key, RunID: act.runID, Step: act.step,
		}
		// What the server returned that is not an outcome: an error, or a
		// result its guard made. It goes back as it is, and the action stays
		// to run again.
		var handedBack struct {
			sync.Mutex
			res mcp.Result
			err error
		}
		asked := ctx
		provider := outbox.ProviderFunc(func(ctx context.Context, preq outbox.Request) (json.RawMessage, error) {
			// The agent giving up ends the request, not the recording.
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(asked, cancel)()
			params := *call
			params.Meta = maps.Clone(call.Meta)
			delete(params.Meta, MetaRunID)
			delete(params.Meta, MetaStep)
			params.Meta[MetaKey] = string(preq.Key)
			res, err := next(ctx, method, withParams(req, &params))
			handedBack.Lock()
			defer handedBack.Unlock()
			if err != nil {
				handedBack.err = err
				var wire *jsonrpc.Error
				if errors.As(err, &wire) {
					return nil, err // the server answered: nothing ran
				}
				return nil, outbox.Ambiguous(err)
			}
			result, ok := res.(*mcp.CallToolResult)
			if !ok {
				handedBack.res = res
				return nil, outbox.Permanent(fmt.Errorf("tools/call returned a %T", res))
			}
			if result.NeedsInput() {
				handedBack.res = res
				return nil, errors.New("the tool needs the client's input")
			}
			if obs, ok := ObservationOf(result); ok && unsettled(obs.Status) {
				handedBack.res = res
				return nil, outbox.RetryAfter(fmt.Errorf("the server reports %s", obs.Status),
					time.Duration(obs.RetryAfterMS)*time.Millisecond)
			}
			return storeResult(result, nil)
		})
		// Recorded even when ctx ends meanwhile: the request may have acted,
		// and what it left is what the next call of the action needs.
		res, err := c.client.Do(context.WithoutCancel(ctx), oc, provider)
		handedBack.Lock()
		defer handedBack.Unlock()
		if handedBack.err != nil {
			return nil, handedBack.err
		}
		if handedBack.res != nil {
			return handedBack.res, nil
		}
		return answer(res, err), nil
	}
}

// unsettled reports whether a server's guard reports an action whose outcome
// may still come: asking again later may get it.
func unsettled(status outbox.ObservationStatus) bool {
	switch status {
	case outbox.ObservationInProgress, outbox.ObservationNeedsReview,
		outbox.ObservationUnavailable, outbox.ObservationError:
		return true
	default:
		return false
	}
}

// arguments returns the canonical form of a call's arguments, any value the
// SDK would send: JSON text (json.RawMessage), a map, a struct.
func arguments(v any) (json.RawMessage, error) {
	switch v := v.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		return toolcall.Arguments(string(v))
	case []byte:
		return toolcall.Arguments(string(v))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", toolcall.ErrInvalidArguments,
			&outbox.NotCanonicalError{Path: "$", Reason: "the arguments cannot be marshalled", Err: err})
	}
	return toolcall.Arguments(string(b))
}

// withParams returns a copy of req, a tools/call request, with params.
func withParams(req mcp.Request, params *mcp.CallToolParams) mcp.Request {
	switch r := req.(type) {
	case *mcp.ClientRequest[mcp.Params]:
		c := *r
		c.Params = params
		return &c
	case *mcp.ClientRequest[*mcp.CallToolParams]:
		c := *r
		c.Params = params
		return &c
	default:
		// A request of a shape this SDK version does not make: send it with
		// the key set in its own parameters.
		if own, ok := req.GetParams().(*mcp.CallToolParams); ok {
			*own = *params
		}
		return req
	}
}
