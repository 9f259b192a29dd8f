package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestRecordReadsBackWhatALostReplyWrote(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := pgoncetest.Schema(t)
	registry := NewRegistry()
	provider := ProviderFunc(func(context.Context, Request) (json.RawMessage, error) { return nil, nil })
	require.NoError(t, registry.Register("refund", provider, IdempotentByKey))
	client, err := NewPgx(pgoncetest.Pool(t), Config{Schema: schema, Registry: registry})
	require.NoError(t, err)

	// Two keys in flight under attempt 1; the second is then taken over.
	var outcomes []Outcome
	for step := range int64(2) {
		res, err := client.Submit(ctx, Call{RunID: "run", Step: step, Tool: "refund", Args: map[string]any{}})
		require.NoError(t, err)
		_, err = client.claimPending(ctx, res.Key)
		require.NoError(t, err)
		outcomes = append(outcomes, Outcome{Key: res.Key, Attempt: 1, Kind: OutcomeSucceeded, Response: json.RawMessage(`{}`), Retention: time.Hour})
	}
	_, err = pgoncetest.Pool(t).Exec(ctx, `UPDATE "`+schema+`".pgonce_key SET attempt = 2 WHERE key = $1`, string(outcomes[1].Key))
	require.NoError(t, err)

	// The first try runs, but its reply is lost on the way back; the second
	// finds nothing left to write.
	tries := 0
	lostReply := func(ctx context.Context, outs []Outcome, written map[Key]bool) error {
		tries++
		if tries == 1 {
			require.NoError(t, client.finish(ctx, outs, map[Key]bool{}))
			return fmt.Errorf("record outcomes: %w", io.ErrUnexpectedEOF)
		}
		return client.finish(ctx, outs, written)
	}
	written := map[Key]bool{}
	require.NoError(t, client.recordAll(ctx, time.Now().Add(time.Minute), outcomes, lostReply, written))
	require.Equal(t, 2, tries)
	require.Equal(t, map[Key]bool{outcomes[0].Key: true}, written, "the lost reply's write is ours; the taken-over key is not")

	res, err := client.Get(ctx, outcomes[0].Key)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, res.State)
	res, err = client.Get(ctx, outcomes[1].Key)
	require.NoError(t, err)
	require.Equal(t, StateInFlight, res.State)
}

func TestRecordFallsBackRowByRowOnADataError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := pgoncetest.Schema(t)
	registry := NewRegistry()
	provider := ProviderFunc(func(context.Context, Request) (json.RawMessage, error) { return nil, nil })
	require.NoError(t, registry.Register("refund", provider, IdempotentByKey))
	client, err := NewPgx(pgoncetest.Pool(t), Config{Schema: schema, Registry: registry})
	require.NoError(t, err)

	var outcomes []Outcome
	for step := range int64(5) {
		res, err := client.Submit(ctx, Call{RunID: "run", Step: step, Tool: "refund", Args: map[string]any{}})
		require.NoError(t, err)
		_, err = client.claimPending(ctx, res.Key)
		require.NoError(t, err)
		outcomes = append(outcomes, Outcome{Key: res.Key, Attempt: 1, Kind: OutcomeSucceeded, Response: json.RawMessage(`{}`), Retention: time.Hour})
	}
	outcomes[4].Kind, outcomes[4].Response, outcomes[4].Err = OutcomeRetry, nil, errors.New("503")
	// The database rejects one row's outcome with a data error, as it
	// would a value it cannot store.
	bad := outcomes[2].Key
	rejectOutcome(t, schema, bad, "22003")

	written, err := client.Record(ctx, outcomes)
	require.NoError(t, err)
	require.Len(t, written, len(outcomes), "every outcome was written, the bad one as needs review")
	for i, o := range outcomes {
		res, err := client.Get(ctx, o.Key)
		require.NoError(t, err)
		switch {
		case o.Key == bad:
			require.Equal(t, StateNeedsReview, res.State, "never attempted again")
			require.Contains(t, res.LastError, "succeeded outcome could not be recorded")
			require.Contains(t, res.LastError, "value out of range")
		case o.Kind == OutcomeRetry:
			require.Equal(t, StatePending, res.State)
		default:
			require.Equal(t, StateSucceeded, res.State, "outcome %d", i)
		}
	}
}

// rejectOutcome makes the database reject, with an error of sqlState,
// every write of key's row but one that sends it to review.
func rejectOutcome(t *testing.T, schema string, key Key, sqlState string) {
	t.Helper()
	_, err := pgoncetest.Pool(t).Exec(t.Context(), fmt.Sprintf(`
		CREATE FUNCTION %[1]s.reject_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.key = '%[2]s' AND NEW.state <> 'needs_review' THEN
				RAISE EXCEPTION 'value out of range' USING ERRCODE = '%[3]s';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER reject_outcome BEFORE UPDATE ON %[1]s.pgonce_key
			FOR EACH ROW EXECUTE FUNCTION %[1]s.reject_outcome();`, `"`+schema+`"`, key, sqlState))
	require.NoError(t, err)
}

func TestRecordLeavesInFlightWhatFailsForAnotherReason(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := pgoncetest.Schema(t)
	registry := NewRegistry()
	provider := ProviderFunc(func(context.Context, Request) (json.RawMessage, error) { return nil, nil })
	require.NoError(t, registry.Register("refund", provider, IdempotentByKey))
	client, err := NewPgx(pgoncetest.Pool(t), Config{Schema: schema, Registry: registry})
	require.NoError(t, err)
	var outcomes []Outcome
	for step := range int64(3) {
		res, err := client.Submit(ctx, Call{RunID: "run", Step: step, Tool: "refund", Args: map[string]any{}})
		require.NoError(t, err)
		_, err = client.claimPending(ctx, res.Key)
		require.NoError(t, err)
		outcomes = append(outcomes, Outcome{Key: res.Key, Attempt: 1, Kind: OutcomeSucceeded, Response: json.RawMessage(`{}`), Retention: time.Hour})
	}
	// Not the row's data (a raise_exception of a trigger): whatever it is,
	// the provider's success must not go to review, and nothing says the
	// next try would do better.
	bad := outcomes[1].Key
	rejectOutcome(t, schema, bad, "P0001")

	written, err := client.Record(ctx, outcomes)
	require.ErrorContains(t, err, "SQLSTATE P0001")
	require.Equal(t, map[Key]bool{outcomes[0].Key: true, outcomes[2].Key: true}, written)
	res, err := client.Get(ctx, bad)
	require.NoError(t, err)
	require.Equal(t, StateInFlight, res.State, "left for the reconciler")
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
			got := sanitizeText(tt.in)
			require.Equal(t, tt.want, got)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, len(got), maxErrorTextBytes)
		})
	}
}
