package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/outbox"
)

// demoPayments is a fake payment provider that honours idempotency keys: a
// refund is recorded once per key in its ledger, and a repeated key returns
// the original refund's response. Its first call acts and then loses the
// response, like a timeout after the request reached the provider.
type demoPayments struct {
	pool   *pgxpool.Pool
	ledger string // quoted table name
	calls  atomic.Int32

	lossy   atomic.Bool
	called  chan struct{} // the lossy call has started
	proceed chan struct{} // the lossy call may act
	acted   chan struct{} // the lossy call has refunded; its response is lost
	lost    []byte        // the response the lossy call never returned
}

func (p *demoPayments) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	p.calls.Add(1)
	lossy := p.lossy.CompareAndSwap(true, false)
	if lossy {
		p.called <- struct{}{}
		select {
		case <-p.proceed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp, err := p.refund(ctx, req)
	if err != nil {
		return nil, err
	}
	if lossy {
		p.lost = resp
		p.acted <- struct{}{}
		<-ctx.Done() // the response never makes it back
		return nil, ctx.Err()
	}
	return resp, nil
}

// refund records one refund per idempotency key and returns its response.
// The response's spacing is the provider's own; pgonce stores and replays it
// byte for byte.
func (p *demoPayments) refund(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	var args struct {
		Order int64 `json:"order"`
		// Money travels as a decimal string: a JSON number could be read
		// as a float on the way.
		Amount string `json:"amount"`
	}
	if err := json.Unmarshal(req.Args, &args); err != nil {
		return nil, outbox.Permanent(fmt.Errorf("bad refund arguments: %w", err))
	}
	_, err := p.pool.Exec(ctx, `INSERT INTO `+p.ledger+` (idempotency_key, order_id, amount)
		VALUES ($1, $2, $3::text::numeric)
		ON CONFLICT (idempotency_key) DO NOTHING`,
		string(req.Key), args.Order, args.Amount)
	if err != nil {
		return nil, err
	}
	var (
		id     int64
		order  int64
		amount string
	)
	err = p.pool.QueryRow(ctx, `SELECT id, order_id, amount::text FROM `+p.ledger+` WHERE idempotency_key = $1`,
		string(req.Key)).Scan(&id, &order, &amount)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, `{"refund_id": "re_%04d", "order": %d, "amount": "%s", "currency": "EUR", "status": "refunded"}`,
		id, order, amount), nil
}

type ledgerRow struct {
	refundID string
	order    int64
	amount   string
	key      string
}

func (p *demoPayments) rows(ctx context.Context) ([]ledgerRow, error) {
	rows, err := p.pool.Query(ctx, `SELECT 're_' || lpad(id::text, 4, '0'), order_id, amount::text, idempotency_key
		FROM `+p.ledger+` ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ledgerRow, error) {
		var r ledgerRow
		return r, row.Scan(&r.refundID, &r.order, &r.amount, &r.key)
	})
}

// retryAfterPattern masks the one clock-dependent number the demo prints.
var retryAfterPattern = regexp.MustCompile(`"retry_after_ms":\d+`)

func maskObservation(obs []byte) string {
	return retryAfterPattern.ReplaceAllString(string(obs), `"retry_after_ms":…`)
}

// demoMailer is a mailer whose call sends and then times out.
type demoMailer struct{}

func (demoMailer) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	return nil, outbox.Ambiguous(errors.New("mail server timed out after accepting the message"))
}
