// Command natural-id runs a provider that takes no idempotency key through
// pgonce: a mail relay, whose log can be searched by Message-ID. The
// service gives every message a Message-ID of its own choosing, the same for
// every attempt of one action, and passes it as the call's natural id; the
// tool is registered LookupByNaturalID, so after any attempt whose outcome is
// unknown pgonce looks the Message-ID up before it sends again (read before
// write). Each receipt is sent once, whatever goes wrong:
//
//	go run ./examples/natural-id
//
// Three receipts meet three faults: the connection drops after the relay
// took the message (the lookup finds it: nothing is sent again); a timeout
// before the relay took it (the lookup finds nothing: it is sent); the
// worker dies while the relay has the message (the reconciler's lookup
// finds it). The program exits 1 unless the relay's log holds each
// Message-ID once.
//
// The database is $PGONCE_DATABASE_URL, else $DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. The program
// makes the schema -schema (default pgonce_example_natural_id), migrates it,
// and drops it at the end unless -keep.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// waitTimeout bounds each wait, so that a broken promise ends the program
// instead of hanging it; the development preset resolves a crash in 5s.
const waitTimeout = time.Minute

func main() {
	schema := flag.String("schema", "pgonce_example_natural_id", "the schema to make, use and drop")
	keep := flag.Bool("keep", false, "keep the schema at the end, to look at it with the pgonce command")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, *schema, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "natural-id:", err)
		os.Exit(1)
	}
}

// fault is what goes wrong at a message's first attempt.
type fault int

const (
	// dropAfter: the relay takes the message, and the connection drops
	// before its answer arrives.
	dropAfter fault = iota
	// timeoutBefore: the call times out before the relay took the message;
	// the sender cannot tell this from dropAfter.
	timeoutBefore
	// hangAfter: the relay takes the message and the worker dies before it
	// hears back.
	hangAfter
)

// relay is a mail relay that takes no idempotency key. Its log, a table of
// the example's schema, can be searched by Message-ID.
type relay struct {
	db     *exampledb.DB
	out    io.Writer
	faults map[string]fault // by Message-ID, at the first attempt
	// taken is signalled when a hangAfter message has been taken.
	taken chan struct{}
}

type receipt struct {
	Order int64  `json:"order"`
	To    string `json:"to"`
}

// Call sends the receipt with req.NaturalID as its Message-ID.
func (r *relay) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	var args receipt
	if err := json.Unmarshal(req.Args, &args); err != nil {
		return nil, outbox.Permanent(fmt.Errorf("send_receipt takes {order, to}: %w", err))
	}
	fault, faulty := r.faults[req.NaturalID]
	faulty = faulty && req.Attempt == 1
	if faulty && fault == timeoutBefore {
		r.say(req, "send", "timed out before the relay took the message: the outcome is unknown")
		return nil, outbox.Ambiguous(errors.New("timed out connecting to the relay"))
	}
	var queuedAs string
	err := r.db.Pool.QueryRow(ctx, `INSERT INTO `+r.db.Table("relay_log")+` (message_id, recipient, subject)
		VALUES ($1, $2, $3)
		RETURNING 'q-' || lpad(seq::text, 4, '0')`,
		req.NaturalID, args.To, fmt.Sprintf("Your receipt for order %d", args.Order)).Scan(&queuedAs)
	if err != nil {
		return nil, err
	}
	response := fmt.Appendf(nil, `{"message_id":%q,"queued_as":%q}`, req.NaturalID, queuedAs)
	switch {
	case faulty && fault == dropAfter:
		r.say(req, "send", "the relay took the message as %s, and the connection dropped before its answer: the outcome is unknown", queuedAs)
		return nil, outbox.Ambiguous(errors.New("connection reset after DATA"))
	case faulty && fault == hangAfter:
		r.say(req, "send", "the relay took the message as %s; the worker dies before it hears back", queuedAs)
		r.taken <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r.say(req, "send", "the relay took the message as %s", queuedAs)
	return response, nil
}

// Lookup searches the relay's log for req.NaturalID: read before write.
func (r *relay) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	var queuedAs string
	err := r.db.Pool.QueryRow(ctx, `SELECT 'q-' || lpad(seq::text, 4, '0') FROM `+r.db.Table("relay_log")+`
		WHERE message_id = $1`, req.NaturalID).Scan(&queuedAs)
	if errors.Is(err, pgx.ErrNoRows) {
		r.say(req, "lookup", "not in the relay's log: it is sent")
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	r.say(req, "lookup", "in the relay's log as %s: recorded as the response, not sent again", queuedAs)
	return fmt.Appendf(nil, `{"message_id":%q,"queued_as":%q}`, req.NaturalID, queuedAs), true, nil
}

func (r *relay) say(req outbox.Request, what, format string, args ...any) {
	fmt.Fprintf(r.out, "   attempt %d  %-6s  %s\n", req.Attempt, what, fmt.Sprintf(format, args...))
}

func run(ctx context.Context, out io.Writer, schema string, keep bool) (err error) {
	db, err := exampledb.Open(ctx, exampledb.URL(), schema, "natural-id")
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			db.Keep()
			fmt.Fprintf(out, "\nkept schema %s; drop it with DROP SCHEMA %s CASCADE\n", schema, schema)
		}
		if closeErr := db.Close(ctx); err == nil {
			err = closeErr
		}
	}()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("relay_log")+` (
		seq bigserial PRIMARY KEY,
		message_id text NOT NULL,
		recipient text NOT NULL,
		subject text NOT NULL
	)`); err != nil {
		return fmt.Errorf("create the relay's log: %w", err)
	}

	mail := &relay{db: db, out: out, taken: make(chan struct{}, 1), faults: map[string]fault{
		messageID(8842): dropAfter,
		messageID(8843): timeoutBefore,
		messageID(8844): hangAfter,
	}}
	registry := outbox.NewRegistry()
	if err := registry.Register("send_receipt", mail, outbox.LookupByNaturalID); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// The development preset: the worker that dies in the third receipt is
	// resolved within seconds.
	client, err := outbox.NewPgx(db.Pool, outbox.Config{
		Schema:      schema,
		Registry:    registry,
		CallTimeout: outbox.CallTimeoutDevelopment,
		Lease:       outbox.LeaseDevelopment,
		Logger:      quiet,
	})
	if err != nil {
		return err
	}
	config := dispatcher.Config{
		Concurrency:         1,
		MaintenanceInterval: dispatcher.MaintenanceIntervalDevelopment,
		Reconcile:           dispatcher.ReconcileConfig{Grace: reconcile.GraceDevelopment},
	}

	fmt.Fprintln(out, "pgonce example: a provider without keys, looked up by its natural id")
	fmt.Fprintln(out, "")
	fmt.Fprintln(out, `The mail relay takes no idempotency key. Tool "send_receipt" is registered LookupByNaturalID:`)
	fmt.Fprintln(out, "each receipt's Message-ID is its call's natural id, and after an attempt whose outcome is")
	fmt.Fprintln(out, "unknown pgonce searches the relay's log for it before it sends again.")

	worker, err := startDispatcher(ctx, client, config)
	if err != nil {
		return err
	}
	defer func() { worker.stop() }()
	for _, order := range []int64{8842, 8843} {
		if err := sendReceipt(ctx, out, client, order, nil); err != nil {
			return err
		}
	}

	// The third receipt: the worker dies while the relay has the message.
	// Stopped with ShutdownTimeout -1 in the middle of the call, the
	// dispatcher records nothing, as a killed process would not: the key
	// stays in flight under its lease.
	worker.stop()
	dying := config
	dying.ShutdownTimeout = -1
	if worker, err = startDispatcher(ctx, client, dying); err != nil {
		return err
	}
	err = sendReceipt(ctx, out, client, 8844, func() error {
		select {
		case <-mail.taken:
		case <-ctx.Done():
			return ctx.Err()
		}
		worker.stop()
		fmt.Fprintln(out, "   a new worker starts; its maintenance reconciles the key once its lease and grace have passed")
		worker, err = startDispatcher(ctx, client, config)
		return err
	})
	if err != nil {
		return err
	}
	return relayLog(ctx, out, db)
}

func messageID(order int64) string { return fmt.Sprintf("<receipt-%d@shop.example>", order) }

// sendReceipt submits the receipt of order and waits for its outcome;
// during, when not nil, runs while the receipt is being sent.
func sendReceipt(ctx context.Context, out io.Writer, client *outbox.Client[pgx.Tx], order int64, during func() error) error {
	call := outbox.Call{
		// A business key: the receipt of an order is sent once, whoever
		// asks for it.
		Key:       fmt.Sprintf("receipt:order-%d", order),
		Tool:      "send_receipt",
		Args:      receipt{Order: order, To: "ana@example.com"},
		NaturalID: messageID(order),
	}
	fmt.Fprintln(out, "")
	fmt.Fprintf(out, "Receipt for order %d, Message-ID %s\n", order, call.NaturalID)
	res, err := client.Submit(ctx, call)
	if err != nil {
		return err
	}
	if during != nil {
		if err := during(); err != nil {
			return err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	res, err = client.WaitResult(waitCtx, res)
	if err != nil {
		return fmt.Errorf("receipt for order %d: %w", order, err)
	}
	fmt.Fprintf(out, "   %s after %d attempts: %s\n", res.State, res.Attempts, res.Response)
	return nil
}

// worker is a dispatcher running in the background.
type worker struct {
	stop func()
}

func startDispatcher(ctx context.Context, client *outbox.Client[pgx.Tx], config dispatcher.Config) (*worker, error) {
	d, err := dispatcher.New(client, config)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Run(runCtx)
	}()
	stopped := false
	return &worker{stop: func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}}, nil
}

// relayLog prints the relay's log and fails unless it holds each
// Message-ID once.
func relayLog(ctx context.Context, out io.Writer, db *exampledb.DB) error {
	rows, err := db.Pool.Query(ctx, `SELECT 'q-' || lpad(seq::text, 4, '0'), message_id,
		count(*) OVER (PARTITION BY message_id) FROM `+db.Table("relay_log")+` ORDER BY seq`)
	if err != nil {
		return err
	}
	type entry struct {
		queuedAs, messageID string
		copies              int
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (entry, error) {
		var e entry
		return e, row.Scan(&e.queuedAs, &e.messageID, &e.copies)
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "")
	fmt.Fprintf(out, "The relay's log: %d messages\n", len(entries))
	for _, e := range entries {
		fmt.Fprintf(out, "   %s  %s\n", e.queuedAs, e.messageID)
		if e.copies != 1 {
			return fmt.Errorf("the relay sent %s %d times", e.messageID, e.copies)
		}
	}
	if len(entries) != 3 {
		return fmt.Errorf("expected 3 messages in the relay's log, got %d", len(entries))
	}
	fmt.Fprintln(out, "Each receipt sent once.")
	return nil
}
