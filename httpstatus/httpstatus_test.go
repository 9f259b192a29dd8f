package httpstatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/httpstatus"
	"github.com/pgonce/pgonce/outbox"
)

func TestFor(t *testing.T) {
	t.Parallel()

	key := outbox.Key("k1_" + strings.Repeat("ab", 32))
	completed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	_, notCanonical := outbox.DeriveKey(outbox.Call{RunID: "r", Tool: "refund", Args: json.RawMessage(`{"a":1,"a":2}`)})
	_, invalidCall := outbox.DeriveKey(outbox.Call{Tool: "refund"})
	_, invalidKey := outbox.ParseKey("nope")

	for _, tt := range []struct {
		name string
		res  outbox.Result
		err  error
		want httpstatus.Status
	}{
		{
			"Created",
			outbox.Result{Key: key, State: outbox.StateSucceeded, Created: true, Response: json.RawMessage(`{}`)},
			nil,
			httpstatus.Status{Code: http.StatusCreated},
		},
		{
			"Replayed",
			outbox.Result{Key: key, State: outbox.StateSucceeded, Response: json.RawMessage(`{}`)},
			nil,
			httpstatus.Status{Code: http.StatusOK, Replayed: true},
		},
		{
			"FailedFirst",
			outbox.Result{Key: key, State: outbox.StateFailed, Created: true, Failure: json.RawMessage(`{}`)},
			nil,
			httpstatus.Status{Code: http.StatusOK},
		},
		{
			"FailedReplayed",
			outbox.Result{Key: key, State: outbox.StateFailed, Failure: json.RawMessage(`{}`)},
			nil,
			httpstatus.Status{Code: http.StatusOK, Replayed: true},
		},
		{
			"Cancelled",
			outbox.Result{Key: key, State: outbox.StateCancelled},
			nil,
			httpstatus.Status{Code: http.StatusOK},
		},
		{
			"Pending",
			outbox.Result{Key: key, State: outbox.StatePending, Created: true, RetryAfter: 250 * time.Millisecond},
			nil,
			httpstatus.Status{Code: http.StatusAccepted, RetryAfter: 250 * time.Millisecond},
		},
		{
			"InFlightDo",
			outbox.Result{Key: key, State: outbox.StateInFlight, RetryAfter: 2 * time.Second},
			&outbox.InProgressError{Key: key, RetryAfter: 2 * time.Second},
			httpstatus.Status{Code: http.StatusAccepted, RetryAfter: 2 * time.Second},
		},
		{
			"WaitTimedOut",
			outbox.Result{Key: key, State: outbox.StatePending, RetryAfter: time.Second},
			fmt.Errorf("%w: %w", &outbox.InProgressError{Key: key, RetryAfter: time.Second}, context.DeadlineExceeded),
			httpstatus.Status{Code: http.StatusAccepted, RetryAfter: time.Second},
		},
		{
			"ProviderFailed",
			outbox.Result{Key: key, State: outbox.StatePending, RetryAfter: 3 * time.Second},
			fmt.Errorf("%w: %w", outbox.ErrProviderFailed, errors.New("503")),
			httpstatus.Status{Code: http.StatusAccepted, RetryAfter: 3 * time.Second},
		},
		{
			"NeedsReview",
			outbox.Result{Key: key, State: outbox.StateNeedsReview},
			nil,
			httpstatus.Status{Code: http.StatusAccepted},
		},
		{
			"Expired",
			outbox.Result{Key: key, State: outbox.StateExpired, CompletedAt: completed},
			&outbox.ExpiredError{Key: key, CompletedAt: completed},
			httpstatus.Status{Code: http.StatusGone},
		},
		{
			"Conflict",
			outbox.Result{},
			&outbox.KeyConflictError{Key: key, ExistingKey: key, ExistingTool: "refund"},
			httpstatus.Status{Code: http.StatusConflict},
		},
		{"NotCanonical", outbox.Result{}, notCanonical, httpstatus.Status{Code: http.StatusUnprocessableEntity}},
		{
			"UnknownTool",
			outbox.Result{},
			fmt.Errorf("%w: %q is not registered", outbox.ErrUnknownTool, "refnud"),
			httpstatus.Status{Code: http.StatusUnprocessableEntity},
		},
		{"InvalidCall", outbox.Result{}, invalidCall, httpstatus.Status{Code: http.StatusBadRequest}},
		{"InvalidKey", outbox.Result{}, invalidKey, httpstatus.Status{Code: http.StatusBadRequest}},
		{"NotFound", outbox.Result{}, fmt.Errorf("%w: %s", outbox.ErrNotFound, key), httpstatus.Status{Code: http.StatusNotFound}},
		{
			"Timeout",
			outbox.Result{},
			fmt.Errorf("claim key: %w", outbox.ErrTimeout),
			httpstatus.Status{Code: http.StatusServiceUnavailable, RetryAfter: outbox.ObservationUnavailableRetryAfter},
		},
		{
			"Serialization",
			outbox.Result{},
			outbox.ErrSerialization,
			httpstatus.Status{Code: http.StatusServiceUnavailable, RetryAfter: outbox.ObservationUnavailableRetryAfter},
		},
		{
			"ContextDone",
			outbox.Result{},
			context.Canceled,
			httpstatus.Status{Code: http.StatusServiceUnavailable, RetryAfter: outbox.ObservationUnavailableRetryAfter},
		},
		{"Other", outbox.Result{}, errors.New("schema not migrated"), httpstatus.Status{Code: http.StatusInternalServerError}},
		{"InvalidTx", outbox.Result{}, outbox.ErrInvalidTx, httpstatus.Status{Code: http.StatusInternalServerError}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, httpstatus.For(tt.res, tt.err))
		})
	}
}

func TestStatusSetHeaders(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name       string
		status     httpstatus.Status
		retryAfter string
		replayed   string
	}{
		{"None", httpstatus.Status{Code: http.StatusCreated}, "", ""},
		{"RoundsUp", httpstatus.Status{Code: http.StatusAccepted, RetryAfter: 250 * time.Millisecond}, "1", ""},
		{"WholeSeconds", httpstatus.Status{Code: http.StatusAccepted, RetryAfter: 2 * time.Second}, "2", ""},
		{"AboveWholeSeconds", httpstatus.Status{Code: http.StatusAccepted, RetryAfter: 2001 * time.Millisecond}, "3", ""},
		{"Replayed", httpstatus.Status{Code: http.StatusOK, Replayed: true}, "", "true"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			tt.status.SetHeaders(h)
			require.Equal(t, tt.retryAfter, h.Get("Retry-After"))
			require.Equal(t, tt.replayed, h.Get(httpstatus.ReplayedHeader))
		})
	}
}

func TestWrite(t *testing.T) {
	t.Parallel()

	t.Run("ReplayEmbedsStoredBytes", func(t *testing.T) {
		t.Parallel()
		stored := `{"refund_id": "re_1",  "amount": "42.00"}`
		res := outbox.Result{Key: outbox.Key("k1_" + strings.Repeat("ab", 32)), State: outbox.StateSucceeded, Response: json.RawMessage(stored)}
		rec := httptest.NewRecorder()
		require.NoError(t, httpstatus.Write(rec, res, nil))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		require.Equal(t, "true", rec.Header().Get(httpstatus.ReplayedHeader))
		require.Equal(t, string(res.Observation().JSON()), rec.Body.String())
		require.Contains(t, rec.Body.String(), stored)
	})

	t.Run("UnavailableSaysWhenToRetry", func(t *testing.T) {
		t.Parallel()
		rec := httptest.NewRecorder()
		require.NoError(t, httpstatus.Write(rec, outbox.Result{}, outbox.ErrTimeout))
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Equal(t, "1", rec.Header().Get("Retry-After"))
		var doc map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &doc))
		require.Equal(t, "unavailable", doc["status"])
	})
}
