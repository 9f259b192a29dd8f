package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/store"
)

// TxProvider performs the effect of a [Transactional] tool: writes to the
// key's own database, made in tx. tx is a transaction of the client's type
// (*sql.Tx for a [New] client, pgx.Tx for a [NewPgx] one) that pgonce opens
// for the attempt, after the attempt's claim committed; once CallTx
// returns, pgonce records the response in tx, fenced by the attempt, and
// commits. The effect and the outcome commit together or not at all: an
// attempt whose lease was taken over, an error, a panic or a call longer
// than [Config.CallTimeout] rolls tx back, effect included. A retry is
// therefore always safe, and the provider needs no idempotency of its own.
//
// CallTx must not commit or roll tx back, nor keep it after it returns (the
// attempt then fails with [ErrTxClosed] and its key goes to review, its
// effect perhaps committed without its outcome), and it must not call the
// network while it holds tx: a transactional tool's effect is in this
// database, and a call to another service belongs in another tool. Its
// statements should use ctx, whose deadline is [Config.CallTimeout].
//
// Return [Permanent] for a failure that must not be retried: tx is rolled
// back and the failure stored, as any tool's. Any other error rolls tx
// back and the key is tried again; none is ever uncertain.
type TxProvider[TTx any] interface {
	CallTx(ctx context.Context, tx TTx, req Request) (json.RawMessage, error)
}

// TxProviderFunc adapts a function to [TxProvider]. It is a [Provider] as
// well, so that it can be registered with [Registry.Register] as a
// [Transactional] tool and passed to [Client.Do]:
//
//	err := registry.Register("credit_wallet", outbox.TxProviderFunc[pgx.Tx](
//		func(ctx context.Context, tx pgx.Tx, req outbox.Request) (json.RawMessage, error) {
//			_, err := tx.Exec(ctx, "UPDATE wallet SET balance = balance + 10 WHERE id = 1")
//			return json.RawMessage(`{"credited":10}`), err
//		}), outbox.Transactional)
type TxProviderFunc[TTx any] func(ctx context.Context, tx TTx, req Request) (json.RawMessage, error)

// CallTx calls f.
func (f TxProviderFunc[TTx]) CallTx(ctx context.Context, tx TTx, req Request) (json.RawMessage, error) {
	return f(ctx, tx, req)
}

// Call returns an error matching [ErrTxRequired]: a transactional provider
// runs only in the transaction that pgonce opens for it.
func (f TxProviderFunc[TTx]) Call(context.Context, Request) (json.RawMessage, error) {
	return nil, errTxRequired[TTx]()
}

func (f TxProviderFunc[TTx]) txType() reflect.Type { return reflect.TypeFor[TTx]() }

// RegisterTx adds a [Transactional] tool to r with its provider p and
// settings (nil for none), as [Registry.RegisterWithOpts] does. TTx is the
// transaction type of the clients that run the tool: *sql.Tx for [New]
// clients, pgx.Tx for [NewPgx] ones. A client of another transaction type
// refuses the tool: [New] and [NewPgx] return an error matching
// [ErrInvalidConfig] for one already registered, and [Client.Do] one
// matching [ErrTxType] for one registered since, without running anything.
//
//	err := outbox.RegisterTx(registry, "reserve_stock", outbox.TxProviderFunc[*sql.Tx](reserve), nil)
func RegisterTx[TTx any](r *Registry, tool string, p TxProvider[TTx], opts *ToolOpts) error {
	if p == nil {
		return fmt.Errorf("%w: tool %q: provider must not be nil", ErrInvalidRegistration, tool)
	}
	if f, ok := p.(TxProviderFunc[TTx]); ok {
		return r.RegisterWithOpts(tool, f, Transactional, opts)
	}
	return r.RegisterWithOpts(tool, txProvider[TTx]{p}, Transactional, opts)
}

// txProvider makes a TxProvider registrable as a Provider.
type txProvider[TTx any] struct{ TxProvider[TTx] }

func (p txProvider[TTx]) Call(context.Context, Request) (json.RawMessage, error) {
	return nil, errTxRequired[TTx]()
}

func (p txProvider[TTx]) txType() reflect.Type { return reflect.TypeFor[TTx]() }

// txTyped is implemented by the providers of transactional tools: it names
// the transaction type they take.
type txTyped interface{ txType() reflect.Type }

func errTxRequired[TTx any]() error {
	return fmt.Errorf("%w: the provider takes a %s", ErrTxRequired, reflect.TypeFor[TTx]())
}

// checkTxType returns an error matching [ErrTxType] when p, a
// transactional tool's provider, does not take the client's transaction
// type.
func checkTxType[TTx any](tool string, p Provider) error {
	if _, ok := p.(TxProvider[TTx]); ok {
		return nil
	}
	got := "no transaction"
	if typed, ok := p.(txTyped); ok {
		got = "a " + typed.txType().String()
	}
	return fmt.Errorf("%w: tool %q: its provider takes %s, and the client's transaction is a %s",
		ErrTxType, tool, got, reflect.TypeFor[TTx]())
}

// beginFunc returns how an attempt of the transactional tool named tool,
// whose provider is p, opens its transaction on c.
func (c *Client[TTx]) beginFunc(tool string, p Provider) func(ctx context.Context) (attempt.Tx, error) {
	txp, ok := p.(TxProvider[TTx])
	return func(ctx context.Context) (attempt.Tx, error) {
		if !ok {
			return nil, checkTxType[TTx](tool, p)
		}
		tx, err := c.driver.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return &attemptTx[TTx]{driver: c.driver, tx: tx, provider: txp}, nil
	}
}

// attemptTx is the transaction of one attempt of a transactional tool.
type attemptTx[TTx any] struct {
	driver   store.Driver[TTx]
	tx       TTx
	provider TxProvider[TTx]
}

func (t *attemptTx[TTx]) Call(ctx context.Context, req attempt.Request) (json.RawMessage, error) {
	return t.provider.CallTx(ctx, t.tx, providerRequest(req))
}

func (t *attemptTx[TTx]) Executor() store.Executor { return t.driver.UnwrapExecutor(t.tx) }

func (t *attemptTx[TTx]) Commit(ctx context.Context) error { return t.driver.Commit(ctx, t.tx) }

func (t *attemptTx[TTx]) Rollback(ctx context.Context) error {
	return t.driver.Rollback(ctx, t.tx)
}

// checkRegistryTx returns an error matching [ErrInvalidConfig] when a
// transactional tool of registry takes another transaction type than TTx.
func checkRegistryTx[TTx any](registry *Registry) error {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	var errs []error
	for name, tool := range registry.tools {
		if tool.Delivery == Transactional {
			if err := checkTxType[TTx](name, tool.Provider); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}
