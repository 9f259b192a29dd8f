package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

func reconcileCommand() *command {
	return &command{
		name:     "reconcile",
		synopsis: "reconcile --once [--keyed TOOL,...] [--at-most-once TOOL,...] [--grace DURATION] [--json] [--fail-on-skipped] [--fail-on-stale]",
		summary:  "resolve expired leases without provider code, for a scheduler",
		help: `Runs one reconciler pass: resolves in-flight rows whose lease expired more
than --grace ago, then applies retention (unless --no-prune). It needs no
provider code, so it only handles tools whose delivery you name:

  --keyed TOOL,...         IdempotentByKey tools: the row goes back to
                           pending; the retry carries the same key and the
                           provider deduplicates
  --at-most-once TOOL,...  AtMostOnce tools: the row goes to needs review

Each row is resolved by the delivery mode and provider key retention stored
with its key at submit, not by the flag that names its tool: a keyed row
past its provider's key retention goes to needs review.

Rows of other tools (natural-id tools, whose lookup needs their provider, and
tools you did not name) are left alone and reported as skipped: run the
reconciler inside the service that registers their providers
(reconcile.New(client, cfg).Run(ctx, time.Minute), or RunOnce from a cron
binary of your own). No provider is ever called.

Exits 1 on an error, and 3 with --fail-on-skipped when expired rows were
skipped, or with --fail-on-stale when pending rows wait for a dispatcher.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			once := fs.Bool("once", false, "run one pass and exit (required)")
			keyed := fs.String("keyed", "", "comma-separated IdempotentByKey tools")
			atMostOnce := fs.String("at-most-once", "", "comma-separated AtMostOnce tools")
			grace := fs.Duration("grace", reconcile.GraceDefault, "how long past its lease an in-flight row waits")
			stalePending := fs.Duration("stale-pending", reconcile.StalePendingDefault, "report pending rows due longer than this")
			noPrune := fs.Bool("no-prune", false, "do not apply retention")
			asJSON := fs.Bool("json", false, "print the report as JSON")
			failOnSkipped := fs.Bool("fail-on-skipped", false, "exit 3 when expired rows of unnamed tools were skipped")
			failOnStale := fs.Bool("fail-on-stale", false, "exit 3 when pending rows wait longer than --stale-pending")
			return func(ctx context.Context, args []string) error {
				switch {
				case len(args) != 0:
					return usageErrorf("takes no arguments, got %q", args)
				case !*once:
					return usageErrorf("pass --once: the CLI runs one pass, for a scheduler; " +
						"a loop belongs in your service (reconcile.Reconciler.Run)")
				case *grace <= 0:
					return usageErrorf("--grace must be positive")
				case *stalePending <= 0:
					return usageErrorf("--stale-pending must be positive")
				}
				registry, err := placeholderRegistry(splitTools(*keyed), splitTools(*atMostOnce))
				if err != nil {
					return err
				}
				return e.reconcile(ctx, reconcileParams{
					registry:      registry,
					config:        reconcile.Config{Grace: *grace, StalePending: *stalePending, PruneDisabled: *noPrune},
					asJSON:        *asJSON,
					failOnSkipped: *failOnSkipped,
					failOnStale:   *failOnStale,
				})
			}
		},
	}
}

func splitTools(list string) []string {
	var tools []string
	for tool := range strings.SplitSeq(list, ",") {
		if tool = strings.TrimSpace(tool); tool != "" {
			tools = append(tools, tool)
		}
	}
	return tools
}

// errNoProvider is what the placeholder provider would return. The
// reconciler never calls providers, so it is never seen.
var errNoProvider = errors.New("pgonce CLI: no provider; run tools from their service")

// placeholderRegistry registers the named tools with a provider that is never
// called: the reconciler reads only their delivery mode. Natural-id tools
// cannot be registered here, because their resolution needs a real Lookup;
// unregistered, their rows are skipped and reported.
func placeholderRegistry(keyed, atMostOnce []string) (*outbox.Registry, error) {
	placeholder := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, errNoProvider
	})
	registry := outbox.NewRegistry()
	for _, group := range []struct {
		flag     string
		tools    []string
		delivery outbox.Delivery
	}{{"--keyed", keyed, outbox.IdempotentByKey}, {"--at-most-once", atMostOnce, outbox.AtMostOnce}} {
		for _, tool := range group.tools {
			if err := registry.Register(tool, placeholder, group.delivery); err != nil {
				return nil, registrationUsageError(group.flag, tool, registry, err)
			}
		}
	}
	return registry, nil
}

// registrationUsageError says in the CLI's words why flag could not name
// tool: a tool named twice, or a name that is no tool name.
func registrationUsageError(flag, tool string, registry *outbox.Registry, err error) error {
	switch {
	case registry.Lookup(tool) != nil:
		return usageErrorf("%s: tool %q is named twice (in --keyed or --at-most-once); name each tool once", flag, tool)
	case errors.Is(err, outbox.ErrInvalidRegistration):
		return usageErrorf("%s: %q is not a tool name: a tool name is 1 to 64 lower-case letters, digits and _ . : -, starting with a letter (like refund or email.send)", flag, tool)
	}
	return usageErrorf("%s: %v", flag, err)
}

type reconcileParams struct {
	registry      *outbox.Registry
	config        reconcile.Config
	asJSON        bool
	failOnSkipped bool
	failOnStale   bool
}

func (e *env) reconcile(ctx context.Context, p reconcileParams) error {
	c, err := e.connectMigrated(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	config := outbox.Config{
		Registry: p.registry,
		Logger:   e.logger(),
	}
	client, err := c.client(config)
	if err != nil {
		return usageErrorf("%v", err)
	}
	p.config.Logger = e.logger()
	progress := newProgress(e.stderr)
	p.config.ProgressFunc = func(so reconcile.Report) {
		progress.printf("reconciling schema %s: %s resolved so far", c.schema, plural(int64(sum(so.Examined)), "row"))
	}
	r, err := reconcile.New(client, p.config)
	if err != nil {
		return usageErrorf("%v", err)
	}
	progress.printf("reconciling schema %s …", c.schema)
	report, err := r.RunOnce(ctx)
	progress.done()
	if err != nil {
		// What was done before the error is done; show it.
		_ = printReconcile(e, c.schema, report, p.asJSON)
		return fmt.Errorf("reconcile: %w", err)
	}
	if err := printReconcile(e, c.schema, report, p.asJSON); err != nil {
		return err
	}
	var findings []string
	if skipped := sum(report.SkippedUnregistered); p.failOnSkipped && skipped > 0 {
		findings = append(findings, fmt.Sprintf("%s skipped (tools not named with --keyed or --at-most-once)", plural(int64(skipped), "expired row")))
	}
	if p.failOnStale && report.StalePending > 0 {
		findings = append(findings, fmt.Sprintf("%s for a dispatcher (oldest %s)",
			pluralVerb(int64(report.StalePending), "pending row", "waits", "wait"), formatDuration(report.OldestStalePending)))
	}
	if len(findings) > 0 {
		return attentionError(strings.Join(findings, "; "))
	}
	return nil
}

func sum(counts map[string]int) int {
	total := 0
	for _, n := range counts {
		total += n
	}
	return total
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func printReconcile(e *env, schema string, report reconcile.Report, asJSON bool) error {
	if asJSON {
		// The report's own fields, but its one duration in milliseconds, as
		// every duration the CLI prints as JSON.
		return writeJSON(e.stdout, struct {
			Schema               string                               `json:"schema"`
			Examined             map[string]int                       `json:"examined"`
			Resolved             map[string]map[reconcile.Outcome]int `json:"resolved"`
			SkippedUnregistered  map[string]int                       `json:"skipped_unregistered"`
			StalePending         int                                  `json:"stale_pending"`
			OldestStalePendingMS int64                                `json:"oldest_stale_pending_ms"`
			Pruned               outbox.PruneResult                   `json:"pruned"`
		}{
			schema, report.Examined, report.Resolved, report.SkippedUnregistered, report.StalePending,
			report.OldestStalePending.Milliseconds(), report.Pruned,
		})
	}
	fmt.Fprintf(e.stdout, "reconciled schema %s\n", schema)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	if len(report.Examined) == 0 {
		fmt.Fprintln(tw, "expired rows:\tnone of the named tools")
	}
	for _, tool := range sortedKeys(report.Examined) {
		var outcomes []string
		for _, outcome := range sortedKeys(report.Resolved[tool]) {
			outcomes = append(outcomes, fmt.Sprintf("%s %d", outcome, report.Resolved[tool][outcome]))
		}
		fmt.Fprintf(tw, "%s:\texamined %d: %s\n", tool, report.Examined[tool], strings.Join(outcomes, ", "))
	}
	for _, tool := range sortedKeys(report.SkippedUnregistered) {
		fmt.Fprintf(tw, "%s:\tskipped %s (not named with --keyed or --at-most-once; its service's reconciler resolves them)\n",
			tool, plural(int64(report.SkippedUnregistered[tool]), "expired row"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if report.StalePending > 0 {
		fmt.Fprintf(e.stdout, "stale pending: %s due for %s or more; is a dispatcher running?\n",
			plural(int64(report.StalePending), "row"), formatDuration(report.OldestStalePending))
	} else {
		fmt.Fprintln(e.stdout, "stale pending: 0")
	}
	fmt.Fprintf(e.stdout, "pruned: %s into tombstones, %s deleted\n", plural(report.Pruned.Keys, "key"), plural(report.Pruned.Tombstones, "tombstone"))
	return nil
}
