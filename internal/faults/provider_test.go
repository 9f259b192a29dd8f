package faults_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestProviderFaults runs providers that misbehave: they act and then time
// out or panic, answer with invalid or huge bodies, or fail with error text
// that PostgreSQL cannot store as text.
func TestProviderFaults(t *testing.T) {
	t.Parallel()
	calls := faults.Scale(15, 90)

	// first misbehaves on the attempts before until, for every tool.
	first := func(mode faults.Mode, until int) func(outbox.Request) faults.Mode {
		return func(req outbox.Request) faults.Mode {
			if req.Attempt < until {
				return mode
			}
			return faults.ModeReturn
		}
	}
	// always misbehaves on every attempt.
	always := func(mode faults.Mode) func(outbox.Request) faults.Mode {
		return func(outbox.Request) faults.Mode { return mode }
	}

	for _, tt := range []struct {
		name    string
		mode    func(req outbox.Request) faults.Mode
		calls   int
		mayFail string        // a tool whose calls may end failed
		grace   time.Duration // the reconciler's, when not the default
		// callTimeout and lease replace the campaign's when set.
		callTimeout, lease time.Duration
	}{
		{name: "ActThenTimeout", mode: first(faults.ModeActThenTimeout, 2)},
		{name: "ActThenPanic", mode: first(faults.ModeActThenPanic, 2)},
		{name: "InvalidBody", mode: always(faults.ModeInvalidBody)},
		{name: "InvalidUTF8Body", mode: always(faults.ModeInvalidUTF8Body)},
		// Recording a few megabytes takes a dispatcher seconds under the
		// race detector; a grace that short would take over live attempts.
		// Writing a huge effect to the ledger takes the provider seconds
		// too on a busy machine: past the campaign's call timeout (1s)
		// every attempt of a keyed call timed out, until it failed.
		{
			name: "HugeBody", mode: always(faults.ModeHugeBody), calls: 6, grace: 10 * time.Second,
			callTimeout: 30 * time.Second, lease: 35 * time.Second,
		},
		{name: "FailTransient", mode: first(faults.ModeFailTransient, 3)},
		{
			// Keyed calls fail on every attempt with text PostgreSQL cannot
			// store, until they give up; the other tools' outcomes are
			// recorded beside them, in the same batches.
			name: "FailBadText", mayFail: faults.ToolKeyed,
			mode: func(req outbox.Request) faults.Mode {
				if req.Tool == faults.ToolKeyed {
					return faults.ModeFailBadText
				}
				return faults.ModeReturn
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &bundleOpts{grace: tt.grace, callTimeout: tt.callTimeout, lease: tt.lease, mode: func(req outbox.Request) faults.Mode {
				mode := tt.mode(req)
				if mode != faults.ModeReturn {
					tally.Fault("provider_" + mode.String())
				}
				return mode
			}})
			n := calls
			if tt.calls > 0 {
				n = tt.calls
			}
			for range n {
				key, _ := b.load.SubmitOne(t.Context())
				if tt.mayFail != "" {
					for _, e := range b.history.Entries() {
						if e.Key == key && e.Call.Tool == tt.mayFail {
							b.history.AllowFailure(key)
						}
					}
				}
			}
			b.finish(t, faults.CheckOpts{})
		})
	}
}

// TestBadInput submits calls that PostgreSQL cannot store (NUL bytes in
// strings) and a nil transaction: each must be refused with an error of the
// library's own, write nothing, and panic nowhere.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	good := outbox.Call{RunID: "bad-input", Step: 1, Tool: faults.ToolKeyed, NaturalID: "n-1", Args: map[string]any{"a": 1}}

	requireRefused := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		var pgErr *pgconn.PgError
		require.NotErrorAs(t, err, &pgErr, "a driver error leaked")
		var rows int
		require.NoError(t, b.direct.QueryRow(t.Context(),
			`SELECT count(*) FROM `+ident.Quote(b.schema)+`.pgonce_key`).Scan(&rows))
		require.Zero(t, rows, "nothing is written")
		tally.Fault("bad_input")
	}

	for _, tt := range []struct {
		name string
		edit func(c *outbox.Call)
	}{
		{name: "NULInRunID", edit: func(c *outbox.Call) { c.RunID = "run\x00id" }},
		{name: "NULInTenant", edit: func(c *outbox.Call) { c.Tenant = "ten\x00ant" }},
		{name: "NULInKey", edit: func(c *outbox.Call) { c.Key = "refund:\x00" }},
		{name: "NULInNaturalID", edit: func(c *outbox.Call) { c.NaturalID = "nat\x00" }},
		{name: "InvalidUTF8InNaturalID", edit: func(c *outbox.Call) { c.NaturalID = "nat\xff\xfe" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			call := good
			tt.edit(&call)
			_, err := b.client.Submit(t.Context(), call)
			requireRefused(t, err)
			_, err = b.client.Do(t.Context(), call, nil)
			requireRefused(t, err)
		})
	}

	t.Run("NilPgxTx", func(t *testing.T) {
		var err error
		require.NotPanics(t, func() { _, err = b.client.SubmitTx(t.Context(), pgx.Tx(nil), good) })
		requireRefused(t, err)
	})

	t.Run("NilSQLTx", func(t *testing.T) {
		registry, err := b.ledger.Registry(nil)
		require.NoError(t, err)
		client, err := outbox.New(pgoncetest.DB(t), clientConfig(b.schema, registry))
		require.NoError(t, err)
		require.NotPanics(t, func() { _, err = client.SubmitTx(context.Background(), (*sql.Tx)(nil), good) })
		requireRefused(t, err)
	})
}
