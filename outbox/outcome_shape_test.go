package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/httpstatus"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestOutcomeShape checks every cell of the table "One shape for every
// outcome" in docs/concepts.md: for each situation, what SubmitTx, Submit, Do and Wait
// return (the Result's state, Created, the errors it matches), and the
// observation and HTTP status those make, on both drivers.
func TestOutcomeShape(t *testing.T) {
	t.Parallel()
	eachHarness(t, testOutcomeShape[pgx.Tx], testOutcomeShape[*sql.Tx])
}

// outcome is one cell: what one operation returns in one situation.
type outcome struct {
	// state is the Result's state; empty for the zero Result.
	state   outbox.State
	created bool
	// errs are the errors the returned error matches; none for nil.
	errs []error
	obs  outbox.ObservationStatus
	code int
}

func testOutcomeShape[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client *outbox.Client[TTx]
		schema string
	}
	schema := pgoncetest.Schema(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund",
		&countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("charge",
		&countingProvider{err: outbox.Permanent(errors.New("card declined"))}, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("email",
		&countingProvider{err: outbox.Ambiguous(errors.New("connection reset after send"))}, outbox.AtMostOnce))
	require.NoError(t, registry.Register("flaky",
		&countingProvider{err: errors.New("503 from upstream")}, outbox.IdempotentByKey))
	bundle := &testBundle{
		client: h.newClient(t, outbox.Config{Schema: schema, Registry: registry}),
		schema: schema,
	}
	deadlines := newReadDeadlines(bundle.client)

	call := func(tool, runID string) outbox.Call {
		c := refundCall(runID)
		c.Tool = tool
		return c
	}
	do := func(t *testing.T, c outbox.Call) outbox.Result {
		t.Helper()
		res, err := bundle.client.Do(t.Context(), c, nil)
		if !errors.Is(err, outbox.ErrProviderFailed) {
			require.NoError(t, err)
		}
		return res
	}

	var (
		created    = outcome{state: outbox.StatePending, created: true, obs: outbox.ObservationInProgress, code: http.StatusAccepted}
		pending    = outcome{state: outbox.StatePending, obs: outbox.ObservationInProgress, code: http.StatusAccepted}
		ranNow     = outcome{state: outbox.StateSucceeded, created: true, obs: outbox.ObservationSucceeded, code: http.StatusCreated}
		succeeded  = outcome{state: outbox.StateSucceeded, obs: outbox.ObservationSucceeded, code: http.StatusOK}
		failed     = outcome{state: outbox.StateFailed, obs: outbox.ObservationFailed, code: http.StatusOK}
		review     = outcome{state: outbox.StateNeedsReview, obs: outbox.ObservationNeedsReview, code: http.StatusAccepted}
		expired    = outcome{state: outbox.StateExpired, errs: []error{outbox.ErrExpired}, obs: outbox.ObservationExpired, code: http.StatusGone}
		conflict   = outcome{errs: []error{outbox.ErrKeyConflict}, obs: outbox.ObservationConflict, code: http.StatusConflict}
		notFound   = outcome{errs: []error{outbox.ErrNotFound}, obs: outbox.ObservationNotFound, code: http.StatusNotFound}
		inProgress = func(state outbox.State, errs ...error) outcome {
			return outcome{state: state, errs: errs, obs: outbox.ObservationInProgress, code: http.StatusAccepted}
		}
	)
	waitTimedOut := []error{outbox.ErrInProgress, context.DeadlineExceeded}

	for _, tt := range []struct {
		name string
		// prepare brings the key of the call it returns to the situation;
		// runID is the cell's own.
		prepare func(t *testing.T, runID string) outbox.Call
		// submit is the cell of SubmitTx and Submit, do Do's, wait Wait's
		// for the call's key; nil: not a situation of that operation.
		submit, do, wait *outcome
	}{
		{
			name:    "NoKey",
			prepare: func(t *testing.T, runID string) outbox.Call { return call("refund", runID) },
			submit:  &created, do: &ranNow, wait: &notFound,
		},
		{
			name: "Pending",
			prepare: func(t *testing.T, runID string) outbox.Call {
				_, err := bundle.client.Submit(t.Context(), call("refund", runID))
				require.NoError(t, err)
				return call("refund", runID)
			},
			// Do takes a pending key no dispatcher has claimed and runs it;
			// it did not create the key, so its answer is a replay.
			submit: &pending, do: &succeeded, wait: cell(inProgress(outbox.StatePending, waitTimedOut...)),
		},
		{
			name: "InFlight",
			prepare: func(t *testing.T, runID string) outbox.Call {
				res, err := bundle.client.Submit(t.Context(), call("refund", runID))
				require.NoError(t, err)
				pgoncetest.AbandonKeys(t, bundle.schema, -time.Hour, res.Key) // a lease that runs for an hour
				return call("refund", runID)
			},
			submit: cell(inProgress(outbox.StateInFlight)),
			do:     cell(inProgress(outbox.StateInFlight, outbox.ErrInProgress)),
			wait:   cell(inProgress(outbox.StateInFlight, waitTimedOut...)),
		},
		{
			name: "RetryableFailure",
			prepare: func(t *testing.T, runID string) outbox.Call {
				do(t, call("flaky", runID))
				return call("flaky", runID)
			},
			// A Do that fails retryably leaves the key pending; so does
			// this one, which tries again at once.
			submit: &pending, do: cell(inProgress(outbox.StatePending, outbox.ErrProviderFailed)),
			wait: cell(inProgress(outbox.StatePending, waitTimedOut...)),
		},
		{
			name: "Succeeded",
			prepare: func(t *testing.T, runID string) outbox.Call {
				do(t, call("refund", runID))
				return call("refund", runID)
			},
			submit: &succeeded, do: &succeeded, wait: &succeeded,
		},
		{
			name: "Failed",
			prepare: func(t *testing.T, runID string) outbox.Call {
				do(t, call("charge", runID))
				return call("charge", runID)
			},
			submit: &failed, do: &failed, wait: &failed,
		},
		{
			name: "NeedsReview",
			prepare: func(t *testing.T, runID string) outbox.Call {
				require.Equal(t, outbox.StateNeedsReview, do(t, call("email", runID)).State)
				return call("email", runID)
			},
			submit: &review, do: &review, wait: &review,
		},
		{
			name: "Expired",
			prepare: func(t *testing.T, runID string) outbox.Call {
				res := do(t, call("refund", runID))
				_, err := pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(bundle.schema),
					pgoncetest.StoredKey(t, string(res.Key)), nil)
				require.NoError(t, err)
				return call("refund", runID)
			},
			submit: &expired, do: &expired, wait: &expired,
		},
		{
			name: "SameStepOtherArguments",
			prepare: func(t *testing.T, runID string) outbox.Call {
				do(t, call("refund", runID))
				replanned := call("refund", runID)
				replanned.Args = map[string]any{"order": 8842, "amount": "4200.00"}
				return replanned
			},
			// The asked action does not exist: Wait for its key finds none.
			submit: &conflict, do: &conflict, wait: &notFound,
		},
		{
			name: "SameStepOtherTool",
			prepare: func(t *testing.T, runID string) outbox.Call {
				do(t, call("refund", runID))
				return call("charge", runID)
			},
			submit: &conflict, do: &conflict, wait: &notFound,
		},
		{
			name: "BusinessKeyOtherArguments",
			prepare: func(t *testing.T, runID string) outbox.Call {
				first := call("refund", runID)
				first.Key = "refund:" + runID
				do(t, first)
				reused := first
				reused.Args = map[string]any{"order": 1}
				return reused
			},
			submit: &conflict, do: &conflict,
		},
		{
			name: "NotCanonicalArguments",
			prepare: func(t *testing.T, runID string) outbox.Call {
				c := call("refund", runID)
				c.Args = json.RawMessage(`{"order": 8842, "order": 8843}`)
				return c
			},
			submit: &outcome{errs: []error{outbox.ErrNotCanonical}, obs: outbox.ObservationInvalidArguments, code: http.StatusUnprocessableEntity},
			do:     &outcome{errs: []error{outbox.ErrNotCanonical}, obs: outbox.ObservationInvalidArguments, code: http.StatusUnprocessableEntity},
		},
		{
			name:    "UnknownTool",
			prepare: func(t *testing.T, runID string) outbox.Call { return call("refnud", runID) },
			submit:  &outcome{errs: []error{outbox.ErrUnknownTool}, obs: outbox.ObservationUnknownTool, code: http.StatusUnprocessableEntity},
			do:      &outcome{errs: []error{outbox.ErrUnknownTool}, obs: outbox.ObservationUnknownTool, code: http.StatusUnprocessableEntity},
		},
		{
			name: "InvalidCall",
			prepare: func(t *testing.T, runID string) outbox.Call {
				c := call("refund", runID)
				c.Step = -1
				return c
			},
			submit: &outcome{errs: []error{outbox.ErrInvalidCall}, obs: outbox.ObservationInvalidCall, code: http.StatusBadRequest},
			do:     &outcome{errs: []error{outbox.ErrInvalidCall}, obs: outbox.ObservationInvalidCall, code: http.StatusBadRequest},
		},
	} {
		for _, op := range []struct {
			name string
			cell func() *outcome
			run  func(t *testing.T, c outbox.Call) (outbox.Result, error)
		}{
			{"SubmitTx", func() *outcome { return tt.submit }, func(t *testing.T, c outbox.Call) (outbox.Result, error) {
				tx := h.begin(t, nil)
				res, err := bundle.client.SubmitTx(t.Context(), tx, c)
				if err != nil {
					require.NoError(t, h.rollback(tx))
					return res, err
				}
				require.NoError(t, h.commit(tx))
				return res, nil
			}},
			{"Submit", func() *outcome { return tt.submit }, func(t *testing.T, c outbox.Call) (outbox.Result, error) {
				return bundle.client.Submit(t.Context(), c)
			}},
			{"Do", func() *outcome { return tt.do }, func(t *testing.T, c outbox.Call) (outbox.Result, error) {
				return bundle.client.Do(t.Context(), c, nil)
			}},
			{"Wait", func() *outcome { return tt.wait }, func(t *testing.T, c outbox.Call) (outbox.Result, error) {
				key, err := outbox.DeriveKey(c)
				require.NoError(t, err)
				// A key in progress stays so: its wait's deadline passes
				// once it has read it.
				return bundle.client.Wait(deadlines.after(t.Context(), key), key)
			}},
		} {
			want := op.cell()
			if want == nil {
				continue
			}
			t.Run(tt.name+"/"+op.name, func(t *testing.T) {
				t.Parallel()
				c := tt.prepare(t, tt.name+"-"+op.name)
				res, err := op.run(t, c)

				require.Equal(t, want.state, res.State, "state (error %v)", err)
				require.Equal(t, want.created, res.Created, "created")
				if len(want.errs) == 0 {
					require.NoError(t, err)
				}
				for _, target := range want.errs {
					require.ErrorIs(t, err, target)
				}
				switch {
				case want.state != "":
					// A Result with a state describes the asked action's key.
					key, keyErr := outbox.DeriveKey(c)
					require.NoError(t, keyErr)
					require.Equal(t, key, res.Key)
				default:
					require.Equal(t, outbox.Result{}, res, "an answer without a state is the zero Result")
				}
				if want.state == outbox.StateExpired {
					require.False(t, res.CompletedAt.IsZero(), "an expired key's Result says when it completed")
				}
				obs := outbox.ObservationFor(res, err)
				require.Equal(t, want.obs, obs.Status, "%s", obs.JSON())
				require.Equal(t, want.code, httpstatus.For(res, err).Code, "%s", obs.JSON())
			})
		}
	}

	t.Run("InvalidKey/Wait", func(t *testing.T) {
		t.Parallel()
		res, err := bundle.client.Wait(t.Context(), outbox.Key("k1_not-a-key"))
		require.ErrorIs(t, err, outbox.ErrInvalidKey)
		require.Equal(t, outbox.Result{}, res)
		require.Equal(t, outbox.ObservationInvalidCall, outbox.ObservationFor(res, err).Status)
		require.Equal(t, http.StatusBadRequest, httpstatus.For(res, err).Code)

		res, err = bundle.client.WaitResult(t.Context(), outbox.Result{Created: true})
		require.ErrorIs(t, err, outbox.ErrInvalidKey)
		require.Equal(t, outbox.Result{}, res)
	})

	t.Run("CreatorWaitsWithWaitResult", func(t *testing.T) {
		t.Parallel()
		res, err := bundle.client.Submit(t.Context(), call("refund", "creator-waits"))
		require.NoError(t, err)
		do(t, call("refund", "creator-waits"))
		got, err := bundle.client.WaitResult(t.Context(), res)
		require.NoError(t, err)
		require.Equal(t, outbox.ObservationSucceeded, outbox.ObservationFor(got, err).Status)
		require.Equal(t, http.StatusCreated, httpstatus.For(got, err).Code)
	})
}

func cell(o outcome) *outcome { return &o }
