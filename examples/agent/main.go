// Command agent is an agent runtime whose model emits tool calls, run
// through pgonce: a customer was charged twice, and the model refunds the
// order, e-mails the customer and opens a ticket, while the runtime crashes
// after the payment API refunded, restarts, and the model asks for the same
// actions again, spelled otherwise. It ends with exactly one refund, one
// e-mail and one ticket.
//
//	go run ./examples/agent
//
// The model is scripted and the three APIs are fakes that keep their
// ledgers in tables of their own, so that they outlive the runtime's crash
// as real ones do; everything else is the runtime a service would write:
//
//   - Each tool call of the model is a pgonce step call: its run id is the
//     conversation's, and its step is its position in the run (the calls
//     recorded before its turn, plus its index in the turn), which a
//     restarted runtime computes again from its recorded conversation.
//     Nothing the model wrote goes into the key but the arguments,
//     canonicalised: not its call ids, not its prose, no timestamp.
//   - A call that repeats, with the same tool and canonical arguments, a call
//     of the run whose outcome the model has not seen yet (it was told "in
//     progress", or it never heard back) is that call asked again: it takes
//     that call's step, and so its key. This is what makes the model's "ask
//     again with the same arguments" reach the same action.
//   - Each call is submitted in a transaction of its own, beside the
//     runtime's bookkeeping row for it; a dispatcher in the same process runs
//     the tools. The runtime waits for a turn's calls with a budget and puts
//     [outbox.ObservationFor]'s JSON in the model's context as each call's
//     result: succeeded, in progress, conflict, whatever came back.
//   - The runtime runs under pgonce's development preset (docs/examples.md),
//     so that the refund its crash left in flight is recovered within
//     seconds by the restarted runtime's dispatcher.
//
// The runtime runs twice as a child process of this program: the first
// process dies inside the payment API's call, the second finishes the
// conversation. The program then prints the three ledgers and exits 1 unless
// each holds exactly one entry.
//
// The database is $PGONCE_DATABASE_URL, else $DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. The program
// makes the schema -schema (default pgonce_example_agent), migrates it, and
// drops it at the end unless -keep.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

const (
	// runID is the conversation's id: the run id of every call.
	runID = "run-8842"
	// lifeEnv tells a child process which of the runtime's lives it runs.
	lifeEnv = "PGONCE_EXAMPLE_AGENT_LIFE"
	// crashExit is the exit status of the runtime process that dies.
	crashExit = 3
	// exampleName marks the schema as this example's.
	exampleName = "agent"
)

// userMessage is what the customer asks.
const userMessage = "Order 8842 was charged twice. Please refund the extra 42.00, " +
	"e-mail me when it is done, and open a ticket so that billing finds out why."

func main() {
	schema := flag.String("schema", "pgonce_example_agent", "the schema to make, use and drop")
	keep := flag.Bool("keep", false, "keep the schema at the end, to look at it with the pgonce command")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	if life := os.Getenv(lifeEnv); life != "" {
		err = runtimeLife(ctx, os.Stdout, *schema, life)
	} else {
		err = story(ctx, os.Stdout, *schema, *keep)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// story sets the scene, runs the runtime twice and checks the ledgers.
func story(ctx context.Context, out io.Writer, schema string, keep bool) (err error) {
	db, err := exampledb.Open(ctx, exampledb.URL(), schema, exampleName)
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			db.Keep()
			fmt.Fprintf(out, "\nkept schema %s: look at it with pgonce --schema %s console; drop it with DROP SCHEMA %s CASCADE\n", schema, schema, schema)
		}
		if closeErr := db.Close(ctx); err == nil {
			err = closeErr
		}
	}()
	if err := createTables(ctx, db); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("agent_messages")+` (run_id, seq, turn, message)
		VALUES ($1, 1, 0, $2)`, runID, encodeMessage(message{Role: "user", Content: userMessage})); err != nil {
		return fmt.Errorf("start the conversation: %w", err)
	}

	fmt.Fprintln(out, "pgonce example: an agent runtime whose model emits tool calls")
	fmt.Fprintln(out, "")
	fmt.Fprintf(out, "Run %s. The model's tools, each a fake API that honours idempotency keys:\n", runID)
	fmt.Fprintln(out, "  refund(order, amount: a decimal string)  the payment API")
	fmt.Fprintln(out, "  send_email(to, subject, body)            the mail API; its first answer is lost (a timeout)")
	fmt.Fprintf(out, "  create_ticket(title, order)              the ticket system; busy at first (503, Retry-After: %d)\n",
		int(ticketRetryAfter.Seconds()))
	fmt.Fprintln(out, "A tool call's step is its position in the run; its key hashes the run id, the step, the tool")
	fmt.Fprintln(out, "and the arguments, decoded into the tool's types (an amount is a string with two decimals)")
	fmt.Fprintln(out, "and canonicalised. The runtime runs under pgonce's development preset.")
	fmt.Fprintln(out, "")
	say(out, "user", "%s", userMessage)

	fmt.Fprintln(out, "")
	fmt.Fprintln(out, "── the runtime starts (process 1)")
	if err := runChild(ctx, schema, "1"); !isExit(err, crashExit) {
		return fmt.Errorf("the first runtime process should have crashed in the refund: %w", err)
	}
	fmt.Fprintln(out, "")
	fmt.Fprintln(out, "── the runtime restarts (process 2)")
	if err := runChild(ctx, schema, "2"); err != nil {
		return fmt.Errorf("the restarted runtime: %w", err)
	}
	return ledgers(ctx, out, db)
}

// runChild runs this program again as the runtime's life, with the same
// output.
func runChild(ctx context.Context, schema, life string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "-schema", schema) //nolint:gosec // this program itself
	cmd.Env = append(os.Environ(), lifeEnv+"="+life)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func isExit(err error, code int) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.ExitCode() == code
}

// ledgers prints what the three APIs did and pgonce's view of the run, and
// fails unless each API acted exactly once.
func ledgers(ctx context.Context, out io.Writer, db *exampledb.DB) error {
	type entry struct {
		id, what string
		requests int
	}
	read := func(query string) ([]entry, error) {
		rows, err := db.Pool.Query(ctx, query)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(row pgx.CollectableRow) (entry, error) {
			var e entry
			return e, row.Scan(&e.id, &e.what, &e.requests)
		})
	}
	refunds, err := read(`SELECT 're_' || lpad(id::text, 4, '0'), amount::text || ' on order ' || order_id, requests FROM ` +
		db.Table("payments_refunds") + ` ORDER BY id`)
	if err != nil {
		return err
	}
	mails, err := read(`SELECT 'msg_' || lpad(id::text, 4, '0'), 'to ' || recipient || ': ' || subject, requests FROM ` +
		db.Table("mail_messages") + ` ORDER BY id`)
	if err != nil {
		return err
	}
	tickets, err := read(`SELECT 'TK-' || lpad(t.id::text, 4, '0'), t.title, r.requests FROM ` + db.Table("tickets") + ` t
		JOIN ` + db.Table("ticket_requests") + ` r USING (idempotency_key) ORDER BY t.id`)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "")
	fmt.Fprintln(out, "── what the APIs did")
	for _, ledger := range []struct {
		name, noun string
		entries    []entry
	}{{"payments", "refund", refunds}, {"mail", "e-mail", mails}, {"tickets", "ticket", tickets}} {
		noun := ledger.noun
		if len(ledger.entries) != 1 {
			noun += "s"
		}
		fmt.Fprintf(out, "%-9s %d %s\n", ledger.name, len(ledger.entries), noun)
		for _, e := range ledger.entries {
			fmt.Fprintf(out, "          %s  %s  (requests with its key: %d)\n", e.id, e.what, e.requests)
		}
	}

	client, err := outbox.NewPgx(db.Pool, outbox.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	run, err := client.RunSteps(ctx, outbox.RunParams{RunID: runID})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "")
	fmt.Fprintf(out, "── pgonce's view of %s (Client.RunSteps)\n", runID)
	for _, step := range run.Steps {
		fmt.Fprintf(out, "step %d  %-13s %s\n", step.Step, step.Tool, step.State)
	}

	if len(refunds) != 1 || len(mails) != 1 || len(tickets) != 1 {
		return fmt.Errorf("expected one refund, one e-mail and one ticket, got %d, %d and %d", len(refunds), len(mails), len(tickets))
	}
	fmt.Fprintln(out, "")
	fmt.Fprintln(out, "Exactly one refund, one e-mail, one ticket.")
	return nil
}
