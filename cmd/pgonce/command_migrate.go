package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

func migrateCommand() *command {
	return &command{
		name:     "migrate",
		synopsis: "migrate up|down|status|sql [--json] [--yes] [--version N | --all] [--down] [--out DIR]",
		summary:  "apply, roll back, list or print the schema's migrations",
		help: `up      creates the schema if needed and applies every pending migration;
        safe to run at every deploy and from several processes at once.
down    rolls every migration back: drops pgonce's tables and every key,
        response and tombstone in the schema. Requires --yes.
status  lists the migrations and whether each is applied; changes nothing
        (a schema never migrated stays absent).
sql     prints pgonce's goose files with --schema filled in, for a goose
        directory of your own; needs no database. --version N prints one
        file as it is, ready to save under a version number of your own
        sequence; --all prints every file, or with --out DIR writes each
        into DIR under its own name. --down prints only the Down sections,
        newest first. Apply pgonce's migrations either this way or with
        migrate up, never both to one schema.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "status: print JSON")
			yes := fs.Bool("yes", false, "down: confirm dropping every key in the schema")
			sql := sqlFlags{
				version: fs.Int64("version", 0, "sql: print the migration of this version"),
				all:     fs.Bool("all", false, "sql: print every migration"),
				down:    fs.Bool("down", false, "sql: print the Down sections only, newest first"),
				out:     fs.String("out", "", "sql: write the files into this directory instead of printing them"),
			}
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return usageErrorf("want one of up, down, status, sql")
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
				case "sql":
					return e.migrateSQL(sql)
				}
				return usageErrorf("unknown migrate action %q: want up, down, status or sql", args[0])
			}
		},
	}
}

func (e *env) migrateUp(ctx context.Context) error {
	if err := e.refuseTransactionPooling(); err != nil {
		return err
	}
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
	if err := e.refuseTransactionPooling(); err != nil {
		return err
	}
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

// refuseTransactionPooling refuses to migrate through a transaction
// pooler: goose holds a session-level advisory lock across the migration's
// transactions, which such a pooler would hand to other clients' sessions.
func (e *env) refuseTransactionPooling() error {
	pooling, err := e.resolvePooling()
	if err != nil {
		return err
	}
	if pooling == outbox.PoolingTransaction {
		return usageErrorf("migrate needs a direct connection, not a transaction pooler: " +
			"it holds a session lock across transactions; give it the server's own URL without --pooling transaction")
	}
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
	// goose's status creates the schema and its version table when they
	// are missing; a status must change nothing, so without a version table
	// every migration is pending and goose is not asked.
	var versioned bool
	if err := c.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		ident.Quote(c.schema)+"."+migrations.TableName).Scan(&versioned); err != nil {
		return fmt.Errorf("read migration status: %w", err)
	}
	files := migrationFiles()
	var rows []migrationRow
	if versioned {
		status, err := migrations.Status(ctx, c.db, c.schema)
		if err != nil {
			return err
		}
		for _, s := range status {
			row := migrationRow{Version: s.Source.Version, File: files[s.Source.Version], Applied: s.State == goose.StateApplied}
			if row.Applied {
				row.AppliedAt = timePtr(s.AppliedAt)
			}
			rows = append(rows, row)
		}
	} else {
		for _, version := range slices.Sorted(maps.Keys(files)) {
			rows = append(rows, migrationRow{Version: version, File: files[version]})
		}
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

// sqlFlags are the flags of `migrate sql`.
type sqlFlags struct {
	version *int64
	all     *bool
	down    *bool
	out     *string
}

// migrateSQL prints, or writes into a directory, pgonce's goose files with
// the schema filled in, as migrations.Files makes them.
func (e *env) migrateSQL(flags sqlFlags) error {
	if err := validateSchema(e.schema); err != nil {
		return err
	}
	switch {
	case *flags.version != 0 && *flags.all:
		return usageErrorf("sql: pass --version N or --all, not both")
	case *flags.version == 0 && !*flags.all:
		return usageErrorf("sql: pass --version N or --all")
	case *flags.down && *flags.out != "":
		return usageErrorf("sql: --down prints Down sections, which are no goose files; it does not combine with --out")
	}
	files, err := migrations.Files(e.schema)
	if err != nil {
		return err
	}
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return err
	}
	if *flags.version != 0 {
		versions := make([]string, 0, len(names))
		var selected []string
		for _, name := range names {
			version, err := goose.NumericComponent(name)
			if err != nil {
				return fmt.Errorf("migration %s: %w", name, err)
			}
			versions = append(versions, fmt.Sprint(version))
			if version == *flags.version {
				selected = append(selected, name)
			}
		}
		if len(selected) == 0 {
			return usageErrorf("sql: no migration has version %d (versions: %s)", *flags.version, strings.Join(versions, ", "))
		}
		names = selected
	}
	if *flags.down {
		slices.Reverse(names)
	}
	for i, name := range names {
		body, err := fs.ReadFile(files, name)
		if err != nil {
			return err
		}
		if *flags.down {
			body = downSection(body)
		}
		switch {
		case *flags.out != "":
			if err := writeNewFile(filepath.Join(*flags.out, name), body); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "wrote %s\n", filepath.Join(*flags.out, name))
		case len(names) == 1:
			if _, err := e.stdout.Write(body); err != nil {
				return err
			}
		default:
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			fmt.Fprintf(e.stdout, "-- pgonce migration %s\n", name)
			if _, err := e.stdout.Write(body); err != nil {
				return err
			}
		}
	}
	return nil
}

// downSection returns the lines of a goose file after its
// "-- +goose Down" annotation: what `migrate sql --down` prints for a person
// to read or run by hand. Applying the files is left to goose, which parses
// them itself.
func downSection(body []byte) []byte {
	lines := strings.SplitAfter(string(body), "\n")
	for i, line := range lines {
		if strings.TrimSpace(line) == "-- +goose Down" {
			return []byte(strings.Join(lines[i:], ""))
		}
	}
	return nil
}

// writeNewFile writes body to path, refusing to replace a file that exists:
// a goose directory's files are history.
func writeNewFile(path string, body []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644) //nolint:gosec // a migration file is meant to be read
	if err != nil {
		return usageErrorf("sql: %v", err)
	}
	if _, err := f.Write(body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
