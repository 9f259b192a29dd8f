package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// submitErrors are the documented errors a submit of any Call may return
// on a healthy database.
var submitErrors = []error{
	outbox.ErrInvalidCall,
	outbox.ErrNotCanonical,
	outbox.ErrUnknownTool,
	outbox.ErrKeyConflict,
	outbox.ErrExpired,
}

// FuzzSubmit submits fuzzed calls to a real database. Whatever the input:
// no panic; every error is one of the documented sentinels; a submit that
// succeeds derives the key DeriveKey derives; and the same arguments spelled
// otherwise (their canonical form, an indented form, the Go value they
// decode to) find the same key, Created false, never a second one.
func FuzzSubmit(f *testing.F) {
	for _, seed := range []struct {
		tenant, runID string
		step          int64
		tool, key, id string
		args          string
	}{
		{"", "run-1", 3, "refund", "", "", `{"order": 8842, "amount": 42.00}`},
		{"acme", "run-1", 0, "refund", "order-8842", "", `{"amount":"42.00","currency":"EUR"}`},
		{"", "run-2", 1, "provision", "", "vm-42", `{"size":"m","tags":["a","b"]}`},
		{"t", "r", 9007199254740992, "refund", "", "", `[1e21,1e-7,-0,0.1,4.2e1]`},
		{"", "r", 1, "refund", "", "", `{"b":1,"a":{"d":[true,false,null],"c":"\u00e9\ud83d\ude02"}}`},
		{"", "r", 1, "refund", "", "", `9007199254740993`},
		{"", "r", 1, "refund", "", "", `{"a":1,"a":2}`},
		{"", "r", -1, "refund", "", "", `null`},
		{"a\x00", "r", 1, "refund", "", "", `1`},
		{"", "r\xff", 1, "refund", "", "", `1`},
		{"", "r", 1, "Refund", "", "", `1`},
		{"", "r", 1, "charge", "", "", `1`},
		{"", "r", 1, "refund", "", "", "\"\xff\""},
	} {
		f.Add(seed.tenant, seed.runID, seed.step, seed.tool, seed.key, seed.id, []byte(seed.args))
	}

	schema := pgoncetest.Schema(f)
	registry := outbox.NewRegistry()
	provider := &countingProvider{}
	for _, tool := range []string{"refund", "provision"} {
		require.NoError(f, registry.Register(tool, provider, outbox.IdempotentByKey))
	}
	client, err := outbox.NewPgx(pgoncetest.Pool(f), outbox.Config{Schema: schema, Registry: registry, NotifyDisabled: true})
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, tenant, runID string, step int64, tool, key, naturalID string, args []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		call := outbox.Call{Tenant: tenant, RunID: runID, Step: step, Tool: tool, Key: key, NaturalID: naturalID, Args: json.RawMessage(args)}

		res, err := client.Submit(ctx, call)
		if err != nil {
			requireOneOf(t, err, submitErrors)
			if errors.Is(err, outbox.ErrInvalidCall) || errors.Is(err, outbox.ErrNotCanonical) {
				_, deriveErr := outbox.DeriveKey(call)
				require.Error(t, deriveErr, "Submit refused a call DeriveKey accepts: %v", err)
			}
			return
		}
		want, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		require.Equal(t, want, res.Key)

		canonical, err := outbox.Canonicalize(json.RawMessage(args))
		require.NoError(t, err)
		var indented bytes.Buffer
		require.NoError(t, json.Indent(&indented, args, "", "  "))
		var decoded any
		require.NoError(t, json.Unmarshal(args, &decoded))
		for _, respelled := range []any{json.RawMessage(canonical), json.RawMessage(indented.Bytes()), decoded} {
			again := call
			again.Args = respelled
			got, err := client.Submit(ctx, again)
			require.NoError(t, err, "respelled %q as %v", args, respelled)
			require.Equal(t, res.Key, got.Key, "two keys for one canonical value %q", canonical)
			require.False(t, got.Created, "respelled %q created a second key", args)
		}
	})
}

// requireOneOf fails t unless err matches one of sentinels.
func requireOneOf(t *testing.T, err error, sentinels []error) {
	t.Helper()
	for _, sentinel := range sentinels {
		if errors.Is(err, sentinel) {
			return
		}
	}
	require.Failf(t, "undocumented error", "%v (%T)", err, err)
}
