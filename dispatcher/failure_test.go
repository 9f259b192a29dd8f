package dispatcher_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// declined is a provider's own failure body, with the spacing and member
// order a replay must keep.
const declined = "{ \"code\" : \"card_declined\",\n  \"decline_code\":\"insufficient_funds\" }"

// requireVerbatim asserts that got holds exactly the bytes of want: a
// replay keeps the provider's spacing and member order, which JSON
// equality would not check.
func requireVerbatim(t *testing.T, want string, got []byte, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, []byte(want), got, msgAndArgs...)
}

// lookupFunc adapts a function to outbox.Lookuper.
type lookupFunc func(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error)

func (f lookupFunc) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	return f(ctx, req)
}

func TestDispatcherFailureBodies(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testDispatcherFailureBodies[pgx.Tx], testDispatcherFailureBodies[*sql.Tx])
}

func testDispatcherFailureBodies[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	// requireReplayed asserts that a duplicate submit, and the observation,
	// return failure byte for byte.
	requireReplayed := func(t *testing.T, client *outbox.Client[TTx], c outbox.Call, failure string) {
		t.Helper()
		replay, err := client.Submit(t.Context(), c)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, replay.State)
		require.True(t, replay.Replayed())
		requireVerbatim(t, failure, replay.Failure)
		require.Equal(t,
			`{"status":"failed","key":"`+string(replay.Key)+`","replayed":true,"failure":`+failure+`}`,
			string(replay.Observation().JSON()))
	}

	t.Run("ProviderBodyIsStoredAndReplayedByteForByte", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			return false, outbox.PermanentBody(json.RawMessage(declined), errors.New("card declined"))
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		failed := awaitState(t, bundle.client, key, outbox.StateFailed)
		requireVerbatim(t, declined, failed.Failure)
		require.Equal(t, "permanent: card declined", failed.LastError)
		requireReplayed(t, bundle.client, call("refund", 1), declined)
		calls, _ := bundle.ledger.count(key)
		require.Equal(t, 1, calls, "a permanent failure is never called again")
	})

	t.Run("BodyThatIsNotJSONIsKeptVerbatim", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		const body = "declined \x00\xff"
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			return false, outbox.PermanentBody(json.RawMessage(body), nil)
		}
		d, err := dispatcher.New(bundle.client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, bundle.client, "refund", 1)
		failed := awaitState(t, bundle.client, key, outbox.StateFailed)
		requireVerbatim(t, body, failed.Failure)
		obs := failed.Observation().JSON()
		require.True(t, json.Valid(obs) && utf8.Valid(obs))
		require.True(t, bytes.HasSuffix(obs, []byte(`,"failure":"declined \u0000\ufffd"}`)), "observed as a JSON string: %s", obs)
	})

	t.Run("LookupFindsAFailureForGood", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		var lookups atomic.Int64
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("provision", lookupProvider{
			Provider: bundle.ledger,
			lookuper: lookupFunc(func(context.Context, outbox.Request) (json.RawMessage, bool, error) {
				lookups.Add(1)
				return nil, false, outbox.PermanentBody(json.RawMessage(declined), errors.New("charge found declined"))
			}),
		}, outbox.LookupByNaturalID))
		client := bundle.clientWith(t, registry)
		// The first attempt is uncertain; the next reads before it writes.
		bundle.ledger.actFunc = func(outbox.Request) (bool, error) {
			return true, outbox.Ambiguous(errors.New("timeout after send"))
		}
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, client, "provision", 1)
		failed := awaitState(t, client, key, outbox.StateFailed)
		requireVerbatim(t, declined, failed.Failure)
		require.Equal(t, "lookup: permanent: charge found declined", failed.LastError)
		require.Equal(t, int64(1), lookups.Load())
		calls, _ := bundle.ledger.count(key)
		require.Equal(t, 1, calls, "a failure found is never called again")
		requireReplayed(t, client, call("provision", 1), declined)
	})
}

func TestDispatcherLogsWhatAnOperatorMustActOn(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testDispatcherLogs[pgx.Tx], testDispatcherLogs[*sql.Tx])
}

func testDispatcherLogs[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	clientLogger, clientLogs := pgoncetest.CaptureLogs()
	client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: bundle.registry, Logger: clientLogger})
	keys := bundle.submitAll(t, client, []outbox.Call{call("refund", 1), call("refund", 2), call("email", 3), call("refund", 4), call("refund", 5)})
	gaveUp, permanent, review, succeeded, panicked := keys[0], keys[1], keys[2], keys[3], keys[4]
	bundle.ledger.actFunc = func(req outbox.Request) (bool, error) {
		switch req.Key {
		case panicked:
			if req.Attempt == 1 {
				panic("provider bug")
			}
		case gaveUp:
			return false, errors.New("503 from upstream")
		case permanent:
			return false, outbox.PermanentBody(json.RawMessage(declined), errors.New("card declined"))
		case review:
			return true, outbox.Ambiguous(errors.New("connection reset after send"))
		}
		return true, nil
	}
	logger, logs := pgoncetest.CaptureLogs()
	config := fastConfig()
	config.MaxAttempts, config.Logger = 2, logger
	d, err := dispatcher.New(client, config)
	require.NoError(t, err)
	start(t, d)

	warning := func(key outbox.Key) func(pgoncetest.LogRecord) bool {
		return func(r pgoncetest.LogRecord) bool { return r.Level == slog.LevelWarn && r.Attrs["key"] == string(key) }
	}
	for _, tt := range []struct {
		key                    outbox.Key
		tool, message, attempt string
		lastError              string
	}{
		{gaveUp, "refund", "pgonce: key gave up after its last attempt and failed", "2", "503 from upstream"},
		{permanent, "refund", "pgonce: key failed permanently", "1", "permanent: card declined"},
		{review, "email", "pgonce: key needs review; nothing runs until an operator resolves it", "1", "ambiguous: connection reset after send"},
	} {
		got := logs.Await(t, warning(tt.key))
		require.Equal(t, tt.message, got.Message)
		require.Equal(t, tt.tool, got.Attrs["tool"])
		require.Equal(t, tt.attempt, got.Attrs["attempt"])
		require.Equal(t, tt.lastError, got.Attrs["error"])
	}
	awaitState(t, client, succeeded, outbox.StateSucceeded)
	require.Equal(t, "true", logs.Matching(warning(gaveUp))[0].Attrs["gave_up"])

	// The retry before the give-up stays at debug.
	retries := logs.Matching(func(r pgoncetest.LogRecord) bool { return r.Attrs["key"] == string(gaveUp) && r.Level < slog.LevelWarn })
	require.Len(t, retries, 1)
	require.Equal(t, slog.LevelDebug, retries[0].Level)
	require.Equal(t, "refund", retries[0].Attrs["tool"])
	require.Equal(t, "1", retries[0].Attrs["attempt"])

	// A panic is logged, to the dispatcher's logger too; the retry by key
	// succeeds.
	panicLog := func(r pgoncetest.LogRecord) bool {
		return r.Message == "pgonce: provider panicked" && r.Attrs["key"] == string(panicked)
	}
	require.Equal(t, slog.LevelError, logs.Await(t, panicLog).Level)
	awaitState(t, client, panicked, outbox.StateSucceeded)
	require.Empty(t, clientLogs.Matching(panicLog), "the dispatcher's provider calls log to its own logger")

	for _, key := range keys {
		require.Len(t, logs.Matching(warning(key)), map[bool]int{true: 0, false: 1}[key == succeeded || key == panicked], "key %s", key)
		require.Empty(t, clientLogs.Matching(warning(key)), "the dispatcher's logs go to its own logger")
	}
}
