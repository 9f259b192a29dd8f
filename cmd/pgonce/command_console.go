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

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
)

// consoleTokenEnv names the variable that holds the console's token when
// --token is not given.
const consoleTokenEnv = "PGONCE_CONSOLE_TOKEN" //nolint:gosec // the name of a variable, not a credential

func consoleCommand() *command {
	return &command{
		name:     "console",
		synopsis: "console [--listen ADDR] [--token TOKEN] [--secure-cookie] [--read-only]",
		summary:  "serve the operator console in the browser",
		help: `Serves the operator console: an overview per tool of the last hour, the
last day or all time, each count a link to its keys; the keys by state,
tool, tenant, run and time; a search by what you know of a call (an order
id in its arguments, a natural id, a business key, a run id, a key); one
key's call, attempts, history, response and observation; and the actions
resolve, cancel and retry, on one key or on several selected at once, each
confirmed and recorded with who and why. It listens on loopback by
default. Any other
address needs a token of at least 16 bytes (--token or $` + consoleTokenEnv + `);
without one, the console generates one and prints it once. The browser
presents the token once as /?token=TOKEN and gets a session cookie for it
that lasts 12 hours and holds no token. Behind a proxy that terminates TLS,
--secure-cookie marks the cookies Secure. --read-only hides every action.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			listen := fs.String("listen", "127.0.0.1:8480", "address to listen on")
			token := fs.String("token", "", "access token required of every request, at least 16 bytes; else $"+consoleTokenEnv+
				"; off loopback, generated and printed when neither is set")
			secureCookie := fs.Bool("secure-cookie", false, "mark the cookies Secure: the console is served over HTTPS by a proxy in front")
			readOnly := fs.Bool("read-only", false, "show, never change: no actions")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("console takes no arguments")
				}
				if *token == "" {
					*token = os.Getenv(consoleTokenEnv)
				}
				if err := console.CheckToken(*token); err != nil {
					return usageErrorf("--token: %v", err)
				}
				generated := false
				if *token == "" && console.CheckListen(*listen, "") != nil {
					*token, generated = console.NewToken(), true
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
					Token: *token, SecureCookie: *secureCookie, ReadOnly: *readOnly, Schema: c.schema, Logger: e.logger(),
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
				if generated {
					// Shown once: it is kept nowhere else.
					fmt.Fprintf(e.stdout, "token (generated, shown once): %s\nopen http://%s/?token=%s\n", *token, listener.Addr(), *token)
				}
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
