package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

func failoverDiffCommand() *command {
	return &command{
		name:       "failover-diff",
		synopsis:   "failover-diff --old URL --new URL [--old-schema NAME] [--new-schema NAME] [--since TIME] [--fail-on-diff] [--json]",
		summary:    "keys the old primary holds that the promoted standby lacks, and whether each acted",
		noDatabase: true,
		help: `Compares the keys of the old primary, the one a failover left behind, with
those of the new primary, the promoted standby, and lists the keys the old
one holds that the new one lacks (missing) or holds in another state or
after another number of attempts: commits the standby never received. For
each: the tool, the run, when it was created, its state and attempts on
both, and whether it acted (the old primary counted an attempt, so its
provider may have been called).

Run it before pg_rewind or a rebuild discards the old primary's data: start
the old primary read-only, out of the clients' reach, or restore a dump of
it into a scratch database, and point --old at it. The command only reads.

  pgonce failover-diff --old postgres://postgres@old-db:5433/app --new postgres://postgres@db:5432/app
  pgonce failover-diff --old ... --new ... --since 2026-12-04T09:00:00Z --json

A key that did not act can be asked for again as it was. One that acted
is asked again safely only of a tool that deduplicates on the key
(idempotent_by_key). For another tool, pause it (pgonce pause; callers
that run it inline with Do are not held by a pause) before its callers ask
again, check with the provider what it did, cancel the key on the new
primary (pgonce cancel) once it is there, pending, if the provider acted,
and resume the tool.
--since compares only keys the old primary created or changed since then.
--fail-on-diff exits 3 when any key differs.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			oldURL := fs.String("old", "", "PostgreSQL URL of the old primary (required)")
			newURL := fs.String("new", "", "PostgreSQL URL of the new primary (required)")
			oldSchema := fs.String("old-schema", "", "schema of pgonce's tables on the old primary (default --schema)")
			newSchema := fs.String("new-schema", "", "schema of pgonce's tables on the new primary (default --schema)")
			since := fs.String("since", "", "only keys created or changed at or after this time (RFC 3339, or a duration ago)")
			failOnDiff := fs.Bool("fail-on-diff", false, "exit 3 when any key differs")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				if *oldURL == "" || *newURL == "" {
					return usageErrorf("--old and --new are required: the URLs of the old and the new primary")
				}
				p := failoverDiffParams{oldURL: *oldURL, newURL: *newURL, oldSchema: *oldSchema, newSchema: *newSchema}
				p.oldSchema = cmp.Or(p.oldSchema, e.schema)
				p.newSchema = cmp.Or(p.newSchema, e.schema)
				for _, s := range []struct{ flag, schema string }{{"--old-schema", p.oldSchema}, {"--new-schema", p.newSchema}} {
					if err := migrations.ValidateSchema(s.schema); err != nil {
						return usageErrorf("%s: %v", s.flag, err)
					}
				}
				var err error
				if p.since, err = parseWhen("--since", *since); err != nil {
					return err
				}
				return e.failoverDiff(ctx, p, *failOnDiff, *asJSON)
			}
		},
	}
}

type failoverDiffParams struct {
	oldURL, newURL       string
	oldSchema, newSchema string
	since                time.Time
}

type failoverDiffKeyJSON struct {
	Key         outbox.Key   `json:"key"`
	Tool        string       `json:"tool"`
	Tenant      string       `json:"tenant"`
	RunID       string       `json:"run_id"`
	Step        int64        `json:"step"`
	BusinessKey string       `json:"business_key"`
	CreatedAt   time.Time    `json:"created_at"`
	OldState    outbox.State `json:"old_state"`
	OldAttempts int          `json:"old_attempts"`
	// NewState is empty and NewAttempts zero when Missing.
	NewState    outbox.State `json:"new_state,omitempty"`
	NewAttempts int          `json:"new_attempts"`
	Missing     bool         `json:"missing"`
	Acted       bool         `json:"acted"`
}

// failoverDiff runs failover-diff: every page of outbox.FailoverDiff.
func (e *env) failoverDiff(ctx context.Context, p failoverDiffParams, failOnDiff, asJSON bool) error {
	oldConn, oldClient, err := e.diffClient(ctx, "--old", p.oldURL, p.oldSchema)
	if err != nil {
		return err
	}
	defer oldConn.close()
	newConn, newClient, err := e.diffClient(ctx, "--new", p.newURL, p.newSchema)
	if err != nil {
		return err
	}
	defer newConn.close()

	var (
		keys     []outbox.FailoverDiffKey
		compared int
		cursor   string
	)
	for {
		res, err := outbox.FailoverDiff(ctx, oldClient, newClient, outbox.FailoverDiffParams{ChangedSince: p.since, Cursor: cursor})
		if err != nil {
			return err
		}
		keys, compared, cursor = append(keys, res.Keys...), compared+res.Compared, res.Cursor
		if cursor == "" {
			break
		}
	}
	acted := 0
	for _, k := range keys {
		if k.Acted {
			acted++
		}
	}
	if asJSON {
		out := make([]failoverDiffKeyJSON, 0, len(keys))
		for _, k := range keys {
			j := failoverDiffKeyJSON{
				Key: k.Old.Key, Tool: k.Old.Tool, Tenant: k.Old.Tenant, RunID: k.Old.RunID, Step: k.Old.Step,
				BusinessKey: k.Old.BusinessKey, CreatedAt: k.Old.CreatedAt.UTC(), OldState: k.Old.State,
				OldAttempts: k.Old.Attempts, Missing: k.Missing(), Acted: k.Acted,
			}
			if k.New != nil {
				j.NewState, j.NewAttempts = k.New.State, k.New.Attempts
			}
			out = append(out, j)
		}
		if err := writeJSON(e.stdout, struct {
			OldSchema string                `json:"old_schema"`
			NewSchema string                `json:"new_schema"`
			Compared  int                   `json:"compared"`
			Acted     int                   `json:"acted"`
			Keys      []failoverDiffKeyJSON `json:"keys"`
		}{p.oldSchema, p.newSchema, compared, acted, out}); err != nil {
			return err
		}
	} else if err := printFailoverDiff(e, keys, compared, acted); err != nil {
		return err
	}
	if failOnDiff && len(keys) > 0 {
		return attentionError(pluralVerb(int64(len(keys)), "key", "differs", "differ") + " between the old primary and the new one")
	}
	return nil
}

// diffClient connects to one primary of failover-diff. Whatever stops it,
// an unreachable server or a schema without pgonce's tables, is a usage
// error that names the flag: the command was pointed at the wrong place.
func (e *env) diffClient(ctx context.Context, flagName, databaseURL, schema string) (*conn, *outbox.Client[pgx.Tx], error) {
	c, err := e.connectMigratedTo(ctx, databaseURL, flagName, schema)
	var (
		exitErr        *exitError
		notMigratedErr *notMigratedError
	)
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		return nil, nil, err
	case errors.As(err, &notMigratedErr):
		// Migrating either primary is not the fix: the flag names the wrong
		// database or schema, or the old primary runs an older build.
		state := "has no pgonce tables"
		if notMigratedErr.current > 0 {
			state = fmt.Sprintf("is migrated to version %d of %d", notMigratedErr.current, notMigratedErr.latest)
		}
		return nil, nil, usageErrorf("%s: schema %s at %s %s: point %s at the database, and %s-schema at the schema, that hold pgonce's keys",
			flagName, schema, redact(databaseURL), state, flagName, flagName)
	default:
		return nil, nil, usageErrorf("%s: %v", flagName, err)
	}
	client, err := c.client(outbox.Config{Logger: e.logger()})
	if err != nil {
		c.close()
		return nil, nil, err
	}
	return c, client, nil
}

func printFailoverDiff(e *env, keys []outbox.FailoverDiffKey, compared, acted int) error {
	if len(keys) == 0 {
		fmt.Fprintf(e.stdout, "the new primary holds every one of the old primary's %s as it is\n", plural(int64(compared), "key"))
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTOOL\tRUN\tSTEP\tCREATED\tOLD STATE\tOLD ATTEMPTS\tNEW STATE\tNEW ATTEMPTS\tACTED")
	for _, k := range keys {
		run := k.Old.RunID
		if k.Old.BusinessKey != "" {
			run = "key:" + k.Old.BusinessKey
		}
		if k.Old.Tenant != "" {
			run = k.Old.Tenant + "/" + run
		}
		newState, newAttempts := "missing", "-"
		if k.New != nil {
			newState, newAttempts = string(k.New.State), fmt.Sprint(k.New.Attempts)
		}
		actedText := "no"
		if k.Acted {
			actedText = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", k.Old.Key, k.Old.Tool, run, k.Old.Step,
			formatTime(k.Old.CreatedAt), k.Old.State, k.Old.Attempts, newState, newAttempts, actedText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "compared %s of the old primary: %s, %d of them acted; resubmit or resolve them before pg_rewind discards them\n",
		plural(int64(compared), "key"), pluralVerb(int64(len(keys)), "key", "differs", "differ"), acted)
	return nil
}
