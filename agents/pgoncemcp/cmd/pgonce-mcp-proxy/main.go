// Command pgonce-mcp-proxy serves MCP to clients and forwards to one
// upstream MCP server, a command it starts over stdio or a streamable-HTTP
// URL, and runs every call of the upstream's side-effecting tools through
// pgonce: at most once per action, or by key, as its configuration file
// says for each tool (package proxy).
//
// Usage:
//
//	pgonce-mcp-proxy -config FILE [-listen ADDR] [-log-level LEVEL]
//
// It serves over its standard input and output unless -listen gives an
// address to serve streamable HTTP on. It logs to standard error. The
// database URL comes from the environment ($PGONCE_DATABASE_URL, or the
// variable the file names); the schema must be migrated (pgonce migrate).
// It runs a reconciler for the calls a killed proxy left in flight.
//
// Exit codes: 0 when stopped by a signal or when its client went away, 1
// when the database or the upstream fails, 2 for bad flags or an invalid
// configuration file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is bad flags or configuration: exit 2, nothing started.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := serve(ctx, args, stdin, stdout, stderr)
	var usage usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, "pgonce-mcp-proxy:", err)
		return exitUsage
	default:
		fmt.Fprintln(stderr, "pgonce-mcp-proxy:", err)
		return exitFailure
	}
}

func serve(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pgonce-mcp-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "the proxy's configuration file (JSON; required)")
	listen := fs.String("listen", "", "serve streamable HTTP on this address (host:port) instead of stdio")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error; arguments are logged at debug only")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	if *configPath == "" {
		return usageError{errors.New("-config is required")}
	}
	var logLevel slog.Level
	if err := logLevel.UnmarshalText([]byte(*level)); err != nil {
		return usageError{fmt.Errorf("-log-level: %w", err)}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel}))
	config, err := proxy.LoadConfig(*configPath)
	if err != nil {
		return usageError{err}
	}
	url, err := config.DatabaseURL()
	if err != nil {
		return usageError{err}
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return usageError{fmt.Errorf("database URL: %w", err)}
	}
	defer pool.Close()
	outboxConfig := config.OutboxConfig()
	outboxConfig.Logger = logger
	client, err := outbox.NewPgx(pool, outboxConfig)
	if err != nil {
		return usageError{err}
	}
	if err := client.CheckSchema(ctx); err != nil {
		return fmt.Errorf("schema %q: %w (run pgonce migrate)", outboxConfig.Schema, err)
	}
	p, err := proxy.New(ctx, client, config, &proxy.Opts{Logger: logger, Stderr: stderr})
	if errors.Is(err, proxy.ErrInvalidConfig) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	defer func() { _ = p.Close() }()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reconciled := make(chan error, 1)
	if every := time.Duration(config.ReconcileEvery); every >= 0 {
		r, err := reconcile.New(client, reconcile.Config{Grace: time.Duration(config.ReconcileGrace), Logger: logger})
		if err != nil {
			return usageError{err}
		}
		go func() { reconciled <- r.Run(ctx, cmpDuration(every, proxy.ReconcileEveryDefault)) }()
	}

	served := make(chan error, 1)
	if *listen == "" {
		go func() {
			served <- p.Server().Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}})
		}()
	} else {
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return usageError{fmt.Errorf("-listen: %w", err)}
		}
		logger.Info("mcp proxy: serving streamable HTTP", "addr", ln.Addr().String())
		srv := &http.Server{
			Handler:           mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return p.Server() }, nil),
			ReadHeaderTimeout: 10 * time.Second,
		}
		go func() { served <- srv.Serve(ln) }()
		go func() {
			<-ctx.Done()
			shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdown)
		}()
	}
	select {
	case err := <-served:
		if ctx.Err() != nil || err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case err := <-reconciled:
		return fmt.Errorf("reconcile: %w", err)
	case <-ctx.Done():
		return nil
	}
}

// cmpDuration returns d, or def when d is zero.
func cmpDuration(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// nopWriteCloser leaves standard output open when the session ends.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
