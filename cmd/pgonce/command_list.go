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
		synopsis: "list [--state STATE,...] [--tool TOOL] [--tenant TENANT] [--run RUN_ID] [--find TEXT [--in FIELD]] [--since TIME] [--until TIME] [--limit N] [--cursor CURSOR] [--json]",
		summary:  "keys by state, tool, tenant, run and creation time, a page at a time, or found by what you know",
		help: `Lists keys oldest first, a page at a time: the keys an operator acts on,
in states pending, in_flight, failed, needs_review and cancelled (all of
them unless --state names some). Succeeded keys and tombstones (states
succeeded and expired) are listed within a window of at most a day:
--since is required with them. Each page of the states an operator acts
on reads an index, whatever the size of the table; when more keys follow,
the last line gives the --cursor of the next page.

  pgonce list --state needs_review --tool refund
  pgonce list --state failed --since 2026-12-01T00:00:00Z --json
  pgonce list --state succeeded --tool refund --since 1h

--find finds keys by what you know of a call instead: an order id or any
text in its arguments or its metadata, its natural id, its business key
(under --tenant, at any age), its run id (the tenants that have such a run
are printed), or its key or the start of one. Text in the arguments or the
metadata, key prefixes, business keys under any tenant and run ids are
looked for among the keys created since --since (default 24h) and older
keys an operator acts on; --in narrows the search to one of args,
metadata, natural_id, business_key, run_id, key.

  pgonce list --find 8842
  pgonce list --find OPS-4471 --in metadata
  pgonce list --find refund-order-8842 --tenant globex

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
			find := fs.String("find", "", "find keys by an order id or other text in the arguments or the metadata, a natural id, a business key, a run id or a key")
			in := fs.String("in", "", "with --find: search only args, metadata, natural_id, business_key, run_id or key")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				if *limit < 1 || *limit > outbox.ListLimitMax {
					return usageErrorf("--limit must be between 1 and %d", outbox.ListLimitMax)
				}
				if *find != "" || *in != "" {
					if *states != "" || *tool != "" || *runID != "" || *cursor != "" {
						return usageErrorf("--find takes --in, --tenant, --since, --until and --limit, not --state, --tool, --run or --cursor")
					}
					params := outbox.SearchParams{Text: *find, Tenant: *tenant, Limit: *limit}
					if *in != "" {
						params.Fields = []outbox.SearchField{outbox.SearchField(*in)}
					}
					var err error
					if params.CreatedAfter, err = parseWhen("--since", *since); err != nil {
						return err
					}
					if params.CreatedBefore, err = parseWhen("--until", *until); err != nil {
						return err
					}
					return e.find(ctx, params, *asJSON)
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
	// ArgsHead is the start of the canonical arguments, as text; ArgsSize
	// the length of all of them.
	ArgsHead string `json:"args_head,omitempty"`
	ArgsSize int    `json:"args_size"`
	// NaturalID and Matched are a found key's (list --find).
	NaturalID string               `json:"natural_id,omitempty"`
	Matched   []outbox.SearchField `json:"matched,omitempty"`
}

func listedKeyOf(k outbox.ListedKey) listedKeyJSON {
	return listedKeyJSON{
		Key: k.Key, State: k.State, Tool: k.Tool, Tenant: k.Tenant, RunID: k.RunID, Step: k.Step,
		BusinessKey: k.BusinessKey, Attempts: k.Attempts, CreatedAt: k.CreatedAt.UTC(), UpdatedAt: k.UpdatedAt.UTC(),
		LastError: k.LastError, ArgsHead: strings.ToValidUTF8(string(k.Args), "\uFFFD"), ArgsSize: k.ArgsSize,
	}
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
			keys = append(keys, listedKeyOf(k))
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
	if err := printKeys(e, page.Keys, nil); err != nil {
		return err
	}
	if page.Cursor != "" {
		fmt.Fprintf(e.stdout, "more keys follow: pgonce list ... --cursor %s\n", page.Cursor)
	}
	return nil
}

// printKeys prints keys as a table, one line each; matched, when not
// nil, gives each key's matched fields (list --find).
func printKeys(e *env, keys []outbox.ListedKey, matched [][]outbox.SearchField) error {
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	head := "KEY\tSTATE\tTOOL\tRUN\tSTEP\tATTEMPTS\tCREATED\tARGS\tLAST ERROR"
	if matched != nil {
		head += "\tMATCHED"
	}
	fmt.Fprintln(tw, head)
	for i, k := range keys {
		run := k.RunID
		if k.BusinessKey != "" {
			run = "key:" + k.BusinessKey
		}
		if k.Tenant != "" {
			run = k.Tenant + "/" + run
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s", k.Key, k.State, k.Tool, run, k.Step, k.Attempts,
			formatTime(k.CreatedAt), oneLine(strings.ToValidUTF8(string(k.Args), "\uFFFD"), 40), oneLine(k.LastError, 60))
		if matched != nil {
			fmt.Fprintf(tw, "\t%s", joinFields(matched[i]))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func joinFields(fields []outbox.SearchField) string {
	names := make([]string, 0, len(fields))
	for _, f := range fields {
		names = append(names, string(f))
	}
	return strings.Join(names, ",")
}

type foundRunJSON struct {
	Tenant string `json:"tenant"`
	RunID  string `json:"run_id"`
	Keys   int64  `json:"keys_seen"`
}

// find runs list --find: the keys and runs outbox.Client.Search finds.
func (e *env) find(ctx context.Context, params outbox.SearchParams, asJSON bool) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	res, err := client.Search(ctx, params)
	if err != nil {
		return usageOrError(err)
	}
	if asJSON {
		keys := make([]listedKeyJSON, 0, len(res.Keys))
		for _, k := range res.Keys {
			key := listedKeyOf(k.ListedKey)
			key.NaturalID, key.Matched = k.NaturalID, k.Matched
			keys = append(keys, key)
		}
		runs := make([]foundRunJSON, 0, len(res.Runs))
		for _, r := range res.Runs {
			runs = append(runs, foundRunJSON{Tenant: r.Tenant, RunID: r.RunID, Keys: r.Keys})
		}
		return writeJSON(e.stdout, struct {
			Schema       string          `json:"schema"`
			Keys         []listedKeyJSON `json:"keys"`
			Runs         []foundRunJSON  `json:"runs"`
			CreatedAfter time.Time       `json:"created_after"`
			More         bool            `json:"more"`
		}{c.schema, keys, runs, res.CreatedAfter.UTC(), res.More})
	}
	for _, r := range res.Runs {
		tenant := "without a tenant"
		if r.Tenant != "" {
			tenant = "of tenant " + r.Tenant
		}
		fmt.Fprintf(e.stdout, "run %s %s (%d keys seen)\n", r.RunID, tenant, r.Keys)
	}
	if len(res.Keys) == 0 {
		fmt.Fprintf(e.stdout, "no keys in schema %s match %q (recent keys from %s)\n", c.schema, params.Text, formatTime(res.CreatedAfter))
		return nil
	}
	keys := make([]outbox.ListedKey, 0, len(res.Keys))
	matched := make([][]outbox.SearchField, 0, len(res.Keys))
	for _, k := range res.Keys {
		keys, matched = append(keys, k.ListedKey), append(matched, k.Matched)
	}
	if err := printKeys(e, keys, matched); err != nil {
		return err
	}
	if res.More {
		fmt.Fprintf(e.stdout, "more keys match: narrow with --in, --tenant or --since, or raise --limit\n")
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
