package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/user"

	"github.com/pgonce/pgonce/outbox"
)

func resolveCommand() *command {
	return &command{
		name:     "resolve",
		synopsis: "resolve KEY (--succeeded --response JSON | --failed --failure JSON | --retry) --reason TEXT [--by WHO] [--json]",
		summary:  "decide a needs-review key: it happened, it failed, or run it again",
		help: `Applies an operator's decision to a key in needs review and records who
decided, why and when (see inspect):

  --succeeded --response JSON   the action happened; JSON is stored as the
                                key's response and replayed verbatim
  --failed --failure JSON       the action did not happen and must not run;
                                JSON is stored as the failure
  --retry                       the action did not happen; back to pending,
                                a dispatcher runs it again with the same key

A key in any other state exits 5 and changes nothing; an unknown key exits 4.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			succeeded := fs.Bool("succeeded", false, "the action happened (needs --response)")
			failed := fs.Bool("failed", false, "the action did not happen and must not run (needs --failure)")
			retry := fs.Bool("retry", false, "the action did not happen: run it again")
			response := fs.String("response", "", "JSON stored as the response, with --succeeded")
			failure := fs.String("failure", "", "JSON stored as the failure, with --failed")
			reason := fs.String("reason", "", "why (required)")
			by := fs.String("by", operatorName(), "who decides (default: $USER, else $LOGNAME, else the account running pgonce)")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return usageErrorf("want exactly one KEY")
				}
				key, err := outbox.ParseKey(args[0])
				if err != nil {
					return err
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				var resolution outbox.Resolution
				switch {
				case btoi(*succeeded)+btoi(*failed)+btoi(*retry) != 1:
					return usageErrorf("give exactly one of --succeeded, --failed, --retry")
				case *succeeded:
					if !set["response"] || set["failure"] {
						return usageErrorf("--succeeded needs --response JSON (and no --failure)")
					}
					resolution = outbox.Resolution{Action: outbox.ResolveSucceeded, Response: json.RawMessage(*response)}
				case *failed:
					if !set["failure"] || set["response"] {
						return usageErrorf("--failed needs --failure JSON (and no --response)")
					}
					resolution = outbox.Resolution{Action: outbox.ResolveFailed, Failure: json.RawMessage(*failure)}
				default:
					if set["response"] || set["failure"] {
						return usageErrorf("--retry takes no --response or --failure")
					}
					resolution = outbox.Resolution{Action: outbox.ResolveRetry}
				}
				if resolution.Response != nil && !json.Valid(resolution.Response) {
					return usageErrorf("--response is not valid JSON: %q", *response)
				}
				if resolution.Failure != nil && !json.Valid(resolution.Failure) {
					return usageErrorf("--failure is not valid JSON: %q", *failure)
				}
				if *reason == "" {
					return usageErrorf("--reason is required: say why, for whoever reads the history")
				}
				if *by == "" {
					return usageErrorf("--by is required: neither $USER, $LOGNAME nor the operating system names who runs pgonce")
				}
				resolution.Reason, resolution.By = *reason, *by
				return e.resolve(ctx, key, resolution, *asJSON)
			}
		},
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (e *env) resolve(ctx context.Context, key outbox.Key, resolution outbox.Resolution, asJSON bool) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	res, err := client.Resolve(ctx, key, resolution)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, struct {
			Key    outbox.Key              `json:"key"`
			Action outbox.ResolutionAction `json:"action"`
			State  outbox.State            `json:"state"`
			By     string                  `json:"by"`
			Reason string                  `json:"reason"`
		}{res.Key, resolution.Action, res.State, resolution.By, resolution.Reason})
	}
	fmt.Fprintf(e.stdout, "resolved %s: %s by %s; the key is now %s\n", res.Key, resolution.Action, resolution.By, res.State)
	return nil
}

// operatorName is who runs the CLI, for --by: $USER, else $LOGNAME (set
// where $USER is not, as in cron and some containers), else the operating
// system's account name, else "" (then --by must be given).
func operatorName() string {
	if name := cmp.Or(os.Getenv("USER"), os.Getenv("LOGNAME")); name != "" {
		return name
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}
