package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// waitBudget is how long the runtime waits for a turn's tool calls before it
// hands the model what it has: above the development preset's recovery
// bound (5s), so that the restarted runtime sees its crashed refund
// recovered, and below the ticket system's Retry-After, so that the model
// is told once that a ticket is in progress.
const waitBudget = 6 * time.Second

// maxTurns ends a conversation that goes on: a runtime never lets a model
// loop for ever.
const maxTurns = 10

// message is one message of the conversation, as chat APIs shape them.
type message struct {
	Role       string     `json:"role"` // user, assistant or tool
	Content    string     `json:"content,omitempty"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// toolCall is a tool call the model wrote: its id and its arguments are the
// model's text.
type toolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func encodeMessage(m message) string {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // a message of strings always marshals
	}
	return string(b)
}

// runtime runs one conversation's turns: it asks the model, runs the tool
// calls through pgonce, and records each finished turn.
type runtime struct {
	db     *exampledb.DB
	client *outbox.Client[pgx.Tx]
	model  *scriptedModel
	out    io.Writer
}

// runtimeLife is one process of the runtime: the tools and a dispatcher
// under the development preset, and the conversation carried on from
// where its record ends. Life 1 dies in the payment API's call.
func runtimeLife(ctx context.Context, out io.Writer, schema, life string) error {
	db, err := exampledb.Connect(ctx, exampledb.URL(), schema)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close(ctx) }()
	// pgonce's own logs go to stderr, errors only: the transcript is the
	// output.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	apis := &fakeAPIs{db: db, out: out, crashAfterRefund: life == "1"}
	registry := outbox.NewRegistry()
	for tool, provider := range map[string]outbox.ProviderFunc{
		"refund":        apis.refund,
		"send_email":    apis.sendEmail,
		"create_ticket": apis.createTicket,
	} {
		if err := registry.Register(tool, provider, outbox.IdempotentByKey); err != nil {
			return err
		}
	}

	// The development preset: a crash is recovered within seconds.
	client, err := outbox.NewPgx(db.Pool, outbox.Config{
		Schema:      schema,
		Registry:    registry,
		CallTimeout: outbox.CallTimeoutDevelopment,
		Lease:       outbox.LeaseDevelopment,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	d, err := dispatcher.New(client, dispatcher.Config{
		MaintenanceInterval: dispatcher.MaintenanceIntervalDevelopment,
		Reconcile:           dispatcher.ReconcileConfig{Grace: reconcile.GraceDevelopment},
	})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Run(runCtx); err != nil {
			logger.Error("pgonce: the dispatcher stopped", "error", err)
		}
	}()
	defer func() {
		stop()
		<-done
	}()

	r := &runtime{db: db, client: client, model: &scriptedModel{sample: life}, out: out}
	return r.converse(ctx)
}

// converse carries the conversation on from its record until the model
// answers without tool calls.
func (r *runtime) converse(ctx context.Context) error {
	history, turns, err := r.load(ctx)
	if err != nil {
		return err
	}
	var unfinished int
	if err := r.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+r.db.Table("agent_tool_calls")+`
		WHERE run_id = $1 AND turn > $2`, runID, turns).Scan(&unfinished); err != nil {
		return err
	}
	if unfinished > 0 {
		say(r.out, "runtime", "turn %d was submitted but never recorded: the runtime asks the model for it again", turns+1)
	}
	for turn := turns + 1; ; turn++ {
		if turn > maxTurns {
			return fmt.Errorf("the model did not finish within %d turns", maxTurns)
		}
		reply := r.model.respond(history)
		fmt.Fprintln(r.out, "")
		fmt.Fprintf(r.out, "turn %d\n", turn)
		if len(reply.ToolCalls) == 0 {
			say(r.out, "assistant", "%s", reply.Content)
			return r.record(ctx, turn, reply, nil, nil)
		}
		// The calls recorded before this turn: a call's step is its
		// position in the run, which a restart computes again.
		before := 0
		for _, m := range history {
			before += len(m.ToolCalls)
		}
		calls := make([]*pendingCall, len(reply.ToolCalls))
		for i, tc := range reply.ToolCalls {
			say(r.out, "assistant", "%s %s  (%s)", tc.Name, tc.Arguments, tc.ID)
			calls[i] = r.submit(ctx, turn, i+1, int64(before+i+1), tc)
		}

		// Wait for the turn's calls, together, within the budget; what is
		// not finished by then is reported in progress.
		waitCtx, cancel := context.WithTimeout(ctx, waitBudget)
		var (
			wg      sync.WaitGroup
			waiting bool
		)
		for _, call := range calls {
			if call.observation != nil {
				continue
			}
			if !waiting {
				waiting = true
				say(r.out, "runtime", "waits for the turn's calls, at most %s", waitBudget)
			}
			wg.Go(func() {
				res, err := r.client.WaitResult(waitCtx, call.submitted)
				obs := outbox.ObservationFor(res, err)
				call.observation = &obs
			})
		}
		wg.Wait()
		cancel()
		results := make([]message, len(calls))
		for i, call := range calls {
			results[i] = message{Role: "tool", ToolCallID: call.toolCall.ID, Content: string(call.observation.JSON())}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, result := range results {
			say(r.out, "tool", "%s  %s", result.ToolCallID, result.Content)
		}
		if err := r.record(ctx, turn, reply, results, calls); err != nil {
			return err
		}
		history = append(history, reply)
		history = append(history, results...)
	}
}

// pendingCall is one tool call of a turn: submitted, or already answered
// (bad arguments, a conflict).
type pendingCall struct {
	toolCall    toolCall
	step        int64
	submitted   outbox.Result
	observation *outbox.Observation
}

// submit runs one tool call through pgonce: its arguments decoded into the
// tool's type, its step found, and the key claimed in a transaction of its
// own beside the runtime's bookkeeping row.
func (r *runtime) submit(ctx context.Context, turn, index int, position int64, tc toolCall) *pendingCall {
	call := &pendingCall{toolCall: tc, step: position}
	var canonical []byte
	answer := func(res outbox.Result, err error) *pendingCall {
		obs := outbox.ObservationFor(res, err)
		call.observation = &obs
		if canonical == nil {
			say(r.out, "runtime", "step %d: %s; nothing runs", call.step, obs.Status)
		} else {
			say(r.out, "runtime", "step %d  normalised %s: %s; nothing runs", call.step, canonical, obs.Status)
		}
		return call
	}
	// The arguments are the model's JSON text. Decoded into the tool's own
	// type, every spelling of one intention is one value; its canonical form
	// (RFC 8785), which the key hashes, ignores member order and spacing.
	args, err := normalise(tc.Name, tc.Arguments)
	if err != nil {
		return answer(outbox.Result{}, err)
	}
	if canonical, err = outbox.Canonicalize(args); err != nil {
		return answer(outbox.Result{}, err)
	}
	if step, ok, err := r.openStep(ctx, tc.Name, canonical); err != nil {
		return answer(outbox.Result{}, err)
	} else if ok {
		call.step = step
		say(r.out, "runtime", "the same tool and arguments as step %d, whose outcome the model has not seen: step %d again", step, step)
	}
	res, err := r.submitTx(ctx, turn, index, canonical, call, outbox.Call{
		RunID: runID,
		Step:  call.step,
		Tool:  tc.Name,
		Args:  args,
	})
	if err != nil {
		return answer(res, err)
	}
	call.submitted = res
	how := "created"
	if !res.Created {
		how = "found " + string(res.State)
	}
	say(r.out, "runtime", "step %d  normalised %s  key %s…: %s", call.step, canonical, res.Key[:15], how)
	return call
}

// submitTx claims the call's key and writes the bookkeeping row in one
// transaction: both or neither.
func (r *runtime) submitTx(ctx context.Context, turn, index int, canonical []byte, call *pendingCall, c outbox.Call) (outbox.Result, error) {
	tx, err := r.db.Pool.Begin(ctx)
	if err != nil {
		return outbox.Result{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := r.client.SubmitTx(ctx, tx, c)
	if err != nil {
		return res, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+r.db.Table("agent_tool_calls")+`
		(run_id, turn, call_index, call_id, tool, arguments, canonical, step, key)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (run_id, turn, call_index) DO UPDATE SET
			call_id = excluded.call_id, tool = excluded.tool, arguments = excluded.arguments,
			canonical = excluded.canonical, step = excluded.step, key = excluded.key`,
		runID, turn, index, call.toolCall.ID, c.Tool, call.toolCall.Arguments, string(canonical), call.step, string(res.Key)); err != nil {
		return outbox.Result{}, fmt.Errorf("bookkeeping: %w", err)
	}
	return res, tx.Commit(ctx)
}

// openStep finds the step of a call of the run with the same tool and
// canonical arguments whose outcome the model has not seen: it was told the
// call is in progress, or was never told anything.
func (r *runtime) openStep(ctx context.Context, tool string, canonical []byte) (int64, bool, error) {
	var step int64
	err := r.db.Pool.QueryRow(ctx, `SELECT step FROM `+r.db.Table("agent_tool_calls")+`
		WHERE run_id = $1 AND tool = $2 AND canonical = $3
		GROUP BY step
		HAVING bool_and(observed IS NULL OR observed IN ('in_progress', 'unavailable'))
		ORDER BY step
		LIMIT 1`, runID, tool, string(canonical)).Scan(&step)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return step, err == nil, err
}

// record appends a finished turn to the conversation and marks what the
// model has seen of each step, in one transaction.
func (r *runtime) record(ctx context.Context, turn int, reply message, results []message, calls []*pendingCall) error {
	return pgx.BeginFunc(ctx, r.db.Pool, func(tx pgx.Tx) error {
		for _, m := range append([]message{reply}, results...) {
			if _, err := tx.Exec(ctx, `INSERT INTO `+r.db.Table("agent_messages")+` (run_id, seq, turn, message)
				SELECT $1, coalesce(max(seq), 0) + 1, $2, $3 FROM `+r.db.Table("agent_messages")+` WHERE run_id = $1`,
				runID, turn, encodeMessage(m)); err != nil {
				return fmt.Errorf("record turn %d: %w", turn, err)
			}
		}
		for _, call := range calls {
			if call.submitted.Key == "" {
				continue // answered without a key of its own: bad arguments, a conflict
			}
			if _, err := tx.Exec(ctx, `UPDATE `+r.db.Table("agent_tool_calls")+` SET observed = $3
				WHERE run_id = $1 AND step = $2`, runID, call.step, string(call.observation.Status)); err != nil {
				return fmt.Errorf("record turn %d: %w", turn, err)
			}
		}
		return nil
	})
}

// load reads the recorded conversation and how many turns it holds.
func (r *runtime) load(ctx context.Context) ([]message, int, error) {
	rows, err := r.db.Pool.Query(ctx, `SELECT turn, message FROM `+r.db.Table("agent_messages")+`
		WHERE run_id = $1 ORDER BY seq`, runID)
	if err != nil {
		return nil, 0, err
	}
	var (
		history []message
		turns   int
	)
	for rows.Next() {
		var (
			turn int
			text string
			m    message
		)
		if err := rows.Scan(&turn, &text); err != nil {
			return nil, 0, err
		}
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			return nil, 0, err
		}
		history = append(history, m)
		turns = max(turns, turn)
	}
	return history, turns, rows.Err()
}

// say prints one line of the transcript: who speaks, then what.
func say(out io.Writer, who, format string, args ...any) {
	indent := ""
	if who == "runtime" || who == "payments" || who == "crash" {
		indent = "  "
	}
	text := fmt.Sprintf(format, args...)
	fmt.Fprintf(out, "%s%-*s %s\n", indent, 11-len(indent), who, strings.TrimSpace(text))
}

// createTables makes the runtime's tables and the fake APIs' ledgers.
func createTables(ctx context.Context, db *exampledb.DB) error {
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE `+db.Table("agent_messages")+` (
			run_id text NOT NULL,
			seq integer NOT NULL,
			turn integer NOT NULL,
			message text NOT NULL,
			PRIMARY KEY (run_id, seq)
		);
		CREATE TABLE `+db.Table("agent_tool_calls")+` (
			run_id text NOT NULL,
			turn integer NOT NULL,
			call_index integer NOT NULL,
			call_id text NOT NULL,
			tool text NOT NULL,
			arguments text NOT NULL,
			canonical text NOT NULL,
			step bigint NOT NULL,
			key text NOT NULL,
			observed text,
			PRIMARY KEY (run_id, turn, call_index)
		);
		CREATE TABLE `+db.Table("payments_refunds")+` (
			id bigserial PRIMARY KEY,
			idempotency_key text NOT NULL UNIQUE,
			order_id bigint NOT NULL,
			amount numeric(12, 2) NOT NULL,
			requests integer NOT NULL DEFAULT 1
		);
		CREATE TABLE `+db.Table("mail_messages")+` (
			id bigserial PRIMARY KEY,
			idempotency_key text NOT NULL UNIQUE,
			recipient text NOT NULL,
			subject text NOT NULL,
			requests integer NOT NULL DEFAULT 1
		);
		CREATE TABLE `+db.Table("ticket_requests")+` (
			idempotency_key text PRIMARY KEY,
			requests integer NOT NULL DEFAULT 1
		);
		CREATE TABLE `+db.Table("tickets")+` (
			id bigserial PRIMARY KEY,
			idempotency_key text NOT NULL UNIQUE,
			title text NOT NULL,
			order_id bigint NOT NULL
		)`)
	if err != nil {
		return fmt.Errorf("create the example's tables: %w", err)
	}
	return nil
}
