package drivertest

import (
	"context"
	"encoding/json"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// EffectProvider returns a transactional provider that writes one row of
// its request's key into table (see [pgoncetest.EffectTable]) in its transaction and
// answers {"credited":true}; then, when after is not nil, it returns what
// after returns instead.
func EffectProvider[TTx any](table string, after func(ctx context.Context, req outbox.Request) (json.RawMessage, error)) outbox.TxProviderFunc[TTx] {
	return func(ctx context.Context, tx TTx, req outbox.Request) (json.RawMessage, error) {
		if err := pgoncetest.ExecTx(ctx, tx, "INSERT INTO "+table+" (key, attempt) VALUES ($1, $2)", string(req.Key), req.Attempt); err != nil {
			return nil, err
		}
		if after != nil {
			return after(ctx, req)
		}
		return json.RawMessage(`{"credited":true}`), nil
	}
}
