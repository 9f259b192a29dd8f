package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/pgonce/pgonce/outbox"
)

func pruneCommand() *command {
	return &command{
		name:     "prune",
		synopsis: "prune [--dry-run] [--batch-size N] [--json]",
		summary:  "apply retention: finished keys past retention become tombstones",
		help: `Applies retention, as the reconciler also does on each run: succeeded and
failed keys whose retention ended lose their response and become tombstones
(a late duplicate then gets "expired: executed at T" and nothing runs);
tombstones past their horizon are deleted. Pending, in-flight and
needs-review keys are never touched. Work is done in short batches that skip
locked rows, so prune may run beside dispatchers.

A key's retention and its tombstone's horizon were fixed when it finished, by
the service that recorded it, so prune needs no settings of its own.
Progress is shown on a terminal.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			dryRun := fs.Bool("dry-run", false, "count what would be pruned; change nothing")
			batchSize := fs.Int("batch-size", outbox.PruneBatchSizeDefault, "rows per statement")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				if *batchSize < 1 || *batchSize > 100_000 {
					return usageErrorf("--batch-size must be between 1 and 100000")
				}
				return e.prune(ctx, *dryRun, *batchSize, *asJSON)
			}
		},
	}
}

func (e *env) prune(ctx context.Context, dryRun bool, batchSize int, asJSON bool) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	progress := newProgress(e.stderr)
	result, err := client.Prune(ctx, &outbox.PruneOpts{
		DryRun:    dryRun,
		BatchSize: batchSize,
		ProgressFunc: func(r outbox.PruneResult) {
			progress.printf("pruned %s, %s so far", plural(r.Keys, "key"), plural(r.Tombstones, "tombstone"))
		},
	})
	progress.done()
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, struct {
			Schema string `json:"schema"`
			DryRun bool   `json:"dry_run"`
			outbox.PruneResult
		}{c.schema, dryRun, result})
	}
	if dryRun {
		fmt.Fprintf(e.stdout, "dry run: would turn %s into tombstones and delete %s in schema %s\n",
			plural(result.Keys, "key"), plural(result.Tombstones, "tombstone"), c.schema)
		return nil
	}
	fmt.Fprintf(e.stdout, "turned %s into tombstones and deleted %s in schema %s\n",
		plural(result.Keys, "key"), plural(result.Tombstones, "tombstone"), c.schema)
	return nil
}

// progress rewrites one status line on a terminal and prints nothing
// elsewhere, so that logs and pipes stay clean.
type progress struct {
	w       io.Writer
	enabled bool
	wrote   bool
}

func newProgress(w io.Writer) *progress {
	enabled := false
	if f, ok := w.(*os.File); ok {
		if info, err := f.Stat(); err == nil {
			enabled = info.Mode()&os.ModeCharDevice != 0
		}
	}
	return &progress{w: w, enabled: enabled}
}

func (p *progress) printf(format string, args ...any) {
	if !p.enabled {
		return
	}
	fmt.Fprintf(p.w, "\r\033[K"+format, args...)
	p.wrote = true
}

// done ends the status line.
func (p *progress) done() {
	if p.wrote {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
