// Command pgonce is the operator CLI for pgonce: migrations now, and status,
// inspection, resolution, pruning and the demo as they land.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pgonce/pgonce/migrations"
)

const databaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("pgonce", flag.ContinueOnError)
	flags.SetOutput(stderr)
	databaseURL := flags.String("database-url", "", "PostgreSQL URL (default: $PGONCE_DATABASE_URL, $DATABASE_URL, then the local server)")
	schema := flags.String("schema", migrations.SchemaDefault, "schema that holds pgonce's tables")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: pgonce [--database-url URL] [--schema NAME] migrate up|down|status")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if flags.NArg() != 2 || flags.Arg(0) != "migrate" {
		flags.Usage()
		return 2
	}
	url := firstNonEmpty(*databaseURL, os.Getenv("PGONCE_DATABASE_URL"), os.Getenv("DATABASE_URL"), databaseURLDefault)
	db, err := sql.Open("pgx", url)
	if err != nil {
		fmt.Fprintf(stderr, "pgonce: %v\n", err)
		return 1
	}
	defer func() { _ = db.Close() }()
	if err := db.PingContext(ctx); err != nil {
		fmt.Fprintf(stderr, "pgonce: database unreachable at %s: %v\n"+
			"Start PostgreSQL or point --database-url / PGONCE_DATABASE_URL at one.\n", url, err)
		return 1
	}
	switch flags.Arg(1) {
	case "up":
		err = migrations.Up(ctx, db, *schema)
	case "down":
		err = migrations.Down(ctx, db, *schema)
	case "status":
		var status []*migrationStatus
		status, err = statusOf(ctx, db, *schema)
		for _, s := range status {
			fmt.Fprintf(stdout, "%05d  %-8s  %s\n", s.version, s.state, s.name)
		}
	default:
		flags.Usage()
		return 2
	}
	if err != nil {
		if errors.Is(err, migrations.ErrInvalidSchema) {
			fmt.Fprintf(stderr, "pgonce: --schema: %v\n", err)
			return 2
		}
		fmt.Fprintf(stderr, "pgonce: %v\n", err)
		return 1
	}
	return 0
}

type migrationStatus struct {
	version int64
	state   string
	name    string
}

func statusOf(ctx context.Context, db *sql.DB, schema string) ([]*migrationStatus, error) {
	status, err := migrations.Status(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	out := make([]*migrationStatus, 0, len(status))
	for _, s := range status {
		out = append(out, &migrationStatus{version: s.Source.Version, state: string(s.State), name: s.Source.Path})
	}
	return out, nil
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
