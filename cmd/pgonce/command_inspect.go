package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

func inspectCommand() *command {
	return &command{
		name:     "inspect",
		synopsis: "inspect KEY [--json]",
		summary:  "a key's full record: identity, state, response, attempts, queue, resolutions",
		help: `Prints everything pgonce knows about KEY: the call's identity and canonical
arguments, its state and attempts, the stored response or failure exactly
as recorded, its queue fields while the key is pending or in flight, and the
operator resolutions recorded for it.

Text output prints the response and failure bytes raw, as stored. With
--json they are embedded verbatim, byte for byte; bytes that are not valid
JSON are embedded as a JSON string instead. A pruned key shows its tombstone
(state expired). An unknown key exits 4.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return usageErrorf("want exactly one KEY")
				}
				key, err := outbox.ParseKey(args[0])
				if err != nil {
					return err
				}
				return e.inspect(ctx, key, *asJSON)
			}
		},
	}
}

// inspectHead is the JSON of `inspect --json` without the verbatim members
// (args, response, failure), which are appended as stored.
type inspectHead struct {
	Key         outbox.Key          `json:"key"`
	State       outbox.State        `json:"state"`
	Tool        string              `json:"tool,omitempty"`
	Tenant      string              `json:"tenant"`
	RunID       string              `json:"run_id"`
	Step        int64               `json:"step"`
	BusinessKey string              `json:"business_key"`
	NaturalID   string              `json:"natural_id"`
	Fingerprint string              `json:"fingerprint,omitempty"`
	Attempts    int                 `json:"attempts"`
	LastError   string              `json:"last_error,omitempty"`
	CreatedAt   *time.Time          `json:"created_at,omitempty"`
	UpdatedAt   *time.Time          `json:"updated_at,omitempty"`
	CompletedAt *time.Time          `json:"completed_at,omitempty"`
	ExpiresAt   *time.Time          `json:"expires_at,omitempty"`
	Queue       *inspectQueue       `json:"queue"`
	Resolutions []inspectResolution `json:"resolutions"`
	// AttemptHistory is every attempt of the key (outbox's
	// Inspection.AttemptHistory); ExpiredFrom a tombstone's final state.
	AttemptHistory []outbox.AttemptRecord `json:"attempt_history"`
	ExpiredFrom    outbox.State           `json:"expired_from,omitempty"`
	// Metadata, Delivery and KeyRetentionMS are stored with the key at
	// submit; a tombstone keeps none of them.
	Metadata       map[string]string `json:"metadata,omitempty"`
	Delivery       string            `json:"delivery,omitempty"`
	KeyRetentionMS int64             `json:"key_retention_ms,omitempty"`
}

type inspectQueue struct {
	AvailableAt      *time.Time `json:"available_at,omitempty"`
	LeaseUntil       *time.Time `json:"lease_until,omitempty"`
	Worker           string     `json:"worker,omitempty"`
	FirstAttemptedAt *time.Time `json:"first_attempted_at,omitempty"`
	Ambiguous        bool       `json:"ambiguous"`
	LastError        string     `json:"last_error,omitempty"`
}

type inspectResolution struct {
	Action     outbox.ResolutionAction `json:"action"`
	By         string                  `json:"by"`
	Reason     string                  `json:"reason"`
	ResolvedAt time.Time               `json:"resolved_at"`
}

func (e *env) inspect(ctx context.Context, key outbox.Key, asJSON bool) error {
	c, client, err := e.migratedClient(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	in, err := client.Inspect(ctx, key)
	if err != nil && !errors.Is(err, outbox.ErrExpired) {
		return err
	}
	if asJSON {
		return printInspectJSON(e, in)
	}
	return printInspect(e, in)
}

func printInspectJSON(e *env, in outbox.Inspection) error {
	head := inspectHead{
		Key:         in.Key,
		State:       in.State,
		Tool:        in.Tool,
		Tenant:      in.Tenant,
		RunID:       in.RunID,
		Step:        in.Step,
		BusinessKey: in.BusinessKey,
		NaturalID:   in.NaturalID,
		Fingerprint: in.Fingerprint,
		Attempts:    in.Attempts,
		LastError:   in.LastError,
		CreatedAt:   timePtr(in.CreatedAt),
		UpdatedAt:   timePtr(in.UpdatedAt),
		CompletedAt: timePtr(in.CompletedAt),
		ExpiresAt:   timePtr(in.ExpiresAt),
		Resolutions: []inspectResolution{},
		Metadata:    in.Metadata,
		ExpiredFrom: in.ExpiredFrom,
	}
	head.AttemptHistory = make([]outbox.AttemptRecord, 0, len(in.AttemptHistory))
	for _, a := range in.AttemptHistory {
		a.StartedAt, a.EndedAt = a.StartedAt.UTC(), a.EndedAt.UTC()
		head.AttemptHistory = append(head.AttemptHistory, a)
	}
	if in.State != outbox.StateExpired {
		head.Delivery, head.KeyRetentionMS = in.Delivery.String(), in.KeyRetention.Milliseconds()
	}
	if q := in.Queue; q != nil {
		head.Queue = &inspectQueue{
			AvailableAt:      timePtr(q.AvailableAt),
			LeaseUntil:       timePtr(q.LeaseUntil),
			Worker:           q.Worker,
			FirstAttemptedAt: timePtr(q.FirstAttemptedAt),
			Ambiguous:        q.Ambiguous,
			LastError:        q.LastError,
		}
	}
	for _, r := range in.Resolutions {
		head.Resolutions = append(head.Resolutions, inspectResolution{
			Action: r.Action, By: r.By, Reason: r.Reason, ResolvedAt: r.ResolvedAt.UTC(),
		})
	}
	body, err := jsonWithRaw(head,
		rawField{name: "args", value: in.Args},
		rawField{name: "response", value: in.Response},
		rawField{name: "failure", value: in.Failure},
	)
	if err != nil {
		return err
	}
	_, err = e.stdout.Write(body)
	return err
}

func printInspect(e *env, in outbox.Inspection) error {
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	line := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	line("key", string(in.Key))
	line("state", string(in.State))
	if in.State == outbox.StateExpired {
		if in.ExpiredFrom != "" {
			line("finished", string(in.ExpiredFrom))
		}
		line("completed at", formatTime(in.CompletedAt))
		line("forgotten at", formatTime(in.ExpiresAt))
		fmt.Fprintln(tw, "\tpruned: only the tombstone remains; a duplicate is told it expired, and nothing runs again until it is forgotten")
		return tw.Flush()
	}
	line("tool", in.Tool)
	line("tenant", in.Tenant)
	if in.BusinessKey != "" {
		line("business key", in.BusinessKey)
	} else {
		line("run id", in.RunID)
		line("step", fmt.Sprint(in.Step))
	}
	line("natural id", in.NaturalID)
	line("fingerprint", in.Fingerprint)
	line("args", string(in.Args))
	line("metadata", formatMetadata(in.Metadata))
	line("delivery", in.Delivery.String())
	if in.KeyRetention > 0 {
		line("key retention", formatDuration(in.KeyRetention))
	}
	line("attempts", fmt.Sprint(in.Attempts))
	// Why the last attempt did not succeed, whatever the state: the error
	// a retry, a give-up, a permanent failure or a needs review left.
	line("last error", cmp.Or(in.LastError, "-"))
	line("created at", formatTime(in.CreatedAt))
	line("updated at", formatTime(in.UpdatedAt))
	line("completed at", formatTime(in.CompletedAt))
	line("expires at", formatTime(in.ExpiresAt))
	if q := in.Queue; q != nil {
		line("queue", "")
		line("  available at", formatTime(q.AvailableAt))
		line("  lease until", formatTime(q.LeaseUntil))
		line("  worker", q.Worker)
		line("  first attempt", formatTime(q.FirstAttemptedAt))
		line("  ambiguous", fmt.Sprint(q.Ambiguous))
	} else {
		line("queue", "-")
	}
	if len(in.Resolutions) == 0 {
		line("resolutions", "-")
	} else {
		line("resolutions", "")
		for _, r := range in.Resolutions {
			fmt.Fprintf(tw, "  %s\t%s by %s: %s\n", formatTime(r.ResolvedAt), r.Action, r.By, r.Reason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(in.AttemptHistory) > 0 {
		fmt.Fprintln(e.stdout, "attempt history:")
		attempts := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		for _, a := range in.AttemptHistory {
			fmt.Fprintf(attempts, "  #%d\t%s\t%s by %s, ended %s%s\n", a.Attempt, formatTime(a.StartedAt), a.Outcome,
				cmp.Or(a.Worker, "-"), formatTime(a.EndedAt), errorSuffix(a.Error))
		}
		if err := attempts.Flush(); err != nil {
			return err
		}
	}
	// The stored bytes, raw, after everything else: they may span lines.
	if in.Response != nil {
		fmt.Fprintf(e.stdout, "response (%d bytes, verbatim):\n", len(in.Response))
		if err := writeRaw(e, in.Response); err != nil {
			return err
		}
	}
	if in.Failure != nil {
		fmt.Fprintf(e.stdout, "failure (%d bytes, verbatim):\n", len(in.Failure))
		if err := writeRaw(e, in.Failure); err != nil {
			return err
		}
	}
	return nil
}

// errorSuffix is ": " and err on one line, or nothing.
func errorSuffix(err string) string {
	if err == "" {
		return ""
	}
	return ": " + oneLine(err, 120)
}

// writeRaw writes b and ends the line, unless b already ends one.
func writeRaw(e *env, b []byte) error {
	if _, err := e.stdout.Write(b); err != nil {
		return err
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		_, err := fmt.Fprintln(e.stdout)
		return err
	}
	return nil
}

// formatMetadata writes metadata as JSON, its names sorted; "-" for none.
func formatMetadata(metadata map[string]string) string {
	if len(metadata) == 0 {
		return "-"
	}
	body, err := json.Marshal(metadata)
	if err != nil {
		return "-"
	}
	return string(body)
}
