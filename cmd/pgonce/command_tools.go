package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/outbox"
)

func pauseCommand() *command {
	return &command{
		name:     "pause",
		synopsis: "pause TOOL --reason TEXT [--by WHO] [--json]",
		summary:  "pause a tool: no dispatcher starts its calls until resume",
		help: `Pauses a tool across every dispatcher of the schema: none claims its keys
until resume, and calls already in flight finish. Submits still accept the
tool's keys, which wait, pending. Who and why are recorded (see tools
TOOL). Pausing a paused tool keeps the first pause, records nothing and
exits 0. Inline calls (Client.Do) are not paused.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			reason := fs.String("reason", "", "why (required)")
			by := fs.String("by", operatorName(), "who decides (default: $USER, else $LOGNAME, else the account running pgonce)")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				tool, err := oneTool(args)
				if err != nil {
					return err
				}
				if *reason == "" {
					return usageErrorf("--reason is required: say why, for whoever reads the history")
				}
				if *by == "" {
					return usageErrorf("--by is required: neither $USER, $LOGNAME nor the operating system names who runs pgonce")
				}
				return e.toolAct(ctx, tool, *asJSON, func(client *outbox.Client[pgx.Tx], before outbox.ToolStatus) (outbox.ToolStatus, string, error) {
					if before.Paused {
						return before, fmt.Sprintf("%s was paused already, since %s by %s: %s; nothing changed",
							visibleText(tool), formatTime(before.PausedAt), visibleText(before.PausedBy), visibleText(before.PausedReason)), nil
					}
					after, err := client.Pause(ctx, tool, outbox.PauseParams{By: *by, Reason: *reason})
					msg := fmt.Sprintf("paused %s by %s; its keys wait until `pgonce resume %s`", visibleText(tool), visibleText(*by), visibleText(tool))
					return after, msg + unknownToolNote(after, "the pause applies"), err
				})
			}
		},
	}
}

func resumeCommand() *command {
	return &command{
		name:     "resume",
		synopsis: "resume TOOL [--slow-down] [--reason TEXT] [--by WHO] [--json]",
		summary:  "end a tool's pause, or with --slow-down its provider's slow-down: dispatchers claim its keys again",
		help: `Ends a tool's pause: dispatchers claim its keys again, within its limits.
Who (and why, if given) are recorded (see tools TOOL). Resuming a tool that
is not paused records nothing and exits 0. A slow-down its provider asked
for (a 429 with Retry-After) stays: see --slow-down.

With --slow-down, ends the tool's slow-down instead, before the time its
provider asked for, and leaves a pause alone: its keys the slow-down held
are due at once. --reason is then required, as this overrides the
provider; a provider that still cannot keep up slows the tool down again.

  pgonce resume refund --slow-down --reason "Stripe raised our rate limit"`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			slowDown := fs.Bool("slow-down", false, "end the provider's slow-down instead of the pause (needs --reason)")
			reason := fs.String("reason", "", "why (optional; required with --slow-down)")
			by := fs.String("by", operatorName(), "who decides (default: $USER, else $LOGNAME, else the account running pgonce)")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				tool, err := oneTool(args)
				if err != nil {
					return err
				}
				if *by == "" {
					return usageErrorf("--by is required: neither $USER, $LOGNAME nor the operating system names who runs pgonce")
				}
				if *slowDown {
					if *reason == "" {
						return usageErrorf("--slow-down needs --reason: say why the provider's slow-down ends early")
					}
					return e.toolAct(ctx, tool, *asJSON, func(client *outbox.Client[pgx.Tx], before outbox.ToolStatus) (outbox.ToolStatus, string, error) {
						if !before.SlowedDown(time.Now()) {
							return before, fmt.Sprintf("%s is not slowed down; nothing changed", visibleText(tool)), nil
						}
						after, err := client.EndSlowDown(ctx, tool, outbox.EndSlowDownParams{By: *by, Reason: *reason})
						msg := fmt.Sprintf("ended the slow-down of %s by %s; its keys are due now", visibleText(tool), visibleText(*by))
						if after.Paused {
							msg += fmt.Sprintf("\n%s is still paused: `pgonce resume %s` ends the pause", visibleText(tool), visibleText(tool))
						}
						return after, msg, err
					})
				}
				return e.toolAct(ctx, tool, *asJSON, func(client *outbox.Client[pgx.Tx], before outbox.ToolStatus) (outbox.ToolStatus, string, error) {
					if !before.Paused {
						return before, fmt.Sprintf("%s is not paused; nothing changed", visibleText(tool)), nil
					}
					after, err := client.Resume(ctx, tool, outbox.ResumeParams{By: *by, Reason: *reason})
					msg := fmt.Sprintf("resumed %s by %s", visibleText(tool), visibleText(*by))
					if after.SlowedDown(time.Now()) {
						msg += fmt.Sprintf("\n%s is still slowed down until %s, as its provider asked: `pgonce resume %s --slow-down` ends it",
							visibleText(tool), formatTime(after.SlowedUntil), visibleText(tool))
					}
					return after, msg, err
				})
			}
		},
	}
}

func limitCommand() *command {
	return &command{
		name:     "limit",
		synopsis: "limit TOOL ([--max-in-flight N] [--rate R [--burst B]] | --clear) --reason TEXT [--by WHO] [--json]",
		summary:  "set or clear a tool's limits on calls in flight and calls per second",
		help: `Sets a tool's limits, enforced by every dispatcher of the schema: at most
--max-in-flight calls of the tool at once, and on average --rate calls
started per second with up to --burst at once (default: the rate rounded
up). The limits given replace the tool's limits: a kind not given is no
limit of that kind. --clear removes every limit (a provider's slow-down
stays: see resume --slow-down). Who and why are recorded (see tools TOOL).

  pgonce limit refund --max-in-flight 25 --rate 20 --reason "Stripe live-mode limit"
  pgonce limit refund --clear --reason "moved to the batch API"`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			maxInFlight := fs.Int("max-in-flight", 0, fmt.Sprintf("most calls in flight at once, 1 to %d", outbox.ToolMaxInFlightMax))
			rate := fs.Float64("rate", 0, fmt.Sprintf("calls started per second, on average, up to %d", outbox.ToolRateMax))
			burst := fs.Int("burst", 0, "calls that may start at once after the tool was idle (needs --rate; default: the rate rounded up)")
			clearLimits := fs.Bool("clear", false, "remove every limit")
			reason := fs.String("reason", "", "why (required)")
			by := fs.String("by", operatorName(), "who decides (default: $USER, else $LOGNAME, else the account running pgonce)")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				tool, err := oneTool(args)
				if err != nil {
					return err
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				limits := outbox.ToolLimits{MaxInFlight: *maxInFlight, Rate: *rate, Burst: *burst}
				switch {
				case *clearLimits && (set["max-in-flight"] || set["rate"] || set["burst"]):
					return usageErrorf("--clear takes no --max-in-flight, --rate or --burst")
				case !*clearLimits && !set["max-in-flight"] && !set["rate"]:
					return usageErrorf("give --max-in-flight, --rate or both, or --clear to remove the limits")
				case set["max-in-flight"] && (*maxInFlight < 1 || *maxInFlight > outbox.ToolMaxInFlightMax):
					return usageErrorf("--max-in-flight must be between 1 and %d", outbox.ToolMaxInFlightMax)
				case set["rate"] && (math.IsNaN(*rate) || *rate <= 0 || *rate > outbox.ToolRateMax):
					return usageErrorf("--rate must be more than 0 and at most %d", outbox.ToolRateMax)
				case set["burst"] && !set["rate"]:
					return usageErrorf("--burst needs --rate")
				case set["burst"] && (*burst < 1 || *burst > outbox.ToolBurstMax):
					return usageErrorf("--burst must be between 1 and %d", outbox.ToolBurstMax)
				case *reason == "":
					return usageErrorf("--reason is required: say why, for whoever reads the history")
				case *by == "":
					return usageErrorf("--by is required: neither $USER, $LOGNAME nor the operating system names who runs pgonce")
				}
				return e.toolAct(ctx, tool, *asJSON, func(client *outbox.Client[pgx.Tx], _ outbox.ToolStatus) (outbox.ToolStatus, string, error) {
					after, err := client.SetToolLimits(ctx, tool, limits, outbox.LimitParams{By: *by, Reason: *reason})
					if *clearLimits {
						return after, fmt.Sprintf("cleared the limits of %s by %s", visibleText(tool), visibleText(*by)), err
					}
					msg := fmt.Sprintf("limited %s to %s by %s", visibleText(tool), formatLimits(after.Limits), visibleText(*by))
					return after, msg + unknownToolNote(after, "the limits apply"), err
				})
			}
		},
	}
}

func toolsCommand() *command {
	return &command{
		name:     "tools",
		synopsis: "tools [TOOL] [--json]",
		summary:  "tools with flow control: limits, pauses and slow-downs; one tool's history",
		help: `Lists the tools that have flow control: their limits, whether they are
paused (since when, by whom, why) and slowed down (until when, after their
provider asked to slow down). A tool not listed has none. With TOOL, prints
that tool's flow control and the operator decisions on it, newest first.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) > 1 {
					return usageErrorf("want at most one TOOL, got %q", args)
				}
				c, client, err := e.migratedClient(ctx)
				if err != nil {
					return err
				}
				defer c.close()
				if len(args) == 1 {
					if err := outbox.CheckToolName(args[0]); err != nil {
						return usageOrError(err)
					}
					return e.tool(ctx, client, args[0], *asJSON)
				}
				statuses, err := client.Tools(ctx)
				if err != nil {
					return err
				}
				now := time.Now()
				if *asJSON {
					tools := make([]toolJSON, 0, len(statuses))
					for _, s := range statuses {
						tools = append(tools, toolJSONOf(s, now))
					}
					return writeJSON(e.stdout, struct {
						Schema string     `json:"schema"`
						Tools  []toolJSON `json:"tools"`
					}{c.schema, tools})
				}
				if len(statuses) == 0 {
					fmt.Fprintf(e.stdout, "no tool in schema %s has flow control\n", c.schema)
					return nil
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "TOOL\tMAX IN FLIGHT\tRATE/S\tBURST\tPAUSED\tSLOWED UNTIL")
				for _, s := range statuses {
					paused := "-"
					if s.Paused {
						paused = fmt.Sprintf("since %s by %s: %s", formatTime(s.PausedAt), oneLine(visibleText(s.PausedBy), 30), oneLine(visibleText(s.PausedReason), 60))
					}
					slowed := "-"
					if s.SlowedDown(now) {
						slowed = formatTime(s.SlowedUntil)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", oneLine(visibleText(s.Tool), 40),
						limitText(int64(s.Limits.MaxInFlight)), rateText(s.Limits.Rate), limitText(int64(s.Limits.Burst)), paused, slowed)
				}
				return tw.Flush()
			}
		},
	}
}

// tool prints one tool's flow control and the decisions on it.
func (e *env) tool(ctx context.Context, client *outbox.Client[pgx.Tx], tool string, asJSON bool) error {
	status, err := client.Tool(ctx, tool)
	if err != nil {
		return err
	}
	actions, err := client.ToolActions(ctx, tool)
	if err != nil {
		return usageOrError(err)
	}
	now := time.Now()
	if asJSON {
		list := make([]toolActionJSON, 0, len(actions))
		for _, a := range actions {
			list = append(list, toolActionJSON{At: a.At.UTC(), Action: a.Action, By: a.By, Reason: a.Reason})
		}
		return writeJSON(e.stdout, struct {
			Tool    toolJSON         `json:"tool"`
			Actions []toolActionJSON `json:"actions"`
		}{toolJSONOf(status, now), list})
	}
	printToolStatus(e, status, now)
	if len(actions) == 0 {
		fmt.Fprintln(e.stdout, "decisions:     none")
		return nil
	}
	fmt.Fprintln(e.stdout, "decisions:")
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, a := range actions {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", formatTime(a.At), a.Action, oneLine(visibleText(a.By), 30), oneLine(visibleText(a.Reason), 80))
	}
	return tw.Flush()
}

func printToolStatus(e *env, s outbox.ToolStatus, now time.Time) {
	fmt.Fprintf(e.stdout, "tool:          %s\n", visibleText(s.Tool))
	fmt.Fprintf(e.stdout, "limits:        %s\n", formatLimits(s.Limits))
	if s.Paused {
		fmt.Fprintf(e.stdout, "paused:        since %s by %s: %s\n", formatTime(s.PausedAt), visibleText(s.PausedBy), visibleText(s.PausedReason))
	} else {
		fmt.Fprintln(e.stdout, "paused:        no")
	}
	if s.SlowedDown(now) {
		fmt.Fprintf(e.stdout, "slowed down:   until %s\n", formatTime(s.SlowedUntil))
	} else {
		fmt.Fprintln(e.stdout, "slowed down:   no")
	}
}

// toolAct connects, reads the tool's flow control, applies act and prints
// the tool as act left it, with act's message.
func (e *env) toolAct(ctx context.Context, tool string, asJSON bool,
	act func(client *outbox.Client[pgx.Tx], before outbox.ToolStatus) (outbox.ToolStatus, string, error),
) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	before, err := client.Tool(ctx, tool)
	if err != nil {
		return err
	}
	after, msg, err := act(client, before)
	if err != nil {
		return usageOrError(err)
	}
	if asJSON {
		return writeJSON(e.stdout, toolJSONOf(after, time.Now()))
	}
	fmt.Fprintln(e.stdout, msg)
	return nil
}

// unknownToolNote is the line that tells an operator that no call uses the
// tool they just acted on, most often a misspelt name, or "" when one
// does. what says what applies to the calls yet to come.
func unknownToolNote(s outbox.ToolStatus, what string) string {
	if s.Known || s.Tool == "" {
		return ""
	}
	return fmt.Sprintf("\nno call of tool %s has been seen (no key of it is pending or in flight); %s to future calls", visibleText(s.Tool), what)
}

// oneTool returns the one TOOL argument of a command, refusing a name no
// call can have before anything is read or written.
func oneTool(args []string) (string, error) {
	if len(args) != 1 {
		return "", usageErrorf("want exactly one TOOL")
	}
	if err := outbox.CheckToolName(args[0]); err != nil {
		return "", usageOrError(err)
	}
	return args[0], nil
}

type toolJSON struct {
	Tool         string     `json:"tool"`
	MaxInFlight  int        `json:"max_in_flight"`
	Rate         float64    `json:"rate"`
	Burst        int        `json:"burst"`
	Paused       bool       `json:"paused"`
	PausedAt     *time.Time `json:"paused_at,omitempty"`
	PausedBy     string     `json:"paused_by,omitempty"`
	PausedReason string     `json:"paused_reason,omitempty"`
	SlowedDown   bool       `json:"slowed_down"`
	SlowedUntil  *time.Time `json:"slowed_until,omitempty"`
	UpdatedAt    *time.Time `json:"updated_at,omitempty"`
	// Known is outbox.ToolStatus.Known: false for a tool no call uses.
	Known bool `json:"known"`
}

func toolJSONOf(s outbox.ToolStatus, now time.Time) toolJSON {
	j := toolJSON{
		Tool: s.Tool, MaxInFlight: s.Limits.MaxInFlight, Rate: s.Limits.Rate, Burst: s.Limits.Burst,
		Paused: s.Paused, PausedAt: timePtr(s.PausedAt), PausedBy: s.PausedBy, PausedReason: s.PausedReason,
		SlowedDown: s.SlowedDown(now), UpdatedAt: timePtr(s.UpdatedAt), Known: s.Known,
	}
	if j.SlowedDown {
		j.SlowedUntil = timePtr(s.SlowedUntil)
	}
	return j
}

type toolActionJSON struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"`
	By     string    `json:"by"`
	Reason string    `json:"reason"`
}

// formatLimits prints a tool's limits for people.
func formatLimits(l outbox.ToolLimits) string {
	var parts []string
	if l.MaxInFlight > 0 {
		parts = append(parts, fmt.Sprintf("%d in flight", l.MaxInFlight))
	}
	if l.Rate > 0 {
		parts = append(parts, fmt.Sprintf("%s calls/s (burst %d)", rateText(l.Rate), l.Burst))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func limitText(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

func rateText(rate float64) string {
	if rate == 0 {
		return "-"
	}
	return strconv.FormatFloat(rate, 'f', -1, 64)
}

// visibleText shows an operator's or a tool's text on a terminal as typed:
// control characters and Unicode bidi controls are written as <U+XXXX>, so
// that a reason cannot reorder or hide what follows it on the line.
func visibleText(s string) string {
	if !strings.ContainsFunc(s, invisible) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if invisible(c) {
			fmt.Fprintf(&b, "<U+%04X>", c)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func invisible(c rune) bool {
	return (unicode.IsControl(c) && c != ' ') || unicode.Is(unicode.Bidi_Control, c)
}
