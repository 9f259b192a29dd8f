package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/exampledb/exampletest"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) { pgoncetest.Main(m) }

// TestRefunds builds the service, starts it in a fresh schema of the test
// database and runs the curl cases docs/http.md shows: a request and
// its retry, the same key with another body, no key, the refund's outcome,
// and a refund made in the request and its retry. The payment API logs one
// refund per refund however often the requests are retried, and the schema
// goes when the service stops.
func TestRefunds(t *testing.T) {
	t.Parallel()
	bin := exampletest.Build(t)
	schema := pgoncetest.NewSchemaName(t)
	cmd := exampletest.Command(t, bin, "-addr", "127.0.0.1:0", "-schema", schema)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	// The log: the service's address, then what the payment API received.
	var (
		mu  sync.Mutex
		log []string
	)
	listening := make(chan string, 1)
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		lines := bufio.NewScanner(stderr)
		address := regexp.MustCompile(`refunds on (http://\S+),`)
		for lines.Scan() {
			mu.Lock()
			log = append(log, lines.Text())
			mu.Unlock()
			if m := address.FindStringSubmatch(lines.Text()); m != nil {
				listening <- m[1]
			}
		}
	}()
	var base string
	select {
	case base = <-listening:
	case <-logged:
		require.NoError(t, cmd.Wait())
		t.Fatalf("the service ended before it listened:\n%s", strings.Join(log, "\n"))
	}

	post := func(path, key, body string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		req.Header.Set("Account", "acct_1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, b
	}

	// The first request, then its retry: the same bytes, marked replayed.
	first, firstBody := post("/refunds", `"r-1"`, `{"order": 8842, "amount": "42.00"}`)
	require.Equal(t, http.StatusAccepted, first.StatusCode, "%s", firstBody)
	retry, retryBody := post("/refunds", `"r-1"`, `{"order": 8842, "amount": "42.00"}`)
	require.Equal(t, http.StatusAccepted, retry.StatusCode)
	require.Equal(t, firstBody, retryBody)
	require.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"))

	// The same key with another body: 422 problem+json; no key: 400.
	other, otherBody := post("/refunds", `"r-1"`, `{"order": 8843, "amount": "42.00"}`)
	require.Equal(t, http.StatusUnprocessableEntity, other.StatusCode, "%s", otherBody)
	require.Equal(t, "application/problem+json", other.Header.Get("Content-Type"))
	none, noneBody := post("/refunds", "", `{"order": 8842, "amount": "42.00"}`)
	require.Equal(t, http.StatusBadRequest, none.StatusCode, "%s", noneBody)

	// The refund's outcome at the payment API, once the dispatcher
	// delivered it.
	var submitted struct {
		RefundKey string `json:"refund_key"`
	}
	require.NoError(t, json.Unmarshal(firstBody, &submitted))
	var outcome struct {
		Status   string          `json:"status"`
		Response json.RawMessage `json:"response"`
	}
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/refunds/"+submitted.RefundKey, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&outcome))
		return outcome.Status == "succeeded"
	}, time.Minute, 10*time.Millisecond)
	require.Contains(t, string(outcome.Response), `"status":"succeeded"`)

	// A refund made in the request, and its retry, answered from the store.
	now, nowBody := post("/refunds/now", `"n-1"`, `{"order": 8843, "amount": "10.00"}`)
	require.Equal(t, http.StatusCreated, now.StatusCode, "%s", nowBody)
	again, againBody := post("/refunds/now", `"n-1"`, `{"order": 8843, "amount": "10.00"}`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, nowBody, againBody)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))

	// Stopped, the service drops its schema; its log shows one refund per
	// refund at the payment API.
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	<-logged
	require.NoError(t, cmd.Wait(), "stdout:\n%s", &stdout)
	mu.Lock()
	defer mu.Unlock()
	var refunds []string
	for _, line := range log {
		if strings.Contains(line, "payment API: refund") {
			refunds = append(refunds, line)
		}
	}
	require.Len(t, refunds, 2, "one refund per refund:\n%s", strings.Join(log, "\n"))
	require.Contains(t, refunds[0], "8842")
	require.Contains(t, refunds[1], "8843")
	exampletest.RequireSchemaGone(t, schema)
}
