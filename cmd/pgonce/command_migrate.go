package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/pgonce/pgonce/migrations"
)

func migrateCommand() *command {
	return &command{
		name:     "migrate",
		synopsis: "migrate up|down|status [--json] [--yes]",
		summary:  "apply, roll back or list the schema's migrations",
		help: `up      creates the schema if needed and applies every pending migration;
        safe to run at every deploy and from several processes at once.
down    rolls every migration back: drops pgonce's tables and every key,
        response and tombstone in the schema. Requires --yes.
status  lists the migrations and whether each is applied.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "status: print JSON")
			yes := fs.Bool("yes", false, "down: confirm dropping every key in the schema")
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return usageErrorf("want one of up, down, status")
				}
				switch args[0] {
				case "up":
					return e.migrateUp(ctx)
				case "down":
					if !*yes {
						return usageErrorf("migrate down drops every key, response and tombstone in schema %s; pass --yes to confirm", e.schema)
					}
					return e.migrateDown(ctx)
				case "status":
					return e.migrateStatus(ctx, *asJSON)
				}
				return usageErrorf("unknown migrate action %q: want up, down or status", args[0])
			}
		},
	}
}

func (e *env) migrateUp(ctx context.Context) error {
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if err := migrations.Up(ctx, c.db, c.schema); err != nil {
		return err
	}
	version, _, err := migrations.Version(ctx, c.db, c.schema)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "schema %s is migrated to version %d\n", c.schema, version)
	return nil
}

func (e *env) migrateDown(ctx context.Context) error {
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if err := migrations.Down(ctx, c.db, c.schema); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "schema %s: every migration rolled back; pgonce's tables are gone\n", c.schema)
	return nil
}

// migrationRow is one line of `migrate status`.
type migrationRow struct {
	Version   int64      `json:"version"`
	File      string     `json:"file"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

func (e *env) migrateStatus(ctx context.Context, asJSON bool) error {
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	status, err := migrations.Status(ctx, c.db, c.schema)
	if err != nil {
		return err
	}
	files := migrationFiles()
	rows := make([]migrationRow, 0, len(status))
	for _, s := range status {
		row := migrationRow{Version: s.Source.Version, File: files[s.Source.Version], Applied: s.State == goose.StateApplied}
		if row.Applied {
			row.AppliedAt = timePtr(s.AppliedAt)
		}
		rows = append(rows, row)
	}
	if asJSON {
		return writeJSON(e.stdout, struct {
			Schema     string         `json:"schema"`
			Migrations []migrationRow `json:"migrations"`
		}{c.schema, rows})
	}
	fmt.Fprintf(e.stdout, "schema %s\n", c.schema)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
	for _, row := range rows {
		state, at := "pending", "-"
		if row.Applied {
			state = "applied"
			if row.AppliedAt != nil {
				at = formatTime(*row.AppliedAt)
			}
		}
		fmt.Fprintf(tw, "%05d\t%s\t%s\t%s\n", row.Version, state, at, row.File)
	}
	return tw.Flush()
}
