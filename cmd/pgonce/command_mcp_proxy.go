package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// mcpProxyBinary is the program `pgonce mcp-proxy` runs. It lives in the
// pgoncemcp module, so that the core module never depends on an agent SDK.
const mcpProxyBinary = "pgonce-mcp-proxy"

// mcpProxyInstall is how to install it.
const mcpProxyInstall = "go install github.com/pgonce/pgonce/agents/pgoncemcp/cmd/pgonce-mcp-proxy@latest"

func mcpProxyCommand() *command {
	return &command{
		name:       "mcp-proxy",
		synopsis:   "mcp-proxy --config FILE [--listen ADDR] [--log-level LEVEL]",
		summary:    "serve an MCP server's tools exactly-once (runs pgonce-mcp-proxy)",
		noSchema:   true,
		noDatabase: true,
		help: `Serves MCP to clients and forwards to one upstream MCP server, running
every call of its side-effecting tools through pgonce: by key or at most
once, as the configuration file says for each tool (docs/agents.md, "MCP
proxy"). Serves over standard input and output unless --listen is given.

The proxy is its own program, pgonce-mcp-proxy, found on the PATH (or
named by --binary), so that this CLI carries no MCP SDK. Install it with:

    ` + mcpProxyInstall + `

It reads the database URL from $PGONCE_DATABASE_URL (or the variable its
file names) and pgonce's schema from its file, not from this CLI's global
flags. Its exit code is this command's.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			config := fs.String("config", "", "the proxy's configuration file (JSON; required)")
			listen := fs.String("listen", "", "serve streamable HTTP on this address (host:port) instead of stdio")
			level := fs.String("log-level", "info", "log level: debug, info, warn or error; arguments are logged at debug only")
			binary := fs.String("binary", "", "the pgonce-mcp-proxy program to run (default: the one on the PATH)")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				if *config == "" {
					return usageErrorf("--config is required")
				}
				proxyArgs := []string{"-config", *config, "-log-level", *level}
				if *listen != "" {
					proxyArgs = append(proxyArgs, "-listen", *listen)
				}
				return e.mcpProxy(ctx, *binary, proxyArgs)
			}
		},
	}
}

// mcpProxy runs pgonce-mcp-proxy with args over this process's standard
// input and output, and ends with its exit code.
func (e *env) mcpProxy(ctx context.Context, binary string, args []string) error {
	if binary == "" {
		path, err := exec.LookPath(mcpProxyBinary)
		if err != nil {
			return &exitError{code: exitFailure, msg: fmt.Sprintf(
				"%s is not on the PATH: install it with `%s` (it is a program of its own, so that pgonce carries no MCP SDK), or name it with --binary",
				mcpProxyBinary, mcpProxyInstall)}
		}
		binary = path
	}
	cmd := exec.CommandContext(ctx, binary, args...) //nolint:gosec // the operator names the program
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	// An interrupt stops the proxy as a signal of its own would.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exitErr) && exitErr.ExitCode() > 0:
		return &exitError{code: exitErr.ExitCode(), msg: fmt.Sprintf("%s exited with code %d", mcpProxyBinary, exitErr.ExitCode())}
	case ctx.Err() != nil:
		return nil
	default:
		return fmt.Errorf("run %s: %w", binary, err)
	}
}
