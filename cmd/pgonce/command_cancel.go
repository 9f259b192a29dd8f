package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/outbox"
)

func cancelCommand() *command {
	return auditCommand("cancel",
		"cancel a pending key: it never runs, and duplicates are told so",
		`Cancels a pending key: the action does not run, the key becomes final in
state cancelled, and every duplicate is answered with the cancellation.
Who and why are recorded (see inspect). A key in flight, or in any state
but pending, exits 5 and changes nothing; an unknown key exits 4. retry
undoes a cancellation.`,
		func(ctx context.Context, client *outbox.Client[pgx.Tx], key outbox.Key, by, reason string) (outbox.Result, error) {
			return client.Cancel(ctx, key, outbox.CancelParams{By: by, Reason: reason})
		})
}

func retryCommand() *command {
	return auditCommand("retry",
		"run a failed or cancelled key again now, under a new attempt",
		`Sends a failed or cancelled key back to pending, due now: a dispatcher runs
it again with the same key, under a new attempt, and the stored failure is
dropped. Who and why are recorded (see inspect). Any other state exits 5
and changes nothing (a needs-review key is retried with resolve --retry);
an unknown key exits 4.`,
		func(ctx context.Context, client *outbox.Client[pgx.Tx], key outbox.Key, by, reason string) (outbox.Result, error) {
			return client.Retry(ctx, key, outbox.RetryParams{By: by, Reason: reason})
		})
}

// auditCommand is a command that changes one key's state on an operator's
// say-so, recorded with who and why.
func auditCommand(name, summary, help string,
	apply func(ctx context.Context, client *outbox.Client[pgx.Tx], key outbox.Key, by, reason string) (outbox.Result, error),
) *command {
	return &command{
		name:     name,
		synopsis: name + " KEY --reason TEXT [--by WHO] [--json]",
		summary:  summary,
		help:     help,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			reason := fs.String("reason", "", "why (required)")
			by := fs.String("by", os.Getenv("USER"), "who decides (default $USER)")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return usageErrorf("want exactly one KEY")
				}
				key, err := outbox.ParseKey(args[0])
				if err != nil {
					return err
				}
				if *reason == "" {
					return usageErrorf("--reason is required: say why, for whoever reads the history")
				}
				if *by == "" {
					return usageErrorf("--by is required when $USER is not set")
				}
				c, client, err := e.migratedClient(ctx)
				if err != nil {
					return err
				}
				defer c.close()
				res, err := apply(ctx, client, key, *by, *reason)
				if err != nil {
					return usageOrError(err)
				}
				if *asJSON {
					return writeJSON(e.stdout, struct {
						Key    outbox.Key   `json:"key"`
						State  outbox.State `json:"state"`
						By     string       `json:"by"`
						Reason string       `json:"reason"`
					}{res.Key, res.State, *by, *reason})
				}
				fmt.Fprintf(e.stdout, "%s %s by %s; the key is now %s\n", name, res.Key, *by, res.State)
				return nil
			}
		},
	}
}
