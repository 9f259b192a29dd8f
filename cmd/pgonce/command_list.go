package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

func listCommand() *command {
	return &command{
		name:     "list",
		synopsis: "list [--state STATE,...] [--tool TOOL] [--tenant TENANT] [--run RUN_ID] [--since TIME] [--until TIME] [--limit N] [--cursor CURSOR] [--json]",
		summary:  "keys by state, tool, tenant, run and creation time, a page at a time",
		help: `Lists keys oldest first, a page at a time: the keys an operator acts on,
in states pending, in_flight, failed, needs_review and cancelled (all of
them unless --state names some). Succeeded keys are read by key (inspect).
Each page reads an index, whatever the size of the table; when more keys
follow, the last line gives the --cursor of the next page.

  pgonce list --state needs_review --tool refund
  pgonce list --state failed --since 2026-12-01T00:00:00Z --json

--since and --until take RFC 3339 times, or a duration back from now
(--since 24h); --since is inclusive, --until exclusive.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			states := fs.String("state", "", "comma-separated states: pending, in_flight, failed, needs_review, cancelled")
			tool := fs.String("tool", "", "only keys of this tool")
			tenant := fs.String("tenant", "", "only keys of this tenant")
			runID := fs.String("run", "", "only keys of this run id")
			since := fs.String("since", "", "only keys created at or after this time (RFC 3339, or a duration ago)")
			until := fs.String("until", "", "only keys created before this time (RFC 3339, or a duration ago)")
			limit := fs.Int("limit", outbox.ListLimitDefault, fmt.Sprintf("keys per page, 1 to %d", outbox.ListLimitMax))
			cursor := fs.String("cursor", "", "continue from a page's cursor")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				if *limit < 1 || *limit > outbox.ListLimitMax {
					return usageErrorf("--limit must be between 1 and %d", outbox.ListLimitMax)
				}
				params := outbox.ListParams{Tool: *tool, Tenant: *tenant, RunID: *runID, Limit: *limit, Cursor: *cursor}
				for state := range strings.SplitSeq(*states, ",") {
					if state = strings.TrimSpace(state); state != "" {
						params.States = append(params.States, outbox.State(state))
					}
				}
				var err error
				if params.CreatedAfter, err = parseWhen("--since", *since); err != nil {
					return err
				}
				if params.CreatedBefore, err = parseWhen("--until", *until); err != nil {
					return err
				}
				return e.list(ctx, params, *asJSON)
			}
		},
	}
}

// parseWhen reads an RFC 3339 time, or a duration back from now; empty is
// the zero time.
func parseWhen(flagName, value string) (time.Time, error) {
	if value == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, value); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(value); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, usageErrorf("%s %q is neither an RFC 3339 time nor a duration ago", flagName, value)
}

type listedKeyJSON struct {
	Key         outbox.Key   `json:"key"`
	State       outbox.State `json:"state"`
	Tool        string       `json:"tool"`
	Tenant      string       `json:"tenant"`
	RunID       string       `json:"run_id"`
	Step        int64        `json:"step"`
	BusinessKey string       `json:"business_key"`
	Attempts    int          `json:"attempts"`
	CreatedAt   time.Time    `json:"created_at"`
	UpdatedAt   time.Time    `json:"updated_at"`
	LastError   string       `json:"last_error,omitempty"`
}

func (e *env) list(ctx context.Context, params outbox.ListParams, asJSON bool) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	page, err := client.List(ctx, params)
	if err != nil {
		return usageOrError(err)
	}
	if asJSON {
		keys := make([]listedKeyJSON, 0, len(page.Keys))
		for _, k := range page.Keys {
			keys = append(keys, listedKeyJSON{
				Key: k.Key, State: k.State, Tool: k.Tool, Tenant: k.Tenant, RunID: k.RunID, Step: k.Step,
				BusinessKey: k.BusinessKey, Attempts: k.Attempts, CreatedAt: k.CreatedAt.UTC(), UpdatedAt: k.UpdatedAt.UTC(),
				LastError: k.LastError,
			})
		}
		return writeJSON(e.stdout, struct {
			Schema string          `json:"schema"`
			Keys   []listedKeyJSON `json:"keys"`
			Cursor string          `json:"cursor,omitempty"`
		}{c.schema, keys, page.Cursor})
	}
	if len(page.Keys) == 0 {
		fmt.Fprintf(e.stdout, "no keys in schema %s match\n", c.schema)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tTOOL\tRUN\tSTEP\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, k := range page.Keys {
		run := k.RunID
		if k.BusinessKey != "" {
			run = "key:" + k.BusinessKey
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", k.Key, k.State, k.Tool, run, k.Step, k.Attempts,
			formatTime(k.CreatedAt), oneLine(k.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Cursor != "" {
		fmt.Fprintf(e.stdout, "more keys follow: pgonce list ... --cursor %s\n", page.Cursor)
	}
	return nil
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if runes := []rune(s); len(runes) > n {
		return string(runes[:n-1]) + "…"
	}
	return s
}

// usageOrError makes a refusal of malformed params a usage error (exit 2)
// and a refusal by the key's state exit 5.
func usageOrError(err error) error {
	switch {
	case errors.Is(err, outbox.ErrInvalidParams):
		return &exitError{code: exitUsage, msg: err.Error()}
	case errors.Is(err, outbox.ErrNotCancellable), errors.Is(err, outbox.ErrNotRetryable):
		return &exitError{code: exitRefused, msg: err.Error()}
	}
	return err
}
