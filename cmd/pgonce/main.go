// Command pgonce is the operator CLI for pgonce: it migrates a schema,
// reports on it (status, inspect), resolves keys that need review, prunes
// retention, reconciles expired leases without provider code, and runs the
// refund demo.
//
// Usage:
//
//	pgonce [--database-url URL] [--schema NAME] COMMAND [flags] [args]
//
// Run `pgonce help` for the commands and `pgonce COMMAND --help` for a
// command's flags. Exit codes are documented in [exitOK] and docs/cli.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// Exit codes. Scripts and alerting may rely on them.
const (
	// exitOK: the command did what it was asked.
	exitOK = 0
	// exitFailure: the command failed: database unreachable, schema not
	// migrated, a database error, a reconcile error, a broken demo
	// invariant.
	exitFailure = 1
	// exitUsage: bad flags or arguments (including a malformed key, invalid
	// JSON, an invalid schema name); nothing was changed.
	exitUsage = 2
	// exitAttention: the command worked and found something an operator
	// must look at: status --fail-on-stuck found stuck work, reconcile
	// --fail-on-skipped or --fail-on-stale found rows it left alone,
	// failover-diff --fail-on-diff found keys that differ.
	exitAttention = 3
	// exitNotFound: the key does not exist in the schema.
	exitNotFound = 4
	// exitRefused: the key exists but its state does not allow the request
	// (resolve of a key that is not in needs review, or that expired);
	// nothing was changed.
	exitRefused = 5
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand of the CLI.
type command struct {
	name     string
	synopsis string // after "pgonce "
	summary  string // one line for the command list
	// help is the text above the flags in `pgonce NAME --help`.
	help string
	// noSchema and noDatabase leave out the global flags --schema and
	// --database-url from the command's own, for a command that uses
	// neither, so that its --help lists only flags it reads.
	noSchema, noDatabase bool
	// flags adds the command's own flags to fs and returns the function
	// that runs the command with its positional arguments.
	flags func(fs *flag.FlagSet, e *env) func(ctx context.Context, args []string) error
}

func commands() []*command {
	return []*command{
		migrateCommand(),
		statusCommand(),
		inspectCommand(),
		resolveCommand(),
		listCommand(),
		cancelCommand(),
		retryCommand(),
		pauseCommand(),
		resumeCommand(),
		limitCommand(),
		toolsCommand(),
		pruneCommand(),
		reconcileCommand(),
		failoverDiffCommand(),
		consoleCommand(),
		mcpProxyCommand(),
		demoCommand(),
		versionCommand(),
	}
}

// run is the CLI without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr}
	global := flag.NewFlagSet("pgonce", flag.ContinueOnError)
	e.globalFlags(global)
	rest, err := parseFlags(global, args, false)
	if errors.Is(err, flag.ErrHelp) {
		printMainUsage(stdout)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgonce: %v\nRun `pgonce help` for usage.\n", err)
		return exitUsage
	}
	if len(rest) == 0 {
		printMainUsage(stderr)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		if len(rest) == 0 {
			printMainUsage(stdout)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	i := slices.IndexFunc(commands(), func(c *command) bool { return c.name == name })
	if i < 0 {
		fmt.Fprintf(stderr, "pgonce: unknown command %q\nRun `pgonce help` for usage.\n", name)
		return exitUsage
	}
	cmd := commands()[i]

	fs := flag.NewFlagSet("pgonce "+cmd.name, flag.ContinueOnError)
	runFunc := cmd.flags(fs, e)
	// The global flags the command uses are accepted after its name too.
	e.commandGlobalFlags(fs, !cmd.noDatabase, !cmd.noSchema)
	positional, err := parseFlags(fs, rest, true)
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(stdout, cmd, fs)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgonce %s: %v\nRun `pgonce %s --help` for usage.\n", cmd.name, err, cmd.name)
		return exitUsage
	}
	return e.exit(cmd.name, runFunc(ctx, positional))
}

// parseFlags parses args into fs. With interspersed, flags may follow
// positional arguments (`inspect KEY --json`); "--" ends the flags.
func parseFlags(fs *flag.FlagSet, args []string, interspersed bool) ([]string, error) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		remaining := fs.Args()
		if !interspersed || len(remaining) == 0 {
			return append(positional, remaining...), nil
		}
		if consumed := len(args) - len(remaining); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, remaining...), nil
		}
		positional = append(positional, remaining[0])
		args = remaining[1:]
	}
}

func printMainUsage(w io.Writer) {
	fmt.Fprint(w, `pgonce is the operator CLI of pgonce: ask twice, execute once.

Usage:
  pgonce [--database-url URL] [--schema NAME] COMMAND [flags] [args]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `
Global flags (also accepted after the command name):
  --database-url URL   PostgreSQL URL; else $PGONCE_DATABASE_URL, else
                       $DATABASE_URL, else %s
  --schema NAME        schema that holds pgonce's tables (default %q)

Exit codes:
  0  success
  1  failure: database unreachable, schema not migrated, a database or
     reconcile error, a broken demo invariant
  2  bad flags or arguments; nothing changed
  3  attention: status --fail-on-stuck found stuck work, reconcile
     --fail-on-skipped / --fail-on-stale found rows it left alone, or
     failover-diff --fail-on-diff found keys that differ
  4  key not found
  5  refused: the key's state does not allow the request; nothing changed

Run 'pgonce COMMAND --help' for a command's flags.
`, databaseURLDefault, schemaDefault)
}

func printCommandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: pgonce %s\n\n%s\n\nFlags:\n", cmd.synopsis, strings.TrimSpace(cmd.help))
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
