package idempotency_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

func TestRegister(t *testing.T) {
	t.Parallel()

	t.Run("RegistersAnInlineOnlyTool", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		require.NoError(t, idempotency.Register(registry, "refund_request", outbox.IdempotentByKey, &outbox.ToolOpts{KeyRetention: 24 * time.Hour}))
		tool := registry.Lookup("refund_request")
		require.NotNil(t, tool)
		require.True(t, tool.Opts.InlineOnly)
		require.Equal(t, outbox.IdempotentByKey, tool.Delivery)
		require.Equal(t, 24*time.Hour, tool.Opts.KeyRetention)
		_, err := tool.Provider.Call(t.Context(), outbox.Request{})
		var permanent *outbox.PermanentError
		require.ErrorAs(t, err, &permanent, "the placeholder provider never acts")
	})

	t.Run("RefusesOtherDeliveriesAndDuplicates", func(t *testing.T) {
		t.Parallel()
		registry := outbox.NewRegistry()
		err := idempotency.Register(registry, idempotency.ToolDefault, outbox.LookupByNaturalID, nil)
		require.ErrorIs(t, err, outbox.ErrInvalidRegistration)
		require.Nil(t, registry.Lookup(idempotency.ToolDefault), "nothing registered")
		require.ErrorIs(t, idempotency.Register(nil, idempotency.ToolDefault, outbox.AtMostOnce, nil), outbox.ErrInvalidRegistration)
		require.ErrorIs(t, idempotency.Register(registry, "no spaces", outbox.AtMostOnce, nil), outbox.ErrInvalidRegistration)

		require.NoError(t, idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil))
		require.ErrorIs(t, idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil), outbox.ErrInvalidRegistration)
	})
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testNewRefusesInvalidConfig, testNewRefusesInvalidConfig)
}

func testNewRefusesInvalidConfig[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	registry := outbox.NewRegistry()
	require.NoError(t, idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil))
	client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry})
	for name, config := range map[string]idempotency.Config{
		"UnknownMode":              {Mode: idempotency.Mode(7)},
		"KeyTooLong":               {MaxKeyLength: outbox.CallStringMaxBytes + 1},
		"NegativeWaitTimeout":      {WaitTimeout: -time.Second},
		"HeaderNotAName":           {Header: "Idempotency Key"},
		"KeepHeadersNotANameSpace": {KeepHeaders: []string{"Request-Id", "Request Id"}},
		"KeepHeadersNotANameColon": {KeepHeaders: []string{"Location:"}},
		"KeepHeadersEmptyName":     {KeepHeaders: []string{""}},
	} {
		for _, mode := range []idempotency.Mode{idempotency.ModeTx, idempotency.ModeLease} {
			if config.Mode == 0 {
				config.Mode = mode
			}
			_, err := wrapOver(t, client, config, http.NotFoundHandler())
			require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "%s in mode %d", name, mode)
		}
	}
}

func TestNewRefusesAToolNotRegistered(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testNewRefusesAToolNotRegistered, testNewRefusesAToolNotRegistered)
}

func testNewRefusesAToolNotRegistered[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	dispatched := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) { return nil, nil })
	for _, tt := range []struct {
		name     string
		register func(registry *outbox.Registry) error
	}{
		{name: "Missing", register: func(*outbox.Registry) error { return nil }},
		{name: "AnotherName", register: func(registry *outbox.Registry) error {
			return idempotency.Register(registry, "other_request", outbox.AtMostOnce, nil)
		}},
		{name: "RegisteredForDispatchers", register: func(registry *outbox.Registry) error {
			return registry.Register(idempotency.ToolDefault, dispatched, outbox.AtMostOnce)
		}},
		{name: "InlineOnlyByLookup", register: func(registry *outbox.Registry) error {
			return registry.RegisterWithOpts(idempotency.ToolDefault, struct {
				outbox.Provider
				outbox.Lookuper
			}{dispatched, nil}, outbox.LookupByNaturalID, &outbox.ToolOpts{InlineOnly: true})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			registry := outbox.NewRegistry()
			require.NoError(t, tt.register(registry))
			before := registry.Names()
			client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry})
			for _, mode := range []idempotency.Mode{idempotency.ModeTx, idempotency.ModeLease} {
				_, err := wrapOver(t, client, idempotency.Config{Mode: mode}, http.NotFoundHandler())
				require.ErrorIs(t, err, idempotency.ErrToolNotRegistered)
				require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
				require.ErrorContains(t, err, idempotency.ToolDefault)
			}
			require.ElementsMatch(t, before, registry.Names(), "the registry is left as it was")
		})
	}
}

// wrapOver is wrap with the test's pool or database, as ModeTx needs.
func wrapOver[TTx any](t *testing.T, client *outbox.Client[TTx], config idempotency.Config, handler http.Handler) (http.Handler, error) {
	t.Helper()
	switch c := any(client).(type) {
	case *outbox.Client[pgx.Tx]:
		m, err := idempotency.NewPgx(pgoncetest.Pool(t), c, config)
		if err != nil {
			return nil, err
		}
		return m.Handler(handler), nil
	case *outbox.Client[*sql.Tx]:
		m, err := idempotency.New(pgoncetest.DB(t), c, config)
		if err != nil {
			return nil, err
		}
		return m.Handler(handler), nil
	}
	return nil, fmt.Errorf("no driver for %T", client)
}
