package attempt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// eachStore runs test once per driver, with what opens a bundle over that
// driver's store in a schema of the test's own.
func eachStore(t *testing.T, test func(t *testing.T, open func(t *testing.T) *testBundle)) {
	t.Helper()
	t.Run("Pgx", func(t *testing.T) {
		t.Parallel()
		test(t, setup)
	})
	t.Run("DatabaseSQL", func(t *testing.T) {
		t.Parallel()
		test(t, func(t *testing.T) *testBundle {
			t.Helper()
			bundle := setup(t)
			driver, err := store.NewStdDriver(pgoncetest.DB(t), bundle.schema)
			require.NoError(t, err)
			bundle.store = driver.Store()
			bundle.runner = New(bundle.store, bundle.runner.config)
			return bundle
		})
	})
}

// warnings returns the warnings logs holds about key.
func warnings(logs *pgoncetest.Logs, key string) []pgoncetest.LogRecord {
	return logs.Matching(func(r pgoncetest.LogRecord) bool {
		return r.Level == slog.LevelWarn && r.Attrs["key"] == key
	})
}

func TestRecordLogsWhatAnOperatorMustActOn(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(t *testing.T) *testBundle) {
		t.Helper()
		t.Run("FinalFailuresAndReviewsAreWarnings", func(t *testing.T) {
			t.Parallel()
			bundle := open(t)
			logger, logs := pgoncetest.CaptureLogs()

			outcomes := bundle.inFlight(t, 5)
			for i := range outcomes {
				outcomes[i].Tool = "refund"
			}
			succeeded, permanent, gaveUp, review, retry := outcomes[0], &outcomes[1], &outcomes[2], &outcomes[3], &outcomes[4]
			permanent.Kind, permanent.Response, permanent.Failure = Failed, nil, json.RawMessage(`{"code":"card_declined"}`)
			permanent.Err = errors.New("card declined")
			gaveUp.Kind, gaveUp.Response, gaveUp.Failure, gaveUp.GaveUp = Failed, nil, json.RawMessage(`{}`), true
			gaveUp.Err = errors.New("503 \x00 upstream")
			review.Kind, review.Response = NeedsReview, nil
			review.Err = errors.New("an earlier attempt's outcome is unknown")
			retry.Kind, retry.Response, retry.Err = Retry, nil, errors.New("503")

			written, err := bundle.runner.Record(WithLogger(t.Context(), logger), outcomes)
			require.NoError(t, err)
			require.Len(t, written, len(outcomes))

			for _, tt := range []struct {
				name    string
				outcome Outcome
				message string
				error   string
			}{
				{"Permanent", *permanent, "pgonce: key failed permanently", "card declined"},
				{"GaveUp", *gaveUp, "pgonce: key gave up after its last attempt and failed", "503 \uFFFD upstream"},
				{"NeedsReview", *review, "pgonce: key needs review; nothing runs until an operator resolves it", "an earlier attempt's outcome is unknown"},
			} {
				got := warnings(logs, tt.outcome.Key)
				require.Len(t, got, 1, tt.name)
				require.Equal(t, tt.message, got[0].Message, tt.name)
				require.Equal(t, "refund", got[0].Attrs["tool"], tt.name)
				require.Equal(t, "1", got[0].Attrs["attempt"], tt.name)
				require.Equal(t, tt.error, got[0].Attrs["error"], tt.name)
			}
			require.Equal(t, "true", warnings(logs, gaveUp.Key)[0].Attrs["gave_up"])
			require.Empty(t, warnings(logs, succeeded.Key), "a success is no warning")
			require.Empty(t, warnings(logs, retry.Key), "a retry is no warning")
		})

		t.Run("WithoutAContextLoggerTheRunnersLogs", func(t *testing.T) {
			t.Parallel()
			bundle := open(t)
			logger, logs := pgoncetest.CaptureLogs()
			bundle.runner = New(bundle.store, func() Config { c := bundle.runner.config; c.Logger = logger; return c }())

			outcomes := bundle.inFlight(t, 1)
			outcomes[0].Kind, outcomes[0].Response, outcomes[0].Err = NeedsReview, nil, errors.New("unknown")
			_, err := bundle.runner.Record(t.Context(), outcomes)
			require.NoError(t, err)
			require.Len(t, warnings(logs, outcomes[0].Key), 1)
		})

		t.Run("AnOutcomeNotRecordedIsLoggedAsFencedOut", func(t *testing.T) {
			t.Parallel()
			bundle := open(t)
			logger, logs := pgoncetest.CaptureLogs()

			// The key was taken over by a newer attempt: this failure is
			// not the key's.
			outcomes := bundle.inFlight(t, 1)
			_, err := pgoncetest.Pool(t).Exec(t.Context(), `UPDATE "`+bundle.schema+`".pgonce_key SET attempt = 2 WHERE key = $1`, pgoncetest.StoredKey(t, outcomes[0].Key))
			require.NoError(t, err)
			outcomes[0].Kind, outcomes[0].Response, outcomes[0].Failure = Failed, nil, json.RawMessage(`{}`)
			outcomes[0].Err = errors.New("card declined")

			written, err := bundle.runner.Record(WithLogger(t.Context(), logger), outcomes)
			require.NoError(t, err)
			require.Empty(t, written)
			// Not as the key's failure, but as an outcome that came too
			// late, with what its provider answered.
			got := warnings(logs, outcomes[0].Key)
			require.Len(t, got, 1)
			require.Contains(t, got[0].Message, "taken over")
			require.Equal(t, "failed", got[0].Attrs["outcome"])
			require.Equal(t, "card declined", got[0].Attrs["outcome_error"])
		})

		t.Run("AnUnrecordableFailureIsLoggedAsTheReviewItBecame", func(t *testing.T) {
			t.Parallel()
			bundle := open(t)
			logger, logs := pgoncetest.CaptureLogs()

			outcomes := bundle.inFlight(t, 1)
			outcomes[0].Tool = "refund"
			outcomes[0].Kind, outcomes[0].Response, outcomes[0].Failure = Failed, nil, json.RawMessage(`{}`)
			outcomes[0].Err = errors.New("card declined")
			rejectOutcome(t, bundle.schema, outcomes[0].Key, "22003")

			_, err := bundle.runner.Record(WithLogger(t.Context(), logger), outcomes)
			require.NoError(t, err)
			got := warnings(logs, outcomes[0].Key)
			require.Len(t, got, 1)
			require.Equal(t, "pgonce: key needs review; nothing runs until an operator resolves it", got[0].Message)
			require.Equal(t, "refund", got[0].Attrs["tool"])
			require.Contains(t, got[0].Attrs["error"], "failed outcome could not be recorded")
			require.Equal(t, string(store.StateNeedsReview), bundle.get(t, outcomes[0].Key).State)
		})

		t.Run("AWriteWhoseReplyWasLostIsLoggedOnce", func(t *testing.T) {
			t.Parallel()
			bundle := open(t)
			logger, logs := pgoncetest.CaptureLogs()
			ctx := WithLogger(t.Context(), logger)

			outcomes := bundle.inFlight(t, 1)
			outcomes[0].Kind, outcomes[0].Response, outcomes[0].Failure = Failed, nil, json.RawMessage(`{}`)
			outcomes[0].Err = errors.New("card declined")
			tries := 0
			lostReply := func(ctx context.Context, outs []Outcome, written map[string]bool) error {
				tries++
				if tries == 1 {
					// Written, but unheard: nothing logs it yet.
					_, err := bundle.store.Finish(ctx, &store.FinishParams{Outcomes: []store.Outcome{{
						Key: outs[0].Key, Scope: outs[0].Scope, Attempt: 1, State: store.StateFailed, Failure: outs[0].Failure, Retention: time.Hour,
					}}})
					require.NoError(t, err)
					return fmt.Errorf("record outcomes: %w", io.ErrUnexpectedEOF)
				}
				return bundle.runner.finish(ctx, outs, written)
			}
			written := map[string]bool{}
			require.NoError(t, bundle.runner.recordAll(ctx, time.Now().Add(time.Minute), outcomes, lostReply, written))
			require.True(t, written[outcomes[0].Key])
			require.Len(t, warnings(logs, outcomes[0].Key), 1)
		})
	})
}
