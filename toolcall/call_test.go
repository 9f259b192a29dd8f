package toolcall_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

func TestArguments(t *testing.T) {
	t.Parallel()

	t.Run("RespellingsShareOneCanonicalForm", func(t *testing.T) {
		t.Parallel()
		want := `{"amount":"42.00","order":8842}`
		for _, text := range []string{
			`{"order":8842,"amount":"42.00"}`,
			`{ "amount" : "42.00", "order" : 8842.0 }`,
			"{\n\t\"order\": 8.842e3,\n\t\"amount\": \"\\u0034\\u0032.00\"\n}",
		} {
			got, err := toolcall.Arguments(text)
			require.NoError(t, err, text)
			require.Equal(t, want, string(got), text)
		}
	})

	t.Run("EmptyIsTheEmptyObject", func(t *testing.T) {
		t.Parallel()
		for _, text := range []string{"", " ", "\n\t\r "} {
			got, err := toolcall.Arguments(text)
			require.NoError(t, err)
			require.JSONEq(t, `{}`, string(got))
		}
	})

	t.Run("InvalidTextIsATypedErrorTheModelReadsAsInvalidArguments", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			text, path, reason string
		}{
			{`{"order": 8842, "amount": "42.0`, "$.amount", "not JSON"},
			{`{"order": 8842,}`, "$", "not JSON"},
			{`{"order": 8842} and then some`, "$", "not JSON"},
			{`{"order": 1, "order": 2}`, "$.order", "duplicate member name"},
			{"{\"note\": \"\xff\"}", "$.note", "invalid UTF-8"},
			{`[8842, "42.00"]`, "$", "tool arguments must be a JSON object"},
			{`"refund 8842"`, "$", "tool arguments must be a JSON object"},
			{`null`, "$", "tool arguments must be a JSON object"},
		} {
			got, err := toolcall.Arguments(tt.text)
			require.Nil(t, got, tt.text)
			require.ErrorIs(t, err, toolcall.ErrInvalidArguments, tt.text)
			require.ErrorIs(t, err, outbox.ErrNotCanonical, tt.text)
			var notCanonical *outbox.NotCanonicalError
			require.ErrorAs(t, err, &notCanonical, tt.text)
			require.Equal(t, tt.path, notCanonical.Path, tt.text)
			require.Contains(t, notCanonical.Reason, tt.reason, tt.text)

			obs := toolcall.Outcome{Err: err}.Observation()
			require.Equal(t, outbox.ObservationInvalidArguments, obs.Status, tt.text)
			require.Equal(t, tt.path, obs.Path, tt.text)
			require.Contains(t, obs.Reason, tt.reason, tt.text)
			require.True(t, json.Valid(obs.JSON()), tt.text)
		}
	})
}

func TestTurn(t *testing.T) {
	t.Parallel()

	turn := toolcall.Turn{Tenant: "acme", RunID: "run-8842", FirstStep: 5}
	call := turn.Call(2, "call_abc", "refund", `{"order":8842}`)
	require.Equal(t, toolcall.Call{
		ID: "call_abc", Tenant: "acme", RunID: "run-8842", Step: 7,
		Tool: "refund", Arguments: `{"order":8842}`,
	}, call)
	require.Equal(t, toolcall.Turn{Tenant: "acme", RunID: "run-8842", FirstStep: 8}, turn.Next(3))
	require.Equal(t, int64(5), turn.FirstStep, "Next returns a copy")
}

func TestOutcomeIsError(t *testing.T) {
	t.Parallel()

	succeeded := toolcall.Outcome{Result: outbox.Result{Key: "k1_x", State: outbox.StateSucceeded, Response: json.RawMessage(`{}`)}}
	require.False(t, succeeded.IsError())
	for _, out := range []toolcall.Outcome{
		{Result: outbox.Result{State: outbox.StateFailed, Failure: json.RawMessage(`{"error":"declined"}`)}},
		{Result: outbox.Result{State: outbox.StateInFlight}},
		{Result: outbox.Result{State: outbox.StateNeedsReview}},
		{Err: outbox.ErrKeyConflict},
		{Err: errors.New("anything else")},
	} {
		require.True(t, out.IsError(), "%+v", out)
	}
}

func TestRequestFromContext(t *testing.T) {
	t.Parallel()
	_, ok := toolcall.RequestFromContext(t.Context())
	require.False(t, ok)
	req := outbox.Request{Key: "k1_x", Tool: "refund", Attempt: 2}
	got, ok := toolcall.RequestFromContext(toolcall.ContextWithRequest(t.Context(), req))
	require.True(t, ok)
	require.Equal(t, req, got)
}
