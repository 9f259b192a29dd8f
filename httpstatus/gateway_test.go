package httpstatus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpstatus"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// TestGateway runs the service of the issue that asked for this package: an
// HTTP endpoint takes an agent's tool call, submits it in a transaction of
// its own, waits, and answers with the model's observation, on both
// drivers, with a dispatcher running the calls.
func TestGateway(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testGateway, testGateway)
}

// toolCall is the gateway's request body.
type toolCall struct {
	RunID string          `json:"run_id"`
	Step  int64           `json:"step"`
	Tool  string          `json:"tool"`
	Args  json.RawMessage `json:"args"`
}

func testGateway[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	t.Helper()

	hold := make(chan struct{})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id": "re_1"}`), nil
	}), outbox.IdempotentByKey))
	require.NoError(t, registry.Register("charge", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return nil, outbox.Permanent(errors.New("card declined"))
	}), outbox.IdempotentByKey))
	require.NoError(t, registry.Register("slow", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		select {
		case <-hold:
			return json.RawMessage(`{}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), outbox.IdempotentByKey))
	schema := pgoncetest.Schema(t)
	client := d.Client(t, outbox.Config{Schema: schema, Registry: registry})

	disp, err := dispatcher.New(client, dispatcher.Config{})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- disp.Run(runCtx) }()
	t.Cleanup(func() {
		close(hold)
		stop()
		require.NoError(t, <-ran)
	})

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body toolCall
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		call := outbox.Call{RunID: body.RunID, Step: body.Step, Tool: body.Tool, Args: body.Args}
		var res outbox.Result
		err := d.InTx(t, r.Context(), func(tx TTx) error {
			var err error
			res, err = client.SubmitTx(r.Context(), tx, call)
			return err
		})
		if err != nil {
			// Rolled back: a submit's Result, if any, speaks of nothing.
			_ = httpstatus.Write(w, outbox.Result{}, err)
			return
		}
		// The caller says how long it waits for the outcome (RFC 7240
		// Prefer: wait=SECONDS); past that, the answer is "in progress".
		wait := time.Second
		if seconds, found := strings.CutPrefix(r.Header.Get("Prefer"), "wait="); found {
			n, err := strconv.Atoi(seconds)
			if err != nil || n < 0 {
				http.Error(w, "bad Prefer: wait", http.StatusBadRequest)
				return
			}
			wait = time.Duration(n) * time.Second
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		res, err = client.WaitResult(ctx, res)
		_ = httpstatus.Write(w, res, err)
	})
	server := httptest.NewServer(handler)
	t.Cleanup(server.Close)

	// postWaiting posts body, prepared to wait waitSeconds for its outcome.
	postWaiting := func(t *testing.T, body toolCall, waitSeconds int) (*http.Response, map[string]any) {
		t.Helper()
		payload, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, server.URL, bytes.NewReader(payload))
		require.NoError(t, err)
		req.Header.Set("Prefer", "wait="+strconv.Itoa(waitSeconds))
		resp, err := server.Client().Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		var doc map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
		return resp, doc
	}
	// post posts body, prepared to wait for its outcome as long as a busy
	// machine may take: a call that completes answers with its outcome.
	post := func(t *testing.T, body toolCall) (*http.Response, map[string]any) {
		t.Helper()
		return postWaiting(t, body, 60)
	}
	refund := toolCall{RunID: "run-1", Step: 3, Tool: "refund", Args: json.RawMessage(`{"order": 8842, "amount": "42.00"}`)}

	t.Run("CreatedThenReplayed", func(t *testing.T) {
		t.Parallel()
		resp, doc := post(t, refund)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%v", doc)
		require.Empty(t, resp.Header.Get(httpstatus.ReplayedHeader))
		require.Equal(t, "succeeded", doc["status"])
		require.NotContains(t, doc, "replayed")

		resp, doc = post(t, refund)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", doc)
		require.Equal(t, "true", resp.Header.Get(httpstatus.ReplayedHeader))
		require.Equal(t, true, doc["replayed"])

		// The same step asked again with other arguments.
		replanned := refund
		replanned.Args = json.RawMessage(`{"order": 8842, "amount": "4200.00"}`)
		resp, doc = post(t, replanned)
		require.Equal(t, http.StatusConflict, resp.StatusCode, "%v", doc)
		require.Equal(t, "conflict", doc["status"])
	})

	t.Run("PermanentFailure", func(t *testing.T) {
		t.Parallel()
		charge := toolCall{RunID: "run-2", Step: 1, Tool: "charge", Args: json.RawMessage(`{"amount": "10.00"}`)}
		resp, doc := post(t, charge)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", doc)
		require.Equal(t, "failed", doc["status"])
		require.NotContains(t, doc, "replayed")
		resp, doc = post(t, charge)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", doc)
		require.Equal(t, true, doc["replayed"])
	})

	t.Run("InProgress", func(t *testing.T) {
		t.Parallel()
		// The slow provider answers only once the test ends: however long
		// the caller waits, the call is in progress.
		resp, doc := postWaiting(t, toolCall{RunID: "run-3", Step: 1, Tool: "slow", Args: json.RawMessage(`{}`)}, 1)
		require.Equal(t, http.StatusAccepted, resp.StatusCode, "%v", doc)
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		require.Equal(t, "in_progress", doc["status"])
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name   string
			body   toolCall
			code   int
			status string
		}{
			{"NotCanonical", toolCall{RunID: "run-4", Step: 1, Tool: "refund", Args: json.RawMessage(`{"a": 1, "a": 2}`)}, http.StatusUnprocessableEntity, "invalid_arguments"},
			{"UnknownTool", toolCall{RunID: "run-4", Step: 2, Tool: "refnud", Args: json.RawMessage(`{}`)}, http.StatusUnprocessableEntity, "unknown_tool"},
			{"InvalidCall", toolCall{Step: 3, Tool: "refund", Args: json.RawMessage(`{}`)}, http.StatusBadRequest, "invalid_call"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				resp, doc := post(t, tt.body)
				require.Equal(t, tt.code, resp.StatusCode, "%v", doc)
				require.Equal(t, tt.status, doc["status"])
			})
		}
	})
}
