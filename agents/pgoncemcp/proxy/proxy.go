package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// TestHoldEnv names an environment variable for tests only, never for
// production: set to a tool's MCP name, the proxy writes [TestHoldLine] and
// the tool's name to its standard error once the upstream has answered a call
// of that tool, and then holds the call forever, before pgonce records the
// answer. A test kills the proxy there, between the upstream's effect and
// its record, the one moment a crash leaves an outcome unknown.
const TestHoldEnv = "PGONCE_MCP_PROXY_TEST_HOLD_AFTER"

// TestHoldLine begins the line the proxy writes when [TestHoldEnv] holds a
// call.
const TestHoldLine = "pgonce-mcp-proxy: test hold after the upstream answered:"

// Opts holds what a configuration file cannot: where the proxy logs and where
// the upstream command's standard error goes. A nil *Opts takes the
// defaults.
type Opts struct {
	// Logger receives the proxy's log. It logs tools, keys and outcomes at
	// INFO and above, and arguments only at DEBUG; never a credential.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Stderr receives the upstream command's standard error. Defaults to
	// the proxy's own.
	Stderr io.Writer
}

// Proxy serves MCP to clients and forwards every request of theirs for the
// upstream's tools to the one upstream MCP server. It lists the upstream's
// tools as they are, passes the calls of read-only tools straight through,
// and runs every call of a side-effecting tool through pgonce with the key
// rules of package pgoncemcp ([pgoncemcp.Guard]): the action named by the
// key, or the run and step, in the call's _meta; the stored result replayed
// verbatim; a duplicate while the first runs told "in progress"; a key
// reused with other arguments a conflict. The key goes downstream in the
// forwarded request's _meta ([pgoncemcp.MetaKey]), so that an upstream that
// honours it deduplicates too.
//
// A Proxy is safe for concurrent use. Close ends its upstream.
type Proxy[TTx any] struct {
	config   Config
	logger   *slog.Logger
	client   *outbox.Client[TTx]
	guard    *pgoncemcp.Guard[TTx]
	server   *mcp.Server
	upstream *mcp.ClientSession
	closed   chan struct{}
	close    sync.Once

	mu      sync.Mutex
	guarded map[string]bool // MCP names of the tools the guard protects
	served  map[string]bool // MCP names of the tools the server lists

	// afterUpstreamFunc runs after the upstream answered a call, before
	// pgonce records it: a test's hook ([TestHoldEnv]).
	afterUpstreamFunc func(ctx context.Context, tool string)
}

// New starts or connects to config's upstream, lists its tools and returns a
// proxy that serves them over client, whose registry the side-effecting
// tools are registered in (it must know none of them yet; pgonce's console,
// CLI and flow control see them under their names). The proxy follows the
// upstream's tool list as it changes.
//
// It returns an error matching [ErrInvalidConfig] for an invalid config or a
// tool that cannot be registered, and [ErrUpstream] when the upstream cannot
// be started, initialised or listed. Read [Config.OutboxConfig] for the
// client's config.
func New[TTx any](ctx context.Context, client *outbox.Client[TTx], config Config, opts *Opts) (*Proxy[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client is nil", ErrInvalidConfig)
	}
	if err := config.validate(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &Opts{}
	}
	anonymous := pgoncemcp.Refuse
	if config.Anonymous == AnonymousPassThrough {
		anonymous = pgoncemcp.PassThrough
	}
	guard, err := pgoncemcp.NewGuard(client, pgoncemcp.ServerConfig{Anonymous: anonymous, ToolNameFunc: config.pgonceName})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	p := &Proxy[TTx]{
		config:  config,
		logger:  cmp.Or(opts.Logger, slog.Default()),
		client:  client,
		guard:   guard,
		closed:  make(chan struct{}),
		guarded: map[string]bool{},
		served:  map[string]bool{},
	}
	if tool := os.Getenv(TestHoldEnv); tool != "" {
		p.afterUpstreamFunc = p.holdForever(tool)
	}

	transport, err := config.Upstream.transport(cmp.Or[io.Writer](opts.Stderr, os.Stderr))
	if err != nil {
		return nil, err
	}
	upstreamClient := mcp.NewClient(&mcp.Implementation{Name: "pgonce-mcp-proxy", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(ctx context.Context, _ *mcp.ToolListChangedRequest) {
			if err := p.sync(ctx); err != nil {
				p.logger.ErrorContext(ctx, "mcp proxy: follow the upstream's tool list", "err", err)
			}
		},
	})
	p.upstream, err = upstreamClient.Connect(ctx, transport, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: connect: %w", ErrUpstream, err)
	}
	init := p.upstream.InitializeResult()
	impl := &mcp.Implementation{Name: "pgonce-mcp-proxy", Version: "1"}
	var instructions string
	if init != nil && init.ServerInfo != nil {
		impl, instructions = init.ServerInfo, init.Instructions
	}
	p.server = mcp.NewServer(impl, &mcp.ServerOptions{Instructions: instructions, Logger: p.logger})
	p.server.AddReceivingMiddleware(guard.Middleware)
	if err := p.sync(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// Server returns the MCP server that clients talk to: run it over stdio
// ([mcp.Server.Run] with an [mcp.StdioTransport]) or serve it over HTTP
// ([mcp.NewStreamableHTTPHandler]). Over HTTP, each call's Authorization
// header goes with it to an HTTP upstream.
func (p *Proxy[TTx]) Server() *mcp.Server { return p.server }

// Close ends the upstream session, and the upstream command with it. A call
// held by [TestHoldEnv] is let go.
func (p *Proxy[TTx]) Close() error {
	p.close.Do(func() { close(p.closed) })
	if p.upstream == nil {
		return nil
	}
	return p.upstream.Close()
}

// sync makes the server's tools the upstream's: each added as it is, guarded
// unless it is read-only; each gone removed.
func (p *Proxy[TTx]) sync(ctx context.Context) error {
	var tools []*mcp.Tool
	for tool, err := range p.upstream.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("%w: list tools: %w", ErrUpstream, err)
		}
		tools = append(tools, tool)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	listed := map[string]bool{}
	var errs []error
	for _, tool := range tools {
		if err := p.add(tool); err != nil {
			errs = append(errs, err)
			continue
		}
		listed[tool.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(p.config.Tools)) {
		if !listed[name] {
			p.logger.WarnContext(ctx, "mcp proxy: a configured tool is not among the upstream's", "tool", name)
		}
	}
	var gone []string
	for name := range p.served {
		if !listed[name] {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		p.server.RemoveTools(gone...)
	}
	p.served = listed
	return errors.Join(errs...)
}

// add adds one upstream tool to the server, guarded unless it is read-only.
// p.mu is held.
func (p *Proxy[TTx]) add(tool *mcp.Tool) error {
	if !objectSchema(tool.InputSchema) {
		return fmt.Errorf("%w: tool %q: its input schema is not a JSON object schema", ErrUpstream, tool.Name)
	}
	readOnly := tool.Annotations != nil && tool.Annotations.ReadOnlyHint
	conf := p.config.Tools[tool.Name]
	if conf.ReadOnly != nil {
		readOnly = *conf.ReadOnly
	}
	if !readOnly && !p.guarded[tool.Name] {
		delivery, err := conf.Delivery.outbox()
		if err != nil {
			return err
		}
		// The guard passes a tool annotated read-only through; the
		// configuration said otherwise, so it sees the name alone.
		if err := p.guard.Protect(&mcp.Tool{Name: tool.Name}, delivery); err != nil {
			return fmt.Errorf("%w: %w (set tools[%q].name)", ErrInvalidConfig, err, tool.Name)
		}
		p.guarded[tool.Name] = true
	}
	if readOnly && p.guarded[tool.Name] {
		// A tool once guarded stays guarded: its keys must keep their
		// rules while any of them is in flight.
		p.logger.Warn("mcp proxy: the upstream now marks a guarded tool read-only; it stays guarded", "tool", tool.Name)
	}
	p.server.AddTool(tool, p.forward)
	return nil
}

// objectSchema reports whether an input schema is the JSON object schema
// the SDK requires of a tool's.
func objectSchema(schema any) bool {
	m, ok := schema.(map[string]any)
	return ok && m["type"] == "object"
}

// forward sends a client's call to the upstream. Under the guard, the
// action's key replaces the run and step in the forwarded _meta.
func (p *Proxy[TTx]) forward(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	params := &mcp.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments, Meta: maps.Clone(req.Params.Meta)}
	key := ""
	if preq, ok := toolcall.RequestFromContext(ctx); ok {
		key = string(preq.Key)
		if params.Meta == nil {
			params.Meta = mcp.Meta{}
		}
		delete(params.Meta, pgoncemcp.MetaRunID)
		delete(params.Meta, pgoncemcp.MetaStep)
		params.Meta[pgoncemcp.MetaKey] = key
	}
	if req.Extra != nil && req.Extra.Header != nil {
		if auth := req.Extra.Header.Get("Authorization"); auth != "" {
			ctx = context.WithValue(ctx, authorizationKey{}, auth)
		}
	}
	p.logger.InfoContext(ctx, "mcp proxy: forward", "tool", params.Name, "key", key)
	p.logger.DebugContext(ctx, "mcp proxy: forward arguments", "tool", params.Name, "arguments", string(req.Params.Arguments))
	res, err := p.upstream.CallTool(ctx, params)
	if err != nil {
		var wire *jsonrpc.Error
		if errors.As(err, &wire) {
			// The upstream answered that it ran nothing: its error goes back
			// as it is, without the SDK's "calling ..." wrapping, and the
			// action may run at its next call.
			return nil, wire
		}
		// The request may have reached the upstream and acted: the
		// tool's delivery settles it.
		p.logger.WarnContext(ctx, "mcp proxy: upstream call", "tool", params.Name, "key", key, "err", err)
		return nil, outbox.Ambiguous(fmt.Errorf("upstream: %w", err))
	}
	if p.afterUpstreamFunc != nil {
		p.afterUpstreamFunc(ctx, params.Name)
	}
	return res, nil
}

// holdForever returns the hook of [TestHoldEnv].
func (p *Proxy[TTx]) holdForever(tool string) func(context.Context, string) {
	return func(_ context.Context, name string) {
		if name != tool {
			return
		}
		fmt.Fprintln(os.Stderr, TestHoldLine, name)
		<-p.closed
	}
}

// transport returns the transport to the upstream: a command over stdio,
// or a streamable-HTTP client.
func (u Upstream) transport(stderr io.Writer) (mcp.Transport, error) {
	if u.Command != "" {
		cmd := exec.Command(u.Command, u.Args...) //nolint:gosec // the operator names the upstream
		cmd.Dir = u.Dir
		if len(u.Env) > 0 {
			cmd.Env = os.Environ()
			for _, k := range slices.Sorted(maps.Keys(u.Env)) {
				cmd.Env = append(cmd.Env, k+"="+u.Env[k])
			}
		}
		cmd.Stderr = stderr
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil
	}
	static := http.Header{}
	for header, env := range u.HeaderEnv {
		value, ok := os.LookupEnv(env)
		if !ok {
			return nil, fmt.Errorf("%w: upstream header_env[%q]: $%s is not set", ErrInvalidConfig, header, env)
		}
		static.Set(header, value)
	}
	return &mcp.StreamableClientTransport{
		Endpoint:   u.URL,
		HTTPClient: &http.Client{Transport: &headerTransport{base: http.DefaultTransport, static: static}},
	}, nil
}

// authorizationKey is the context key of a client's Authorization header,
// which the call it came with carries to an HTTP upstream.
type authorizationKey struct{}

// headerTransport sets the configured headers, and a client's Authorization
// header, on each request to an HTTP upstream.
type headerTransport struct {
	base   http.RoundTripper
	static http.Header
}

// RoundTrip sends r with the headers.
func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	auth, _ := r.Context().Value(authorizationKey{}).(string)
	if len(t.static) == 0 && auth == "" {
		return t.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	for k, v := range t.static {
		r.Header[k] = slices.Clone(v)
	}
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	return t.base.RoundTrip(r)
}
