package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ticketRetryAfter is the Retry-After of the busy ticket system: longer
// than the runtime's wait budget.
const ticketRetryAfter = waitBudget + time.Second

// fakeAPIs are the payment, mail and ticket APIs the tools call. Each keeps
// its ledger in a table of the example's schema, so that it outlives the
// runtime's crash, and honours the idempotency key pgonce passes as a real
// API honours an Idempotency-Key header: a key it has seen gets the first
// answer again, and nothing new happens.
type fakeAPIs struct {
	db  *exampledb.DB
	out io.Writer
	// crashAfterRefund ends the runtime's process right after the payment
	// API refunded, before pgonce can record the outcome.
	crashAfterRefund bool
}

// refund refunds an amount on an order.
func (a *fakeAPIs) refund(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	var args struct {
		Order int64 `json:"order"`
		// Money is a decimal string: a JSON number could be read as a
		// float on the way.
		Amount string `json:"amount"`
	}
	if err := json.Unmarshal(req.Args, &args); err != nil || args.Order == 0 || args.Amount == "" {
		return nil, outbox.Permanent(errors.New(`refund takes {"order": <integer>, "amount": "<decimal string>"}`))
	}
	var (
		id     int64
		amount string
	)
	err := a.db.Pool.QueryRow(ctx, `INSERT INTO `+a.db.Table("payments_refunds")+` (idempotency_key, order_id, amount)
		VALUES ($1, $2, $3::text::numeric)
		ON CONFLICT (idempotency_key) DO UPDATE SET requests = payments_refunds.requests + 1
		RETURNING id, amount::text`, string(req.Key), args.Order, args.Amount).Scan(&id, &amount)
	if err != nil {
		return nil, err
	}
	if a.crashAfterRefund {
		say(a.out, "payments", "refunded %s on order %d as re_%04d (Idempotency-Key %s…)", amount, args.Order, id, req.Key[:15])
		say(a.out, "crash", "the runtime's process dies before pgonce records the refund's outcome")
		os.Exit(crashExit)
	}
	return fmt.Appendf(nil, `{"refund_id":"re_%04d","order":%d,"amount":"%s","status":"refunded"}`, id, args.Order, amount), nil
}

// sendEmail sends an e-mail. The first request of a key is accepted, and
// its answer is lost: the call runs into its deadline, an outcome nobody
// knows, which the dispatcher retries with the same key.
func (a *fakeAPIs) sendEmail(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	var args struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
		Body    string `json:"body"`
	}
	if err := json.Unmarshal(req.Args, &args); err != nil || args.To == "" {
		return nil, outbox.Permanent(errors.New(`send_email takes {"to", "subject", "body"}`))
	}
	var id, requests int64
	err := a.db.Pool.QueryRow(ctx, `INSERT INTO `+a.db.Table("mail_messages")+` (idempotency_key, recipient, subject)
		VALUES ($1, $2, $3)
		ON CONFLICT (idempotency_key) DO UPDATE SET requests = mail_messages.requests + 1
		RETURNING id, requests`, string(req.Key), args.To, args.Subject).Scan(&id, &requests)
	if err != nil {
		return nil, err
	}
	if requests == 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return fmt.Appendf(nil, `{"message_id":"msg_%04d","status":"sent"}`, id), nil
}

// createTicket opens a ticket. The ticket system is busy at the first
// request of a key and asks to be called again after ticketRetryAfter.
func (a *fakeAPIs) createTicket(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	var args struct {
		Title string `json:"title"`
		Order int64  `json:"order"`
	}
	if err := json.Unmarshal(req.Args, &args); err != nil || args.Title == "" {
		return nil, outbox.Permanent(errors.New(`create_ticket takes {"title", "order"}`))
	}
	var requests int64
	err := a.db.Pool.QueryRow(ctx, `INSERT INTO `+a.db.Table("ticket_requests")+` (idempotency_key) VALUES ($1)
		ON CONFLICT (idempotency_key) DO UPDATE SET requests = ticket_requests.requests + 1
		RETURNING requests`, string(req.Key)).Scan(&requests)
	if err != nil {
		return nil, err
	}
	if requests == 1 {
		return nil, outbox.RetryAfter(fmt.Errorf("ticket system busy: 503, Retry-After: %d", int(ticketRetryAfter.Seconds())), ticketRetryAfter)
	}
	var id int64
	err = a.db.Pool.QueryRow(ctx, `WITH inserted AS (
			INSERT INTO `+a.db.Table("tickets")+` (idempotency_key, title, order_id)
			VALUES ($1, $2, $3)
			ON CONFLICT (idempotency_key) DO NOTHING
			RETURNING id
		)
		SELECT id FROM inserted
		UNION ALL
		SELECT id FROM `+a.db.Table("tickets")+` WHERE idempotency_key = $1
		LIMIT 1`, string(req.Key), args.Title, args.Order).Scan(&id)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, `{"ticket":"TK-%04d","status":"open"}`, id), nil
}
