package pgoncemcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// methodCallTool is the method of a tool call.
const methodCallTool = "tools/call"

// Anonymous says what a [Guard] does with a call of a side-effecting tool
// whose _meta names no action.
type Anonymous int

const (
	// Refuse answers the call with a JSON-RPC invalid-params error that
	// tells the client's developer what to send; nothing runs.
	Refuse Anonymous = iota
	// PassThrough runs the call as if there were no guard: at least once
	// per request, as without pgonce.
	PassThrough
)

// ServerConfig configures a [Guard]. Its zero value works.
type ServerConfig struct {
	// Anonymous says what to do with a call of a guarded tool whose _meta
	// names no action. Defaults to [Refuse].
	Anonymous Anonymous

	// TenantFunc returns the tenant of a call's key, so that clients never
	// share keys, and never read each other's results: the authenticated
	// principal, say. Defaults to the user id of the request's bearer token
	// (req.Extra.TokenInfo.UserID) when there is one, else none: every
	// client of the server then names its actions in one namespace.
	TenantFunc func(ctx context.Context, req *mcp.CallToolRequest) string

	// ToolNameFunc maps a tool's MCP name to the name it is registered
	// under in pgonce's registry, for MCP names that are not pgonce tool
	// names (^[a-z][a-z0-9_.:-]{0,63}$). Defaults to the name itself.
	ToolNameFunc func(name string) string
}

// Guard makes the side-effecting tools of an MCP server exactly-once: a call
// that names its action in its _meta ([MetaKey], or [MetaRunID] and
// [MetaStep]) runs at most once per action, however often a client sends it,
// and every later call gets the tool's stored result verbatim. It is a
// receiving middleware: add [Guard.Middleware] to the server
// ([mcp.Server.AddReceivingMiddleware]), and add each side-effecting tool with
// [AddTool] (or protect it with [Guard.Protect]).
//
// A call of a guarded tool:
//
//   - names its action, and runs inline through the pgonce client
//     ([outbox.Client.Do]): the claim commits before the handler runs; the
//     handler runs under the action's request ([toolcall.RequestFromContext],
//     whose key it can pass downstream); its result is stored as JSON and
//     decoded the same way for this call and every later one, so each gets
//     the same bytes but for the mark pgonce adds to its _meta
//     ([MetaAction]), which says whether it is replayed. A result marked as an error is the tool's answer,
//     stored as the key's failure and replayed the same way, unless the
//     handler's error (see [mcp.CallToolResult.GetError]) is wrapped with
//     [outbox.Ambiguous] or [outbox.RetryAfter]. A JSON-RPC error, and a
//     result that needs the client's input, are handed back as they are and
//     leave the action to run again at the next call.
//   - finds its action running elsewhere: a result marked as an error
//     whose text says "in progress, retry after …", with the observation in
//     its _meta ([MetaObservation]). Nothing runs.
//   - names its action with other arguments or another tool (a conflict),
//     with arguments that are not a JSON object, or after the action
//     expired: a result marked as an error with the observation. Nothing
//     runs.
//   - names no action: refused with a JSON-RPC invalid-params error, or run
//     as without a guard, as [ServerConfig.Anonymous] says.
//   - names it in a malformed way (a key or run id that is not a non-empty
//     string of at most [outbox.CallStringMaxBytes] bytes of UTF-8 without
//     NUL, a step that is not an integer from 0 to 2^53-1, a run without a
//     step): refused with a JSON-RPC invalid-params error that names the
//     _meta name and the rule. Nothing runs.
//
// A call whose _meta has both a key and a run with a step is named by the
// key; the run and the step are then ignored.
//
// Tools the guard does not know, and tools annotated read-only, pass through
// untouched. A Guard is safe for concurrent use.
type Guard[TTx any] struct {
	client *outbox.Client[TTx]
	config ServerConfig
	mu     sync.RWMutex
	tools  map[string]string // MCP name to pgonce name, of the guarded tools
}

// NewGuard returns a guard over client, whose registry the guarded tools are
// registered in. It returns an error matching [ErrInvalidConfig] for a nil
// client or an unknown [ServerConfig.Anonymous].
func NewGuard[TTx any](client *outbox.Client[TTx], config ServerConfig) (*Guard[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client is nil", ErrInvalidConfig)
	}
	if config.Anonymous != Refuse && config.Anonymous != PassThrough {
		return nil, fmt.Errorf("%w: Anonymous must be Refuse or PassThrough, got %d", ErrInvalidConfig, config.Anonymous)
	}
	if config.TenantFunc == nil {
		config.TenantFunc = tokenUser
	}
	if config.ToolNameFunc == nil {
		config.ToolNameFunc = func(name string) string { return name }
	}
	return &Guard[TTx]{client: client, config: config, tools: map[string]string{}}, nil
}

// tokenUser is the default tenant: the user id of the request's bearer
// token.
func tokenUser(_ context.Context, req *mcp.CallToolRequest) string {
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		return req.Extra.TokenInfo.UserID
	}
	return ""
}

// Protect guards tool, a tool of the server, with delivery: how an attempt
// whose outcome is unknown (the server crashed while the handler ran) is made
// certain. [outbox.IdempotentByKey] runs the handler again with the same key,
// for a handler that passes the key downstream; [outbox.AtMostOnce] sends the
// action to review instead. A tool annotated read-only
// ([mcp.ToolAnnotations.ReadOnlyHint]) is not guarded, and Protect returns
// nil.
//
// The tool is registered in the client's registry under its name (mapped by
// [ServerConfig.ToolNameFunc]), run only through the guard
// ([outbox.ToolOpts.InlineOnly]): no dispatcher runs it, and a call left
// pending runs at the next call of the same action. Keys in flight when the
// server crashed are resolved by a reconciler over the client (package
// reconcile), which the server must run. Protect returns an error matching
// [ErrInvalidTool] for a name that is not a pgonce tool name, a name already
// registered, or [outbox.LookupByNaturalID].
func (g *Guard[TTx]) Protect(tool *mcp.Tool, delivery outbox.Delivery) error {
	if tool.Annotations != nil && tool.Annotations.ReadOnlyHint {
		return nil
	}
	name := g.config.ToolNameFunc(tool.Name)
	if err := register(g.client.Config().Registry, name, delivery); err != nil {
		return fmt.Errorf("protect tool %q: %w", tool.Name, err)
	}
	g.mu.Lock()
	g.tools[tool.Name] = name
	g.mu.Unlock()
	return nil
}

// AddTool adds a tool to server s, as [mcp.AddTool] does, and guards it with
// g ([Guard.Protect]) unless it is annotated read-only. It returns Protect's
// error, and then adds nothing.
func AddTool[TTx, In, Out any](s *mcp.Server, g *Guard[TTx], t *mcp.Tool, delivery outbox.Delivery, h mcp.ToolHandlerFor[In, Out]) error {
	if err := g.Protect(t, delivery); err != nil {
		return err
	}
	mcp.AddTool(s, t, h)
	return nil
}

// Middleware is the guard as an [mcp.Middleware]: add it to the server with
// [mcp.Server.AddReceivingMiddleware]. It handles tools/call requests of
// guarded tools and passes every other request on.
func (g *Guard[TTx]) Middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if method != methodCallTool || !ok || call.Params == nil {
			return next(ctx, method, req)
		}
		g.mu.RLock()
		name, guarded := g.tools[call.Params.Name]
		g.mu.RUnlock()
		if !guarded {
			return next(ctx, method, req)
		}
		act, err := actionOf(call.Params.Meta)
		switch {
		case errors.Is(err, errNoAction) && g.config.Anonymous == PassThrough:
			return next(ctx, method, req)
		case errors.Is(err, errNoAction):
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
				"pgonce: tool %q has side effects and runs once per action, so a call must name its action: "+
					"set %q (an idempotency key), or %q and %q (the run and the call's step in it), in the request's _meta",
				call.Params.Name, MetaKey, MetaRunID, MetaStep)}
		case err != nil:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "pgonce: " + err.Error()}
		}
		args, err := toolcall.Arguments(string(call.Params.Arguments))
		if err != nil {
			return answer(outbox.Result{}, err), nil
		}
		oc := outbox.Call{
			Tenant: g.config.TenantFunc(ctx, call), Tool: name, Args: args,
			Key: act.key, RunID: act.runID, Step: act.step,
		}
		// What the handler returned that is not an outcome: a JSON-RPC
		// error, or a result that needs the client's input. It goes back as
		// it is, and the action stays to run again.
		var handedBack struct {
			sync.Mutex
			res mcp.Result
			err error
		}
		provider := outbox.ProviderFunc(func(ctx context.Context, preq outbox.Request) (json.RawMessage, error) {
			res, err := next(toolcall.ContextWithRequest(ctx, preq), method, req)
			handedBack.Lock()
			defer handedBack.Unlock()
			if err != nil {
				handedBack.err = err
				return nil, err
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
			return storeResult(result, result.GetError())
		})
		// The action is finished and recorded even when the client goes
		// away meanwhile: it may have acted, and a recorded outcome is what
		// its next call gets. The handler still runs under the client's
		// CallTimeout.
		res, err := g.client.Do(context.WithoutCancel(ctx), oc, provider)
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

// storeResult returns what to store of a tool's result: its JSON as the
// response, or, for a result marked as an error, as the key's failure,
// unless cause says that nothing is final yet.
func storeResult(result *mcp.CallToolResult, cause error) (json.RawMessage, error) {
	stored, err := json.Marshal(result)
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("marshal the tool's result: %w", err))
	}
	if !result.IsError {
		return stored, nil
	}
	var retry *outbox.RetryAfterError
	if cause != nil && (outbox.IsAmbiguous(cause) || errors.As(cause, &retry)) {
		return nil, cause
	}
	return nil, outbox.PermanentBody(stored, cause)
}

// register registers a tool that only an adapter's middleware runs, with the
// provider it passes each time.
func register(registry *outbox.Registry, name string, delivery outbox.Delivery) error {
	if delivery == outbox.LookupByNaturalID {
		return fmt.Errorf("%w: %v needs a lookup, which a tool call cannot offer", ErrInvalidTool, delivery)
	}
	if registry.Lookup(name) != nil {
		return fmt.Errorf("%w: %q is already registered", ErrInvalidTool, name)
	}
	inline := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, outbox.Permanent(errors.New("runs only through its MCP middleware"))
	})
	if err := registry.RegisterWithOpts(name, inline, delivery, &outbox.ToolOpts{InlineOnly: true}); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTool, err)
	}
	return nil
}
