package pgoncemcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/outbox"
)

func TestGuard(t *testing.T) {
	t.Parallel()

	t.Run("RunsOnceAndReplaysTheStoredResultVerbatim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		first, err := cs.CallTool(t.Context(), refundParams(`{"order": 8842, "amount": "42.00"}`))
		require.NoError(t, err)
		require.False(t, first.IsError, text(t, first))
		// Asked again: the members in another order, the number spelled
		// otherwise.
		again, err := cs.CallTool(t.Context(), refundParams(`{"amount":"42.00","order":8.842e3}`))
		require.NoError(t, err)
		results := s.wire.results(t, 2)
		requireReplayOf(t, results[0], results[1])
		require.JSONEq(t, `{"refund_id":"re_1","order":8842,"amount":"42.00"}`, string(mustJSON(t, again.StructuredContent)))
		require.Equal(t, text(t, first), text(t, again))
		mark, ok := pgoncemcp.ActionMarkOf(again)
		require.True(t, ok)
		require.True(t, mark.Replayed)
		key, err := outbox.DeriveKey(outbox.Call{RunID: "run-1", Step: 3, Tool: "refund", Args: json.RawMessage(`{"order":8842,"amount":"42.00"}`)})
		require.NoError(t, err)
		require.Equal(t, key, mark.Key)
		require.Equal(t, 1, s.actedOn())
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("ADuplicateWhileTheFirstRunsIsInProgress", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		s.hold = func(ctx context.Context) error {
			once.Do(func() { close(started) })
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		cs := connect(t, s)
		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			res, _ := cs.CallTool(context.WithoutCancel(t.Context()), refundParams(`{"order":8842,"amount":"42.00"}`))
			done <- res
		}()
		<-started
		dup, err := cs.CallTool(t.Context(), refundParams(`{"order":8842,"amount":"42.00"}`))
		require.NoError(t, err)
		require.True(t, dup.IsError)
		require.Regexp(t, `^in progress, retry after \d+(\.\d+)?m?s: \{"status":"in_progress",`, text(t, dup))
		obs, ok := pgoncemcp.ObservationOf(dup)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationInProgress, obs.Status)
		dupMark, ok := pgoncemcp.ActionMarkOf(dup)
		require.True(t, ok)
		require.Equal(t, pgoncemcp.ActionMark{Key: obs.Key, InProgress: true}, dupMark)
		close(release)
		first := <-done
		require.NotNil(t, first)
		require.False(t, first.IsError, text(t, first))
		_, ok = pgoncemcp.ObservationOf(first)
		require.False(t, ok, "the tool's own result")
		firstMark, ok := pgoncemcp.ActionMarkOf(first)
		require.True(t, ok)
		require.Equal(t, pgoncemcp.ActionMark{Key: obs.Key}, firstMark)
		require.Equal(t, 1, s.actedOn())
	})

	t.Run("ACallThatNamesNoActionIsRefusedByDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		_, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}})
		var wire *jsonrpc.Error
		require.ErrorAs(t, err, &wire)
		require.Equal(t, int64(jsonrpc.CodeInvalidParams), wire.Code)
		for _, name := range []string{pgoncemcp.MetaKey, pgoncemcp.MetaRunID, pgoncemcp.MetaStep, `"refund"`} {
			require.Contains(t, wire.Message, name)
		}
		require.Equal(t, int64(0), s.refunds.Load())

		passing := newServer(t, b.ledger, newClient(t, b.schema, outbox.Config{}),
			pgoncemcp.ServerConfig{Anonymous: pgoncemcp.PassThrough}, outbox.IdempotentByKey)
		passing.hold = func(context.Context) error { return errors.New("ran without pgonce") }
		res, err := connect(t, passing).CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842}})
		require.NoError(t, err)
		require.Equal(t, "ran without pgonce", text(t, res))
	})

	t.Run("EveryBadMetaIsAnInvalidParamsErrorAndRunsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		tooLong := strings.Repeat("k", outbox.CallStringMaxBytes+1)
		for _, tt := range []struct {
			name  string
			meta  mcp.Meta
			field string
		}{
			{"StepNotANumber", mcp.Meta{pgoncemcp.MetaRunID: "run-1", pgoncemcp.MetaStep: "three"}, pgoncemcp.MetaStep},
			{"NegativeStep", mcp.Meta{pgoncemcp.MetaRunID: "run-1", pgoncemcp.MetaStep: -1}, pgoncemcp.MetaStep},
			{"FractionalStep", mcp.Meta{pgoncemcp.MetaRunID: "run-1", pgoncemcp.MetaStep: 1.5}, pgoncemcp.MetaStep},
			{"StepPast2To53", mcp.Meta{pgoncemcp.MetaRunID: "run-1", pgoncemcp.MetaStep: 1 << 60}, pgoncemcp.MetaStep},
			{"StepWithoutRun", mcp.Meta{pgoncemcp.MetaStep: 3}, pgoncemcp.MetaRunID},
			{"RunWithoutStep", mcp.Meta{pgoncemcp.MetaRunID: "run-1"}, pgoncemcp.MetaStep},
			{"EmptyRun", mcp.Meta{pgoncemcp.MetaRunID: "", pgoncemcp.MetaStep: 3}, pgoncemcp.MetaRunID},
			{"RunOver512Bytes", mcp.Meta{pgoncemcp.MetaRunID: tooLong, pgoncemcp.MetaStep: 3}, pgoncemcp.MetaRunID},
			{"NULInRun", mcp.Meta{pgoncemcp.MetaRunID: "run\x001", pgoncemcp.MetaStep: 3}, pgoncemcp.MetaRunID},
			{"KeyNotAString", mcp.Meta{pgoncemcp.MetaKey: 42}, pgoncemcp.MetaKey},
			{"EmptyKey", mcp.Meta{pgoncemcp.MetaKey: ""}, pgoncemcp.MetaKey},
			{"KeyOver512Bytes", mcp.Meta{pgoncemcp.MetaKey: tooLong}, pgoncemcp.MetaKey},
			{"NULInKey", mcp.Meta{pgoncemcp.MetaKey: "refund\x00order-8842"}, pgoncemcp.MetaKey},
		} {
			_, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}, Meta: tt.meta})
			var wire *jsonrpc.Error
			require.ErrorAs(t, err, &wire, tt.name)
			require.Equal(t, int64(jsonrpc.CodeInvalidParams), wire.Code, tt.name)
			require.Contains(t, wire.Message, tt.field, tt.name)
		}
		require.Equal(t, int64(0), s.refunds.Load())
		require.Equal(t, 0, b.ledger.refunds(t))
	})

	t.Run("AKeyWinsOverARunAndStepWhichAreThenIgnored", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		for _, meta := range []mcp.Meta{
			{pgoncemcp.MetaKey: "refund-order-8842", pgoncemcp.MetaRunID: "run-1", pgoncemcp.MetaStep: 1},
			{pgoncemcp.MetaKey: "refund-order-8842", pgoncemcp.MetaRunID: "run-2", pgoncemcp.MetaStep: 7},
			{pgoncemcp.MetaKey: "refund-order-8842", pgoncemcp.MetaRunID: 42, pgoncemcp.MetaStep: "three"},
		} {
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}, Meta: meta})
			require.NoError(t, err, "%v", meta)
			require.False(t, res.IsError, text(t, res))
		}
		// Run-1's step 1 is free: the first call's action was the key's.
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8843, "amount": "7.50"}, Meta: pgoncemcp.StepMeta("run-1", 1)})
		require.NoError(t, err)
		require.False(t, res.IsError, text(t, res))
		require.Equal(t, 2, b.ledger.refunds(t))
	})

	t.Run("AReadOnlyToolPassesThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		for range 2 {
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"order": 8842}})
			require.NoError(t, err)
			require.Equal(t, "order 8842: paid", text(t, res))
		}
		require.Equal(t, int64(2), s.lookups.Load())
		require.Nil(t, b.client.Config().Registry.Lookup("lookup"))
	})

	t.Run("ConflictAndInvalidArgumentsRunNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		_, err := cs.CallTool(t.Context(), refundParams(`{"order":8842,"amount":"42.00"}`))
		require.NoError(t, err)
		for args, status := range map[string]outbox.ObservationStatus{
			`{"order":8842,"amount":"4200.00"}`: outbox.ObservationConflict,
			`{"order":8842,"order":8843}`:       outbox.ObservationInvalidArguments,
			`{"order":8842,"note":"\ud800"}`:    outbox.ObservationInvalidArguments,
			`[8842]`:                            outbox.ObservationInvalidArguments,
		} {
			res, err := cs.CallTool(t.Context(), refundParams(args))
			require.NoError(t, err, args)
			require.True(t, res.IsError, args)
			obs, ok := pgoncemcp.ObservationOf(res)
			require.True(t, ok, args)
			require.Equal(t, status, obs.Status, "%s: %s", args, text(t, res))
		}
		require.Equal(t, 1, s.actedOn())
	})

	t.Run("AToolErrorIsItsAnswerStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		s.fail = errors.New("order 8842 was never paid")
		cs := connect(t, s)
		for range 2 {
			res, err := cs.CallTool(t.Context(), refundParams(`{"order":8842,"amount":"42.00"}`))
			require.NoError(t, err)
			require.True(t, res.IsError)
			require.Equal(t, "order 8842 was never paid", text(t, res))
		}
		results := s.wire.results(t, 2)
		requireReplayOf(t, results[0], results[1])
		require.Equal(t, 1, s.actedOn())
		res, err := b.client.Get(t.Context(), keyOf(t, "run-1", 3, `{"order":8842,"amount":"42.00"}`))
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State, "an operator can retry it")

		// A handler error that says nothing happened is not final.
		s.fail = outbox.RetryAfter(errors.New("the payments API is down"), time.Millisecond)
		res2, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 1}, Meta: pgoncemcp.StepMeta("run-1", 4)})
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res2)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationInProgress, obs.Status, text(t, res2))
		s.fail = nil
		res2, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 1}, Meta: pgoncemcp.StepMeta("run-1", 4)})
		require.NoError(t, err)
		require.False(t, res2.IsError, text(t, res2))
	})

	t.Run("AKeyNamesTheActionAcrossRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		for _, run := range []string{"run-1", "run-2"} {
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{
				Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"},
				Meta: mcp.Meta{pgoncemcp.MetaKey: "refund-order-8842", pgoncemcp.MetaRunID: run, pgoncemcp.MetaStep: 1},
			})
			require.NoError(t, err)
			require.False(t, res.IsError, text(t, res))
		}
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("TenantsNeverShareActions", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var tenant string
		var mu sync.Mutex
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{TenantFunc: func(context.Context, *mcp.CallToolRequest) string {
			mu.Lock()
			defer mu.Unlock()
			return tenant
		}}, outbox.IdempotentByKey)
		cs := connect(t, s)
		for _, who := range []string{"acme", "globex", "acme"} {
			mu.Lock()
			tenant = who
			mu.Unlock()
			_, err := cs.CallTool(t.Context(), refundParams(`{"order":8842,"amount":"42.00"}`))
			require.NoError(t, err)
		}
		require.Equal(t, 2, b.ledger.refunds(t))
	})

	t.Run("CrashAfterTheToolActedThenRestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Its tool refunds whatever the call's deadline, before it hangs.
		detached := &ledger{pool: b.ledger.pool, table: b.ledger.table, detached: true}
		crashed := newServer(t, detached, crashedClient(t, b.schema), pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		crashedSession := connect(t, crashed)
		hook, acted := dies(t) // its cleanup runs before the session's
		crashed.after = hook
		go func() {
			_, _ = crashedSession.CallTool(context.WithoutCancel(t.Context()), refundParams(`{"order":8842,"amount":"42.00"}`))
		}()
		<-acted
		require.Equal(t, 1, b.ledger.refunds(t))

		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		cs := connect(t, s)
		res, err := cs.CallTool(t.Context(), refundParams(`{"amount":"42.00","order":8842}`))
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationInProgress, obs.Status, "before the lease expires")

		reconcileUntilResolved(t, b.client)
		for range 2 {
			res, err = cs.CallTool(t.Context(), refundParams(`{"amount":"42.00","order":8842}`))
			require.NoError(t, err)
			require.False(t, res.IsError, text(t, res))
			require.JSONEq(t, `{"refund_id":"re_1","order":8842,"amount":"42.00"}`, string(mustJSON(t, res.StructuredContent)))
		}
		require.Equal(t, 1, b.ledger.refunds(t), "one refund, whatever the crash")
		require.Equal(t, 1, s.actedOn(), "the new server acted once, on the same key")
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
