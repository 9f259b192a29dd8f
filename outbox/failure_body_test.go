package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
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

func TestPermanentBody(t *testing.T) {
	t.Parallel()

	t.Run("NeverNil", func(t *testing.T) {
		t.Parallel()
		err := outbox.PermanentBody(nil, nil)
		require.Error(t, err)
		require.Equal(t, "permanent failure", err.Error())
		var permanent *outbox.PermanentError
		require.ErrorAs(t, err, &permanent)
		require.Nil(t, permanent.Body())
	})

	t.Run("CopiesTheBody", func(t *testing.T) {
		t.Parallel()
		buf := []byte(`{"code":"card_declined"}`)
		err := outbox.PermanentBody(buf, nil)
		copy(buf, "XXXXXXXXXX")
		var permanent *outbox.PermanentError
		require.ErrorAs(t, err, &permanent)
		requireVerbatim(t, `{"code":"card_declined"}`, permanent.Body())
		// Body returns a copy too.
		permanent.Body()[0] = 'X'
		requireVerbatim(t, `{"code":"card_declined"}`, permanent.Body())
	})

	t.Run("WrapsItsCause", func(t *testing.T) {
		t.Parallel()
		err := fmt.Errorf("charge: %w", outbox.PermanentBody(json.RawMessage(`{}`), io.ErrUnexpectedEOF))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Equal(t, "charge: permanent: unexpected EOF", err.Error())
		require.False(t, outbox.IsAmbiguous(err))
	})

	t.Run("ErrorShowsTheBodyWithoutACause", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "permanent: failure body {\"s\":\"\uFFFD\"}", outbox.PermanentBody(json.RawMessage("{\"s\":\"\xff\"}"), nil).Error())
	})
}

func TestFailureBodies(t *testing.T) {
	t.Parallel()
	eachHarness(t, testFailureBodies[pgx.Tx], testFailureBodies[*sql.Tx])
}

// failingLookup is a natural-id provider whose calls are uncertain, and
// whose lookups answer lookupErr.
type failingLookup struct {
	countingProvider
	lookupErr error
}

func (p *failingLookup) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	return nil, false, p.lookupErr
}

func testFailureBodies[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client *outbox.Client[TTx]
		logs   *pgoncetest.Logs
	}

	setup := func(t *testing.T, tools ...func(*outbox.Registry)) *testBundle {
		t.Helper()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", &countingProvider{response: json.RawMessage(`{}`)}, outbox.IdempotentByKey))
		for _, tool := range tools {
			tool(registry)
		}
		logger, logs := pgoncetest.CaptureLogs()
		client := h.newClient(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry, Logger: logger})
		return &testBundle{client: client, logs: logs}
	}

	// requireReplays asserts that every way of asking for call again
	// returns failure, byte for byte, without calling provider again.
	requireReplays := func(t *testing.T, client *outbox.Client[TTx], call outbox.Call, provider outbox.Provider, calls func() int64, failure string) {
		t.Helper()
		before := calls()
		again, err := client.Do(t.Context(), call, provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, again.State)
		require.True(t, again.Replayed())
		requireVerbatim(t, failure, again.Failure)
		submitted, err := client.Submit(t.Context(), call)
		require.NoError(t, err)
		requireVerbatim(t, failure, submitted.Failure)
		got, err := client.Get(t.Context(), again.Key)
		require.NoError(t, err)
		requireVerbatim(t, failure, got.Failure)
		waited, err := client.Wait(t.Context(), again.Key)
		require.NoError(t, err)
		requireVerbatim(t, failure, waited.Failure)
		require.Equal(t, before, calls(), "a failure is replayed, never run again")
	}

	t.Run("DoStoresTheProvidersBodyAndReplaysItByteForByte", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		provider := &countingProvider{err: outbox.PermanentBody(json.RawMessage(declined), errors.New("card declined"))}
		call := refundCall("run-body")

		res, err := bundle.client.Do(t.Context(), call, provider)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State)
		requireVerbatim(t, declined, res.Failure)
		require.Equal(t, "permanent: card declined", res.LastError)
		require.Equal(t,
			`{"status":"failed","key":"`+string(res.Key)+`","failure":`+declined+`}`,
			string(res.Observation().JSON()))
		requireReplays(t, bundle.client, call, provider, provider.calls.Load, declined)
	})

	t.Run("WrappedBodyIsFound", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		provider := &countingProvider{err: fmt.Errorf("stripe: %w", outbox.PermanentBody(json.RawMessage(declined), nil))}

		res, err := bundle.client.Do(t.Context(), refundCall("run-wrapped"), provider)
		require.NoError(t, err)
		requireVerbatim(t, declined, res.Failure)
		require.Contains(t, res.LastError, "failure body", "without a cause, the last error shows the body")
		require.Contains(t, res.LastError, "card_declined")
	})

	t.Run("PlainErrorStaysWrapped", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		for i, tt := range []struct {
			name string
			err  error
			want string
		}{
			{"Permanent", outbox.Permanent(errors.New(`{"code":"card_declined"}`)), `{"error":"{\"code\":\"card_declined\"}"}`},
			{"EmptyBody", outbox.PermanentBody(json.RawMessage{}, errors.New("card declined")), `{"error":"card declined"}`},
			{"NothingAtAll", outbox.PermanentBody(nil, nil), `{"error":"permanent failure"}`},
			{"BadText", outbox.Permanent(errors.New("card \x00 declined \xff")), `{"error":"card ` + "\uFFFD" + ` declined ` + "\uFFFD" + `"}`},
		} {
			res, err := bundle.client.Do(t.Context(), refundCall(fmt.Sprintf("run-plain-%d", i)), &countingProvider{err: tt.err})
			require.NoError(t, err, tt.name)
			require.Equal(t, outbox.StateFailed, res.State, tt.name)
			require.Equal(t, tt.want, string(res.Failure), tt.name)
		}
	})

	t.Run("BodiesThatAreNotValidUTF8JSONAreKeptVerbatim", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		for i, tt := range []struct {
			name, body, observed string
		}{
			{"NotJSON", "card declined \xff\xfe", `"card declined \ufffd\ufffd"`},
			{"InvalidUTF8InJSON", "{\"s\":\"caf\xe9\"}", `"{\"s\":\"caf\ufffd\"}"`},
			{"NUL", "declined\x00", `"declined\u0000"`},
			{"Truncated", `{"code":`, `"{\"code\":"`},
		} {
			call := refundCall(fmt.Sprintf("run-invalid-%d", i))
			provider := &countingProvider{err: outbox.PermanentBody(json.RawMessage(tt.body), nil)}
			res, err := bundle.client.Do(t.Context(), call, provider)
			require.NoError(t, err, tt.name)
			require.Equal(t, outbox.StateFailed, res.State, tt.name)
			requireVerbatim(t, tt.body, res.Failure, tt.name)
			require.True(t, utf8.ValidString(res.LastError), tt.name)
			obs := res.Observation().JSON()
			require.True(t, json.Valid(obs) && utf8.Valid(obs), tt.name)
			require.Equal(t, `{"status":"failed","key":"`+string(res.Key)+`","failure":`+tt.observed+`}`, string(obs), tt.name)
			requireReplays(t, bundle.client, call, provider, provider.calls.Load, tt.body)
		}
	})

	t.Run("LookupFindsAFailureForGood", func(t *testing.T) {
		t.Parallel()
		provider := &failingLookup{
			countingProvider: countingProvider{err: outbox.Ambiguous(errors.New("timeout after send"))},
			lookupErr:        outbox.PermanentBody(json.RawMessage(declined), errors.New("charge found declined")),
		}
		bundle := setup(t, func(r *outbox.Registry) {
			require.NoError(t, r.Register("provision", provider, outbox.LookupByNaturalID))
		})
		call := outbox.Call{RunID: "run-lookup", Step: 1, Tool: "provision", NaturalID: "nat-1", Args: map[string]any{}}

		// The first attempt is uncertain; the second reads before it writes,
		// and the lookup says the action failed for good.
		_, err := bundle.client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		res, err := bundle.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State)
		requireVerbatim(t, declined, res.Failure)
		require.Equal(t, "lookup: permanent: charge found declined", res.LastError)
		require.Equal(t, int64(1), provider.calls.Load(), "a failure found is not called again")
		requireReplays(t, bundle.client, call, provider, provider.calls.Load, declined)
	})

	t.Run("LookupErrorThatIsNotPermanentLooksUpAgain", func(t *testing.T) {
		t.Parallel()
		provider := &failingLookup{
			countingProvider: countingProvider{err: outbox.Ambiguous(errors.New("timeout after send"))},
			lookupErr:        errors.New("lookup endpoint 503"),
		}
		bundle := setup(t, func(r *outbox.Registry) {
			require.NoError(t, r.Register("provision", provider, outbox.LookupByNaturalID))
		})
		call := outbox.Call{RunID: "run-lookup-503", Step: 1, Tool: "provision", NaturalID: "nat-1", Args: map[string]any{}}

		_, err := bundle.client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		res, err := bundle.client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		require.Equal(t, outbox.StatePending, res.State)
		require.Equal(t, int64(1), provider.calls.Load(), "nothing is called while the outcome is unknown")
	})

	t.Run("ResolvedFailureIsReplayedByteForByte", func(t *testing.T) {
		t.Parallel()
		provider := &countingProvider{err: outbox.Ambiguous(errors.New("connection reset after send"))}
		bundle := setup(t, func(r *outbox.Registry) {
			require.NoError(t, r.Register("email", provider, outbox.AtMostOnce))
		})
		call := outbox.Call{RunID: "run-resolve", Step: 1, Tool: "email", Args: map[string]any{}}
		review, err := bundle.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, review.State)

		resolved, err := bundle.client.Resolve(t.Context(), review.Key, outbox.Resolution{
			Action: outbox.ResolveFailed, Failure: json.RawMessage(declined), By: "ops", Reason: "the mail log shows a bounce",
		})
		require.NoError(t, err)
		requireVerbatim(t, declined, resolved.Failure)
		requireReplays(t, bundle.client, call, provider, provider.calls.Load, declined)
	})

	t.Run("DoLogsFinalFailuresAsWarnings", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, func(r *outbox.Registry) {
			require.NoError(t, r.Register("email", &countingProvider{}, outbox.AtMostOnce))
		})

		failed, err := bundle.client.Do(t.Context(), refundCall("run-log"),
			&countingProvider{err: outbox.PermanentBody(json.RawMessage(declined), errors.New("card declined"))})
		require.NoError(t, err)
		review, err := bundle.client.Do(t.Context(), outbox.Call{RunID: "run-log", Step: 4, Tool: "email", Args: map[string]any{}},
			&countingProvider{err: outbox.Ambiguous(errors.New("connection reset after send"))})
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, review.State)
		retried, err := bundle.client.Do(t.Context(), refundCall("run-log-retry"), &countingProvider{err: errors.New("503")})
		require.ErrorIs(t, err, outbox.ErrProviderFailed)

		for _, tt := range []struct {
			key           outbox.Key
			tool, message string
			lastError     string
		}{
			{failed.Key, "refund", "pgonce: key failed permanently", "permanent: card declined"},
			{review.Key, "email", "pgonce: key needs review; nothing runs until an operator resolves it", "ambiguous: connection reset after send"},
		} {
			got := bundle.logs.Matching(func(r pgoncetest.LogRecord) bool { return r.Attrs["key"] == string(tt.key) })
			require.Len(t, got, 1)
			require.Equal(t, slog.LevelWarn, got[0].Level)
			require.Equal(t, tt.message, got[0].Message)
			require.Equal(t, tt.tool, got[0].Attrs["tool"])
			require.Equal(t, "1", got[0].Attrs["attempt"])
			require.Equal(t, tt.lastError, got[0].Attrs["error"])
		}
		require.Empty(t, bundle.logs.Matching(func(r pgoncetest.LogRecord) bool {
			return r.Level >= slog.LevelWarn && r.Attrs["key"] == string(retried.Key)
		}), "a retry is no warning")
	})
}
