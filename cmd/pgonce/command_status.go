package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// stuckAfterDefault is how long the oldest due pending key may wait before
// status calls the queue stuck.
const stuckAfterDefault = 5 * time.Minute

func statusCommand() *command {
	return &command{
		name:     "status",
		synopsis: "status [--json] [--fail-on-stuck] [--stuck-after DURATION]",
		summary:  "keys by tool and state, queue age, expired leases, needs review",
		help: `Counts keys by tool and state and summarises the queue: pending and in-flight
rows, the age of the oldest due pending key, in-flight rows whose lease
expired (a crashed or hung worker the reconciler has not resolved yet),
keys that need review, and tombstones.

Something is stuck when an in-flight row holds an expired lease, a key needs
review, or the oldest due pending key has waited longer than --stuck-after.
With --fail-on-stuck, status then exits 3, for alerting.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			failOnStuck := fs.Bool("fail-on-stuck", false, "exit 3 when something is stuck")
			stuckAfter := fs.Duration("stuck-after", stuckAfterDefault, "how long the oldest due pending key may wait")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				if *stuckAfter <= 0 {
					return usageErrorf("--stuck-after must be positive")
				}
				return e.status(ctx, *asJSON, *failOnStuck, *stuckAfter)
			}
		},
	}
}

// statusReport is the JSON of `status --json`.
type statusReport struct {
	Schema string                            `json:"schema"`
	Keys   map[string]map[outbox.State]int64 `json:"keys"`
	// Estimated lists the states whose counts in Keys, and Tombstones, are
	// estimates from the planner's statistics.
	Estimated             []outbox.State   `json:"estimated"`
	OldestPendingByToolMS map[string]int64 `json:"oldest_pending_by_tool_ms"`
	Pending               int64            `json:"pending"`
	InFlight              int64            `json:"in_flight"`
	ExpiredLeases         int64            `json:"expired_leases"`
	OldestPendingMS       int64            `json:"oldest_pending_ms"`
	NeedsReview           int64            `json:"needs_review"`
	Tombstones            int64            `json:"tombstones"`
	Stuck                 bool             `json:"stuck"`
	StuckReasons          []string         `json:"stuck_reasons"`
}

func (e *env) status(ctx context.Context, asJSON, failOnStuck bool, stuckAfter time.Duration) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	stats, err := client.Stats(ctx)
	if err != nil {
		return err
	}
	report := statusReport{
		Schema:                c.schema,
		Keys:                  stats.Keys,
		Estimated:             append([]outbox.State{}, stats.Estimated...),
		OldestPendingByToolMS: map[string]int64{},
		Pending:               stats.Pending,
		InFlight:              stats.InFlight,
		ExpiredLeases:         stats.ExpiredLeases,
		OldestPendingMS:       stats.OldestPending.Milliseconds(),
		NeedsReview:           stats.NeedsReview,
		Tombstones:            stats.Tombstones,
		StuckReasons:          stuckReasons(stats, stuckAfter),
	}
	for tool, oldest := range stats.OldestPendingByTool {
		report.OldestPendingByToolMS[tool] = oldest.Milliseconds()
	}
	report.Stuck = len(report.StuckReasons) > 0
	if asJSON {
		if err := writeJSON(e.stdout, report); err != nil {
			return err
		}
	} else if err := printStatus(e, report, stats); err != nil {
		return err
	}
	if failOnStuck && report.Stuck {
		return attentionError("stuck: " + strings.Join(report.StuckReasons, "; "))
	}
	return nil
}

func stuckReasons(stats outbox.Stats, stuckAfter time.Duration) []string {
	reasons := []string{}
	if stats.ExpiredLeases > 0 {
		reasons = append(reasons, fmt.Sprintf("%s hold an expired lease (a worker crashed or hangs; is a reconciler running?)", plural(stats.ExpiredLeases, "in-flight row")))
	}
	if stats.NeedsReview > 0 {
		reasons = append(reasons, fmt.Sprintf("%s review (pgonce list --state needs_review, pgonce inspect KEY, then pgonce resolve KEY)", pluralVerb(stats.NeedsReview, "key", "needs", "need")))
	}
	if stats.OldestPending > stuckAfter {
		var late []string
		for tool, oldest := range stats.OldestPendingByTool {
			if oldest > stuckAfter {
				late = append(late, tool)
			}
		}
		slices.Sort(late)
		tools := "its tool"
		if len(late) > 0 {
			tools = strings.Join(late, ", ")
		}
		reasons = append(reasons, fmt.Sprintf("the oldest due pending key has waited %s, more than %s (is a dispatcher running for %s?)",
			formatDuration(stats.OldestPending), formatDuration(stuckAfter), tools))
	}
	return reasons
}

var statusStates = []outbox.State{
	outbox.StatePending, outbox.StateInFlight, outbox.StateSucceeded, outbox.StateFailed, outbox.StateCancelled, outbox.StateNeedsReview,
	outbox.StateExpired,
}

func printStatus(e *env, report statusReport, stats outbox.Stats) error {
	fmt.Fprintf(e.stdout, "schema %s\n\n", report.Schema)
	if len(report.Keys) == 0 {
		fmt.Fprintln(e.stdout, "no keys")
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "TOOL\t")
		for _, state := range statusStates {
			fmt.Fprintf(tw, "%s\t", strings.ToUpper(string(state)))
		}
		fmt.Fprintln(tw, "TOTAL\t")
		tools := make([]string, 0, len(report.Keys))
		for tool := range report.Keys {
			tools = append(tools, tool)
		}
		slices.Sort(tools)
		for _, tool := range tools {
			fmt.Fprintf(tw, "%s\t", tool)
			var total int64
			for _, n := range report.Keys[tool] {
				total += n
			}
			for _, state := range statusStates {
				if stats.IsEstimated(state) {
					fmt.Fprintf(tw, "~%d\t", report.Keys[tool][state])
				} else {
					fmt.Fprintf(tw, "%d\t", report.Keys[tool][state])
				}
			}
			if len(report.Estimated) > 0 {
				fmt.Fprintf(tw, "~%d\t\n", total)
			} else {
				fmt.Fprintf(tw, "%d\t\n", total)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(report.Estimated) > 0 {
			fmt.Fprintln(e.stdout, "\n~ an estimate from the planner's statistics: the key table is too large to count its succeeded keys and tombstones one by one")
		}
	}
	fmt.Fprintf(e.stdout, "\nqueue:         %d pending (oldest due waited %s), %d in flight\n",
		report.Pending, formatDuration(stats.OldestPending), report.InFlight)
	fmt.Fprintf(e.stdout, "expired lease: %d\n", report.ExpiredLeases)
	fmt.Fprintf(e.stdout, "needs review:  %d\n", report.NeedsReview)
	if stats.IsEstimated(outbox.StateExpired) {
		fmt.Fprintf(e.stdout, "tombstones:    ~%d\n", report.Tombstones)
	} else {
		fmt.Fprintf(e.stdout, "tombstones:    %d\n", report.Tombstones)
	}
	if !report.Stuck {
		fmt.Fprintln(e.stdout, "stuck:         no")
		return nil
	}
	fmt.Fprintln(e.stdout, "stuck:         yes")
	for _, reason := range report.StuckReasons {
		fmt.Fprintf(e.stdout, "  - %s\n", reason)
	}
	return nil
}
