package attempt

import (
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// lostCommitTx is a transactional attempt's transaction whose COMMIT reply
// is lost: its Commit commits (or, with rollBack set, rolls back) on the
// server and then reports a connection that broke, as a connection killed
// during COMMIT does.
type lostCommitTx struct {
	tx       pgx.Tx
	driver   *store.PgxDriver
	table    string
	rollBack bool
}

func (l *lostCommitTx) Call(ctx context.Context, req Request) (json.RawMessage, error) {
	_, err := l.tx.Exec(ctx, "INSERT INTO "+l.table+" (key, attempt) VALUES ($1, $2)", req.Key, req.Attempt)
	return json.RawMessage(`{"credited":true}`), err
}

func (l *lostCommitTx) Executor() store.Executor { return l.driver.UnwrapExecutor(l.tx) }

func (l *lostCommitTx) Commit(ctx context.Context) error {
	if l.rollBack {
		_ = l.tx.Rollback(ctx)
	} else if err := l.tx.Commit(ctx); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

func (l *lostCommitTx) Rollback(ctx context.Context) error { return l.tx.Rollback(ctx) }

func TestRunTxSettlesALostCommitByReadingTheKeyBack(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name     string
		rollBack bool
		want     store.State
		effects  int
	}{
		{name: "CommitTook", want: store.StateSucceeded, effects: 1},
		{name: "CommitDidNotTake", rollBack: true, want: store.StateOpen, effects: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bundle := setup(t)
			table := pgoncetest.EffectTable(t, bundle.schema)
			driver, err := store.NewPgxDriver(pgoncetest.Pool(t), bundle.schema)
			require.NoError(t, err)
			tool := &Tool{Name: "refund", Delivery: store.DeliveryTransactional, Begin: func(ctx context.Context) (Tx, error) {
				tx, err := driver.Begin(ctx)
				return &lostCommitTx{tx: tx, driver: driver, table: table, rollBack: tt.rollBack}, err
			}}
			o := bundle.inFlight(t, 1)[0]
			a := Attempt{Tool: tool, Request: Request{Key: o.Key, Tool: "refund", Attempt: 1}, Scope: o.Scope}

			out := bundle.runner.Run(t.Context(), a, nil)
			written, err := bundle.runner.Record(t.Context(), []Outcome{out})
			require.NoError(t, err)
			row := bundle.get(t, o.Key)
			require.Equal(t, string(tt.want), row.State)
			require.Equal(t, tt.effects, pgoncetest.CountEffects(t, table, o.Key))
			require.True(t, written[o.Key], "the outcome is known, and recorded")
			if tt.rollBack {
				require.Equal(t, Retry, out.Kind)
				require.False(t, out.Ambiguous, "a COMMIT read back as not taken is not uncertain")
				require.Nil(t, row.LeaseUntil, "the key is due again")
				return
			}
			require.Equal(t, TxCommitted, out.TxEnd)
			require.JSONEq(t, `{"credited":true}`, string(row.Response))
		})
	}
}
