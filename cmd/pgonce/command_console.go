package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/pgonce/pgonce/internal/console"
)

// consoleTokenEnv names the variable that holds the console's token when
// --token is not given.
const consoleTokenEnv = "PGONCE_CONSOLE_TOKEN" //nolint:gosec // the name of a variable, not a credential

func consoleCommand() *command {
	return &command{
		name:     "console",
		synopsis: "console [--listen ADDR] [--token TOKEN] [--read-only]",
		summary:  "serve the operator console in the browser",
		help: `Serves the operator console: an overview per tool, the keys by state,
tool, tenant, run and time, one key's call, history, response and
observation, and the actions resolve, cancel and retry, each confirmed and
recorded with who and why. It listens on loopback by default; any other
address needs a token (--token or $` + consoleTokenEnv + `), which the
browser presents once as /?token=TOKEN. --read-only hides every action.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			listen := fs.String("listen", "127.0.0.1:8480", "address to listen on")
			token := fs.String("token", "", "access token required of every request; else $"+consoleTokenEnv)
			readOnly := fs.Bool("read-only", false, "show, never change: no actions")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("console takes no arguments")
				}
				if *token == "" {
					*token = os.Getenv(consoleTokenEnv)
				}
				if err := console.CheckListen(*listen, *token); err != nil {
					return usageErrorf("%v", err)
				}
				c, client, err := e.migratedClient(ctx)
				if err != nil {
					return err
				}
				defer c.close()
				handler, err := console.New(client, console.Config{
					Token: *token, ReadOnly: *readOnly, Schema: c.schema, Logger: e.logger(),
				})
				if err != nil {
					return err
				}
				listener, err := net.Listen("tcp", *listen)
				if err != nil {
					return err
				}
				server := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
				fmt.Fprintf(e.stdout, "pgonce console on http://%s/ (schema %s)\n", listener.Addr(), c.schema)
				done := make(chan error, 1)
				go func() { done <- server.Serve(listener) }()
				select {
				case err := <-done:
					return err
				case <-ctx.Done():
				}
				shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if err := server.Shutdown(shutdownCtx); err != nil {
					return err
				}
				if err := <-done; !errors.Is(err, http.ErrServerClosed) {
					return err
				}
				return nil
			}
		},
	}
}
