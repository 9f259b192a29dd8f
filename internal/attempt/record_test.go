package attempt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

type testBundle struct {
	runner *Runner
	store  *store.Store
	schema string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	schema := pgoncetest.Schema(t)
	driver, err := store.NewPgxDriver(pgoncetest.Pool(t), schema)
	require.NoError(t, err)
	s := driver.Store()
	runner := New(s, Config{
		CallTimeout:        time.Second,
		Lease:              time.Minute,
		Retention:          time.Hour,
		TombstoneRetention: 2 * time.Hour,
		StatementTimeout:   5 * time.Second,
		Logger:             slog.New(slog.DiscardHandler),
		ToolFunc:           func(string) *Tool { return nil },
		Classify:           func(error) ErrorKind { return Retryable },
		FailureBody:        func(err error) json.RawMessage { return json.RawMessage(`{"error":"x"}`) },
		AmbiguousFunc:      func(err error) error { return err },
	})
	return &testBundle{runner: runner, store: s, schema: schema}
}

// inFlight inserts n keys claimed in flight under attempt 1 and returns a
// succeeded outcome for each.
func (b *testBundle) inFlight(t *testing.T, n int) []Outcome {
	t.Helper()
	outcomes := make([]Outcome, 0, n)
	for i := range n {
		key, scope := fmt.Sprintf("k1_%064d", i), fmt.Sprintf("%064x", i)
		_, err := b.store.Executor().KeyInsert(t.Context(), &store.NewKey{
			Key: key, Scope: scope, RunID: "run", Step: int64(i), Tool: "refund",
			Args: []byte(`{}`), Lease: time.Minute, Worker: "test",
		})
		require.NoError(t, err)
		outcomes = append(outcomes, Outcome{Key: key, Scope: scope, Attempt: 1, Kind: Succeeded, Response: json.RawMessage(`{}`), Retention: time.Hour})
	}
	return outcomes
}

func (b *testBundle) get(t *testing.T, key string) *store.KeyRow {
	t.Helper()
	row, err := b.store.Executor().KeyGet(t.Context(), key, nil)
	require.NoError(t, err)
	return row
}

func TestRecordReadsBackWhatALostReplyWrote(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bundle := setup(t)

	// Two keys in flight under attempt 1; the second is then taken over.
	outcomes := bundle.inFlight(t, 2)
	_, err := pgoncetest.Pool(t).Exec(ctx, `UPDATE "`+bundle.schema+`".pgonce_key SET attempt = 2 WHERE key = $1`, pgoncetest.StoredKey(t, outcomes[1].Key))
	require.NoError(t, err)

	// The first try runs, but its reply is lost on the way back; the second
	// finds nothing left to write.
	tries := 0
	lostReply := func(ctx context.Context, outs []Outcome, written map[string]bool) error {
		tries++
		if tries == 1 {
			require.NoError(t, bundle.runner.finish(ctx, outs, map[string]bool{}))
			return fmt.Errorf("record outcomes: %w", io.ErrUnexpectedEOF)
		}
		return bundle.runner.finish(ctx, outs, written)
	}
	written := map[string]bool{}
	require.NoError(t, bundle.runner.recordAll(ctx, time.Now().Add(time.Minute), outcomes, lostReply, written))
	require.Equal(t, 2, tries)
	require.Equal(t, map[string]bool{outcomes[0].Key: true}, written, "the lost reply's write is ours; the taken-over key is not")

	require.Equal(t, string(store.StateSucceeded), bundle.get(t, outcomes[0].Key).State)
	taken := bundle.get(t, outcomes[1].Key)
	require.Equal(t, string(store.StateOpen), taken.State)
	require.NotNil(t, taken.LeaseUntil, "still in flight")
}

func TestRecordFallsBackRowByRowOnADataError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bundle := setup(t)

	outcomes := bundle.inFlight(t, 5)
	outcomes[4].Kind, outcomes[4].Response, outcomes[4].Err = Retry, nil, errors.New("503")
	// The database rejects one row's outcome with a data error, as it
	// would a value it cannot store.
	bad := outcomes[2].Key
	rejectOutcome(t, bundle.schema, bad, "22003")

	written, err := bundle.runner.Record(ctx, outcomes)
	require.NoError(t, err)
	require.Len(t, written, len(outcomes), "every outcome was written, the bad one as needs review")
	for i, o := range outcomes {
		row := bundle.get(t, o.Key)
		switch {
		case o.Key == bad:
			require.Equal(t, string(store.StateNeedsReview), row.State, "never attempted again")
			require.NotNil(t, row.LastError)
			require.Contains(t, *row.LastError, "succeeded outcome could not be recorded")
			require.Contains(t, *row.LastError, "value out of range")
		case o.Kind == Retry:
			require.Equal(t, string(store.StateOpen), row.State)
			require.Nil(t, row.LeaseUntil, "pending")
		default:
			require.Equal(t, string(store.StateSucceeded), row.State, "outcome %d", i)
		}
	}
}

// rejectOutcome makes the database reject, with an error of sqlState,
// every write of key's row but one that sends it to review.
func rejectOutcome(t *testing.T, schema string, key string, sqlState string) {
	t.Helper()
	_, err := pgoncetest.Pool(t).Exec(t.Context(), fmt.Sprintf(`
		CREATE FUNCTION %[1]s.reject_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.key = decode('%[2]s', 'hex') AND NEW.state <> 'needs_review' THEN
				RAISE EXCEPTION 'value out of range' USING ERRCODE = '%[3]s';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER reject_outcome BEFORE UPDATE ON %[1]s.pgonce_key
			FOR EACH ROW EXECUTE FUNCTION %[1]s.reject_outcome();`, `"`+schema+`"`, strings.TrimPrefix(key, "k1_"), sqlState))
	require.NoError(t, err)
}

func TestRecordLeavesInFlightWhatFailsForAnotherReason(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bundle := setup(t)

	outcomes := bundle.inFlight(t, 3)
	// Not the row's data (a raise_exception of a trigger): whatever it is,
	// the provider's success must not go to review, and nothing says the
	// next try would do better.
	bad := outcomes[1].Key
	rejectOutcome(t, bundle.schema, bad, "P0001")

	written, err := bundle.runner.Record(ctx, outcomes)
	require.ErrorContains(t, err, "SQLSTATE P0001")
	require.Equal(t, map[string]bool{outcomes[0].Key: true, outcomes[2].Key: true}, written)
	row := bundle.get(t, bad)
	require.Equal(t, string(store.StateOpen), row.State)
	require.NotNil(t, row.LeaseUntil, "left in flight for the reconciler")
}

func TestSanitizeText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", maxErrorTextBytes) // two bytes each
	for _, tt := range []struct {
		name, in, want string
	}{
		{"Clean", "503 upstream", "503 upstream"},
		{"NUL", "a\x00b", "a\uFFFDb"},
		{"InvalidUTF8", "a\xff\xfeb\xc3", "a\uFFFDb\uFFFD"},
		// 2045 bytes fit beside the ellipsis; the 2045th is inside an é.
		{"LongIsCutOnACharacterBoundary", long, long[:maxErrorTextBytes-len("…")-1] + "…"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := SanitizeText(tt.in)
			require.Equal(t, tt.want, got)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, len(got), maxErrorTextBytes)
		})
	}
}

// TestRecordWarnsOfAnOutcomeFencedOut: an outcome whose key was taken over
// writes nothing, and its key, tool, attempt and kind are logged as a
// warning, since the log is then all that knows what its provider answered.
func TestRecordWarnsOfAnOutcomeFencedOut(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bundle := setup(t)

	outcomes := bundle.inFlight(t, 3)
	for i := range outcomes {
		outcomes[i].Tool = "refund"
	}
	outcomes[2].Response = json.RawMessage(`"` + strings.Repeat("r", LargeOutcomeBytes) + `"`)
	// The reconciler took the second and third keys over.
	for _, o := range outcomes[1:] {
		_, err := pgoncetest.Pool(t).Exec(ctx, `UPDATE "`+bundle.schema+`".pgonce_key SET attempt = 2 WHERE key = $1`, pgoncetest.StoredKey(t, o.Key))
		require.NoError(t, err)
	}

	logger, logs := pgoncetest.CaptureLogs()
	written, err := bundle.runner.Record(WithLogger(ctx, logger), outcomes)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{outcomes[0].Key: true}, written)

	fenced := logs.Matching(func(r pgoncetest.LogRecord) bool {
		return r.Level == slog.LevelWarn && strings.Contains(r.Message, "taken over")
	})
	require.Len(t, fenced, 2)
	for i, record := range fenced {
		o := outcomes[i+1]
		require.Equal(t, o.Key, record.Attrs["key"])
		require.Equal(t, "refund", record.Attrs["tool"])
		require.Equal(t, "1", record.Attrs["attempt"])
		require.Equal(t, "succeeded", record.Attrs["outcome"])
	}
	require.Equal(t, 2, bundle.get(t, outcomes[1].Key).Attempt)
	require.Equal(t, string(store.StateOpen), bundle.get(t, outcomes[2].Key).State)
}

// TestRecordWritesALargeOutcomeAlone: a large outcome is written alone,
// after the others, so that however long its bytes take, they hold up no
// other outcome of its batch: here its row is locked, and the small outcome
// is written meanwhile.
func TestRecordWritesALargeOutcomeAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bundle := setup(t)
	outcomes := bundle.inFlight(t, 2)
	outcomes[1].Response = json.RawMessage(`"` + strings.Repeat("r", LargeOutcomeBytes) + `"`)
	require.True(t, outcomes[1].Large())
	require.False(t, outcomes[0].Large())

	lock, err := pgoncetest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.WithoutCancel(ctx)) }()
	_, err = lock.Exec(ctx, `SELECT FROM "`+bundle.schema+`".pgonce_key WHERE key = $1 FOR UPDATE`, pgoncetest.StoredKey(t, outcomes[1].Key))
	require.NoError(t, err)

	type recordedOutcomes struct {
		written map[string]bool
		err     error
	}
	recorded := make(chan recordedOutcomes, 1)
	go func() {
		written, err := bundle.runner.Record(ctx, outcomes)
		recorded <- recordedOutcomes{written, err}
	}()
	for bundle.get(t, outcomes[0].Key).State != string(store.StateSucceeded) {
		select {
		case got := <-recorded:
			t.Fatalf("Record returned before the small outcome was seen written: %v, %v", got.written, got.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.Equal(t, string(store.StateOpen), bundle.get(t, outcomes[1].Key).State)
	require.NoError(t, lock.Rollback(ctx))
	got := <-recorded
	require.NoError(t, got.err)
	require.Equal(t, map[string]bool{outcomes[0].Key: true, outcomes[1].Key: true}, got.written)
	require.Equal(t, string(store.StateSucceeded), bundle.get(t, outcomes[1].Key).State)
}
