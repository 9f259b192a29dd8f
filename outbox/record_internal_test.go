package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

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
