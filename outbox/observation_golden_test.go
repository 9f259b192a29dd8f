package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/outbox"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden observations in testdata/observation")

// TestObservationForGolden pins the JSON of every outcome an agent runtime
// puts in a model's context: each file in testdata/observation is one
// observation, byte for byte. Run with -update to rewrite them after a
// deliberate change, which the CHANGELOG must then announce: the shape is a
// contract.
func TestObservationForGolden(t *testing.T) {
	t.Parallel()

	key := outbox.Key("k1_" + strings.Repeat("ab", 32))
	other := outbox.Key("k1_" + strings.Repeat("cd", 32))
	completed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	deriveErr := func(c outbox.Call) error {
		_, err := outbox.DeriveKey(c)
		require.Error(t, err)
		return err
	}
	_, invalidKey := outbox.ParseKey("k1_nope")
	require.Error(t, invalidKey)

	for _, tt := range []struct {
		name string
		res  outbox.Result
		err  error
		want outbox.ObservationStatus
	}{
		{"succeeded", outbox.Result{Key: key, State: outbox.StateSucceeded, Created: true, Response: json.RawMessage(`{"refund_id": "re_1"}`)}, nil, outbox.ObservationSucceeded},
		{"succeeded_replayed", outbox.Result{Key: key, State: outbox.StateSucceeded, Response: json.RawMessage(`{"refund_id": "re_1"}`)}, nil, outbox.ObservationSucceeded},
		{"failed", outbox.Result{Key: key, State: outbox.StateFailed, Created: true, Failure: json.RawMessage(`{"code":"card_declined"}`)}, nil, outbox.ObservationFailed},
		{"failed_replayed", outbox.Result{Key: key, State: outbox.StateFailed, Failure: json.RawMessage(`{"code":"card_declined"}`)}, nil, outbox.ObservationFailed},
		{"in_progress", outbox.Result{Key: key, State: outbox.StatePending, Created: true, RetryAfter: 250 * time.Millisecond}, nil, outbox.ObservationInProgress},
		{"cancelled", outbox.Result{Key: key, State: outbox.StateCancelled, CompletedAt: completed}, nil, outbox.ObservationCancelled},
		{
			"in_progress_do",
			outbox.Result{Key: key, State: outbox.StateInFlight, RetryAfter: 2 * time.Second},
			&outbox.InProgressError{Key: key, RetryAfter: 2 * time.Second}, outbox.ObservationInProgress,
		},
		{
			"in_progress_wait_timed_out",
			outbox.Result{Key: key, State: outbox.StatePending, RetryAfter: 100 * time.Millisecond},
			fmt.Errorf("%w: %w", &outbox.InProgressError{Key: key, RetryAfter: 100 * time.Millisecond}, context.DeadlineExceeded),
			outbox.ObservationInProgress,
		},
		{
			"in_progress_provider_failed",
			outbox.Result{Key: key, State: outbox.StatePending, RetryAfter: 1500 * time.Millisecond},
			fmt.Errorf("%w: %w", outbox.ErrProviderFailed, errors.New("upstream said 503")), outbox.ObservationInProgress,
		},
		{
			"in_progress_record_failed",
			outbox.Result{Key: key, State: outbox.StateInFlight, RetryAfter: 2 * time.Second},
			fmt.Errorf("record outcomes: %w", outbox.ErrTimeout), outbox.ObservationInProgress,
		},
		{"needs_review", outbox.Result{Key: key, State: outbox.StateNeedsReview}, nil, outbox.ObservationNeedsReview},
		{
			"expired",
			outbox.Result{Key: key, State: outbox.StateExpired, CompletedAt: completed},
			&outbox.ExpiredError{Key: key, CompletedAt: completed}, outbox.ObservationExpired,
		},
		{
			"conflict",
			outbox.Result{},
			&outbox.KeyConflictError{Key: key, ExistingKey: other, Fingerprint: strings.Repeat("1", 64), ExistingTool: "refund"},
			outbox.ObservationConflict,
		},
		{
			"invalid_arguments",
			outbox.Result{},
			deriveErr(outbox.Call{RunID: "run-1", Step: 3, Tool: "refund", Args: json.RawMessage(`{"order": 8842, "amount": 42.00, "amount": 43}`)}),
			outbox.ObservationInvalidArguments,
		},
		{"unknown_tool", outbox.Result{}, fmt.Errorf("%w: %q is not registered", outbox.ErrUnknownTool, "refnud"), outbox.ObservationUnknownTool},
		{"unknown_tool_malformed_name", outbox.Result{}, deriveErr(outbox.Call{RunID: "run-1", Tool: "Refund Now"}), outbox.ObservationUnknownTool},
		{"invalid_call", outbox.Result{}, deriveErr(outbox.Call{Tool: "refund", Step: 3}), outbox.ObservationInvalidCall},
		{"invalid_key", outbox.Result{}, invalidKey, outbox.ObservationInvalidCall},
		{"not_found", outbox.Result{}, fmt.Errorf("%w: %s", outbox.ErrNotFound, key), outbox.ObservationNotFound},
		{"unavailable", outbox.Result{}, fmt.Errorf("claim key: %w", outbox.ErrTimeout), outbox.ObservationUnavailable},
		{"unavailable_context", outbox.Result{}, context.DeadlineExceeded, outbox.ObservationUnavailable},
		{"error", outbox.Result{}, errors.New(`get key: relation "pgonce.pgonce_key" does not exist (SQLSTATE 42P01)`), outbox.ObservationError},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obs := outbox.ObservationFor(tt.res, tt.err)
			require.Equal(t, tt.want, obs.Status)
			doc := append(obs.JSON(), '\n')
			marshalled, err := json.Marshal(obs)
			require.NoError(t, err)
			require.JSONEq(t, string(doc), string(marshalled))

			path := filepath.Join("testdata", "observation", tt.name+".json")
			if *updateGolden {
				require.NoError(t, os.WriteFile(path, doc, 0o600))
			}
			golden, err := os.ReadFile(path)
			require.NoError(t, err, "run go test -run TestObservationForGolden -update to write %s", path)
			require.Equal(t, string(golden), string(doc))

			// Every status but the two that carry the stored outcome tells
			// the model what to do next; none shows an error's text.
			if obs.Status != outbox.ObservationSucceeded && obs.Status != outbox.ObservationFailed {
				require.NotEmpty(t, obs.Message)
			}
			if tt.err != nil && obs.Status == outbox.ObservationError {
				require.NotContains(t, string(doc), "SQLSTATE")
			}
		})
	}

	t.Run("NilErrorIsResultObservation", func(t *testing.T) {
		t.Parallel()
		res := outbox.Result{Key: key, State: outbox.StateSucceeded, Response: json.RawMessage(`{}`)}
		require.Equal(t, res.Observation(), outbox.ObservationFor(res, nil))
	})
}
