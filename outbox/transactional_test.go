package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// effectTable creates, in schema, the table a transactional test tool
// writes its effect to, and returns its quoted name and a function that
// counts the effect rows of a key.
func effectTable(t *testing.T, schema string) (table string, count func(key outbox.Key) int) {
	t.Helper()
	table = ident.Quote(schema) + ".effect"
	_, err := pgoncetest.DB(t).ExecContext(t.Context(), "CREATE TABLE "+table+" (key text NOT NULL, attempt integer NOT NULL)")
	require.NoError(t, err)
	return table, func(key outbox.Key) int {
		t.Helper()
		var n int
		require.NoError(t, pgoncetest.DB(t).QueryRowContext(context.WithoutCancel(t.Context()),
			"SELECT count(*) FROM "+table+" WHERE key = $1", string(key)).Scan(&n))
		return n
	}
}

// insertEffect is the statement a test tool runs for req's effect.
func insertEffect(table string, req outbox.Request) string {
	return fmt.Sprintf("INSERT INTO %s (key, attempt) VALUES ('%s', %d)", table, req.Key, req.Attempt)
}

func TestTransactional(t *testing.T) {
	t.Parallel()
	eachHarness(t, testTransactional[pgx.Tx], testTransactional[*sql.Tx])
}

func testTransactional[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client *outbox.Client[TTx]
		schema string
		table  string
		count  func(key outbox.Key) int
		calls  *atomic.Int64
		call   outbox.Call
	}

	// setup registers "credit" as a transactional tool whose provider is
	// body, run in the attempt's transaction after its effect row is
	// written; nil body answers {"credited":true}.
	setup := func(t *testing.T, config outbox.Config, body func(ctx context.Context, tx TTx, req outbox.Request) (json.RawMessage, error)) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		table, count := effectTable(t, schema)
		calls := &atomic.Int64{}
		provider := outbox.TxProviderFunc[TTx](func(ctx context.Context, tx TTx, req outbox.Request) (json.RawMessage, error) {
			calls.Add(1)
			if err := h.exec(tx, insertEffect(table, req)); err != nil {
				return nil, err
			}
			if body == nil {
				return json.RawMessage(`{"credited":true}`), nil
			}
			return body(ctx, tx, req)
		})
		registry := outbox.NewRegistry()
		require.NoError(t, outbox.RegisterTx(registry, "credit", provider, nil))
		config.Schema, config.Registry, config.NotifyDisabled = schema, registry, true
		call := refundCall("run-tx")
		call.Tool = "credit"
		return &testBundle{client: h.newClient(t, config), schema: schema, table: table, count: count, calls: calls, call: call}
	}

	t.Run("DoCommitsEffectAndOutcomeTogether", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, outbox.Config{}, nil)

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.JSONEq(t, `{"credited":true}`, string(res.Response))
		require.Equal(t, 1, bundle.count(res.Key))

		again, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.NoError(t, err)
		require.True(t, again.Replayed())
		require.Equal(t, res.Response, again.Response)
		require.Equal(t, 1, bundle.count(res.Key))
		require.Equal(t, int64(1), bundle.calls.Load())
	})

	t.Run("ProviderErrorRollsTheEffectBack", func(t *testing.T) {
		t.Parallel()
		var fail atomic.Bool
		fail.Store(true)
		bundle := setup(t, outbox.Config{}, func(context.Context, TTx, outbox.Request) (json.RawMessage, error) {
			if fail.Load() {
				return nil, errors.New("wallet service says no")
			}
			return json.RawMessage(`{"credited":true}`), nil
		})

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.Equal(t, outbox.StatePending, res.State)
		require.Equal(t, 0, bundle.count(res.Key))

		fail.Store(false)
		res, err = bundle.client.Do(t.Context(), bundle.call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, 1, bundle.count(res.Key))
	})

	t.Run("PermanentFailureRollsBackAndIsStored", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, outbox.Config{}, func(context.Context, TTx, outbox.Request) (json.RawMessage, error) {
			return nil, outbox.PermanentBody(json.RawMessage(`{"code":"closed"}`), errors.New("wallet closed"))
		})

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State)
		require.JSONEq(t, `{"code":"closed"}`, string(res.Failure))
		require.Equal(t, 0, bundle.count(res.Key))
	})

	t.Run("CrashAfterTheEffectNeverWritesTwice", func(t *testing.T) {
		t.Parallel()
		// The provider writes its effect and then dies (a panic, as a
		// crash between the effect and the record): the effect rolls
		// back, and the next attempt writes it once.
		var crashed atomic.Bool
		bundle := setup(t, outbox.Config{}, func(context.Context, TTx, outbox.Request) (json.RawMessage, error) {
			if crashed.CompareAndSwap(false, true) {
				panic("process died after the effect")
			}
			return json.RawMessage(`{"credited":true}`), nil
		})

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.Equal(t, outbox.StatePending, res.State, "a transactional attempt is never uncertain")
		require.Equal(t, 0, bundle.count(res.Key))

		res, err = bundle.client.Do(t.Context(), bundle.call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, 1, bundle.count(res.Key))
		require.Equal(t, int64(2), bundle.calls.Load())
	})

	t.Run("LostLeaseRollsTheEffectBack", func(t *testing.T) {
		t.Parallel()
		// While the provider runs, the key is taken over (as the
		// reconciler does after the lease): the outcome is fenced out, and
		// the effect goes with it.
		var bundle *testBundle
		bundle = setup(t, outbox.Config{}, func(ctx context.Context, _ TTx, req outbox.Request) (json.RawMessage, error) {
			_, err := pgoncetest.DB(t).ExecContext(ctx, "UPDATE "+ident.Quote(bundle.schema)+
				".pgonce_key SET attempt = attempt + 1, worker = 'reconciler' WHERE lease_until IS NOT NULL")
			require.NoError(t, err)
			return json.RawMessage(`{"credited":true}`), nil
		})

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateInFlight, res.State)
		require.Equal(t, 2, res.Attempts)
		require.Equal(t, 0, bundle.count(res.Key))
	})

	t.Run("ProviderThatCommitsItselfSendsTheKeyToReview", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, outbox.Config{}, func(_ context.Context, tx TTx, _ outbox.Request) (json.RawMessage, error) {
			return json.RawMessage(`{}`), h.commit(tx)
		})

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.ErrorIs(t, err, outbox.ErrTxClosed)
		require.Equal(t, outbox.StateNeedsReview, res.State)
		require.Contains(t, res.LastError, "committed or rolled back the transaction itself")
	})

	t.Run("ProviderHoldingTheTransactionPastTheCallTimeoutRollsBack", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, outbox.Config{CallTimeout: 100 * time.Millisecond, Lease: time.Minute},
			func(ctx context.Context, _ TTx, _ outbox.Request) (json.RawMessage, error) {
				<-ctx.Done()
				return json.RawMessage(`{}`), nil
			})

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.ErrorIs(t, err, outbox.ErrTxTimeout)
		require.Equal(t, outbox.StatePending, res.State)
		require.Equal(t, 0, bundle.count(res.Key))
	})

	t.Run("LockTimeoutIsTyped", func(t *testing.T) {
		t.Parallel()
		var table string
		bundle := setup(t, outbox.Config{}, func(_ context.Context, tx TTx, _ outbox.Request) (json.RawMessage, error) {
			if err := h.exec(tx, "SET LOCAL lock_timeout = '20ms'"); err != nil {
				return nil, err
			}
			return nil, h.exec(tx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
		})
		table = bundle.table
		// Another transaction holds the effect table.
		holder := h.begin(t, nil)
		require.NoError(t, h.exec(holder, "LOCK TABLE "+table+" IN ACCESS SHARE MODE"))

		res, err := bundle.client.Do(t.Context(), bundle.call, nil)
		require.ErrorIs(t, err, outbox.ErrTxTimeout)
		require.Equal(t, outbox.StatePending, res.State)
		require.NoError(t, h.rollback(holder))
		require.Equal(t, 0, bundle.count(res.Key))
	})

	t.Run("ProviderOfAnotherTransactionTypeRunsNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, outbox.Config{}, nil)
		// A provider for the other driver's transactions, registered after
		// the client was made.
		var other outbox.Provider = outbox.TxProviderFunc[*sql.Tx](func(context.Context, *sql.Tx, outbox.Request) (json.RawMessage, error) {
			return json.RawMessage(`{}`), nil
		})
		if _, ok := any(bundle.client).(*outbox.Client[*sql.Tx]); ok {
			other = outbox.TxProviderFunc[pgx.Tx](func(context.Context, pgx.Tx, outbox.Request) (json.RawMessage, error) {
				return json.RawMessage(`{}`), nil
			})
		}
		res, err := bundle.client.Do(t.Context(), bundle.call, other)
		require.ErrorIs(t, err, outbox.ErrTxType)
		require.Empty(t, res.Key)
		_, err = bundle.client.Get(t.Context(), mustKey(t, bundle.call))
		require.ErrorIs(t, err, outbox.ErrNotFound)
	})
}

func TestRegisterTransactional(t *testing.T) {
	t.Parallel()

	txFunc := outbox.TxProviderFunc[pgx.Tx](func(context.Context, pgx.Tx, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})
	plain := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) { return nil, nil })

	t.Run("TransactionalNeedsATxProvider", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		require.ErrorIs(t, registry.Register("credit", plain, outbox.Transactional), outbox.ErrInvalidRegistration)
		require.Nil(t, registry.Lookup("credit"))
	})

	t.Run("TxProviderNeedsTransactional", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		require.ErrorIs(t, registry.Register("credit", txFunc, outbox.IdempotentByKey), outbox.ErrInvalidRegistration)
		require.Nil(t, registry.Lookup("credit"))
	})

	t.Run("RegisterAndRegisterTxAgree", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("credit", txFunc, outbox.Transactional))
		require.NoError(t, outbox.RegisterTx[pgx.Tx](registry, "debit", txFunc, nil))
		require.Equal(t, outbox.Transactional, registry.Lookup("debit").Delivery)
		require.Equal(t, "transactional", registry.Lookup("credit").Delivery.String())
		_, err := registry.Lookup("credit").Provider.Call(t.Context(), outbox.Request{})
		require.ErrorIs(t, err, outbox.ErrTxRequired)
	})

	t.Run("ClientOfAnotherTransactionTypeRefusesTheRegistry", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("credit", txFunc, outbox.Transactional))
		_, err := outbox.New(pgoncetest.DB(t), outbox.Config{Schema: "pgonce", Registry: registry})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.ErrorIs(t, err, outbox.ErrTxType)
		_, err = outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: "pgonce", Registry: registry})
		require.NoError(t, err)
	})
}

// TestKeyedLocalWriteWritesTwice is the case a transactional tool exists
// for: the same local write registered IdempotentByKey, whose process dies
// after the effect and before the record, writes its row twice, where
// CrashAfterTheEffectNeverWritesTwice writes it once.
func TestKeyedLocalWriteWritesTwice(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	table, count := effectTable(t, schema)
	var crashed atomic.Bool
	provider := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		if _, err := pgoncetest.DB(t).ExecContext(ctx, insertEffect(table, req)); err != nil {
			return nil, err
		}
		if crashed.CompareAndSwap(false, true) {
			panic("process died after the effect")
		}
		return json.RawMessage(`{"credited":true}`), nil
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("credit", provider, outbox.IdempotentByKey))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry, NotifyDisabled: true})
	require.NoError(t, err)
	call := refundCall("run-keyed")
	call.Tool = "credit"

	_, err = client.Do(t.Context(), call, nil)
	require.ErrorIs(t, err, outbox.ErrProviderFailed)
	res, err := client.Do(t.Context(), call, nil)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, res.State)
	require.Equal(t, 2, count(res.Key), "a keyed tool whose effect is a local write is not deduplicated by its key")
}
