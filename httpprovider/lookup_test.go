package httpprovider_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

func TestLookup(t *testing.T) {
	t.Parallel()
	found := map[string]string{"ord-1": `{"id": "re_1"}`}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("natural_id")
		switch {
		case id == "broken":
			w.WriteHeader(http.StatusInternalServerError)
		case found[id] != "":
			_, _ = w.Write([]byte(found[id]))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(server.Close)
	p, err := httpprovider.NewLookup(httpprovider.Config{URL: server.URL + "/v1/refunds"}, httpprovider.LookupConfig{
		URLFunc: func(req outbox.Request) (string, error) {
			return server.URL + "/v1/refunds?natural_id=" + req.NaturalID, nil
		},
	})
	require.NoError(t, err)

	resp, ok, err := p.Lookup(t.Context(), outbox.Request{NaturalID: "ord-1"})
	require.NoError(t, err)
	require.True(t, ok)
	decoded, err := httpprovider.Decode(resp)
	require.NoError(t, err)
	require.Equal(t, found["ord-1"], string(decoded.Body), "byte for byte")

	_, ok, err = p.Lookup(t.Context(), outbox.Request{NaturalID: "ord-2"})
	require.NoError(t, err)
	require.False(t, ok)

	_, _, err = p.Lookup(t.Context(), outbox.Request{NaturalID: "broken"})
	require.Error(t, err, "an unknown answer leaves the outcome unknown")
}

// TestLookupProviderReadsBeforeWriting registers a lookup provider by
// natural id: an abandoned key whose action the API has is recorded from
// the lookup, with no second request.
func TestLookupProviderReadsBeforeWriting(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testLookupProvider, testLookupProvider)
}

func testLookupProvider[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	fake := newFakeProvider(t)
	lookups := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, answer, _ := fake.answerOf(r.URL.Query().Get("key"))
		if status == 0 {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_, _ = w.Write(answer)
	}))
	t.Cleanup(lookups.Close)
	p, err := httpprovider.NewLookup(httpprovider.Config{URL: fake.server.URL + "/v1/refunds"}, httpprovider.LookupConfig{
		URLFunc: func(req outbox.Request) (string, error) { return lookups.URL + "/?key=" + string(req.Key), nil },
	})
	require.NoError(t, err)
	registry := outbox.NewRegistry()
	require.NoError(t, p.Register(registry, "refund"))
	schema := pgoncetest.Schema(t)
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry, Logger: quiet})

	calls := []outbox.Call{
		{RunID: "run-3", Step: 1, Tool: "refund", NaturalID: "ord-1", Args: map[string]any{"order": 1, "fault": faultDrop}},
		{RunID: "run-3", Step: 2, Tool: "refund", NaturalID: "ord-2", Args: map[string]any{"order": 2}},
	}
	keys := driver.SubmitKeys(t, client, calls)
	args, err := outbox.Canonicalize(calls[0].Args)
	require.NoError(t, err)
	_, err = p.Call(t.Context(), outbox.Request{Key: keys[0], Tool: "refund", Args: args, Attempt: 1})
	require.True(t, outbox.IsAmbiguous(err))
	pgoncetest.AbandonKeys(t, schema, time.Minute, keys...)

	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	_, err = rec.RunOnce(t.Context())
	require.NoError(t, err)
	d, err := dispatcher.New(client, dispatcher.Config{PollInterval: 20 * time.Millisecond, MaintenanceDisabled: true})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() { stop(); require.NoError(t, <-done) }()
	for i, key := range keys {
		waitCtx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		res, err := client.Wait(waitCtx, key)
		cancel()
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State, "call %d", i)
		require.Equal(t, 1, fake.effectsOf(string(key)), "call %d: one effect", i)
	}
	require.Len(t, fake.requestTimes(string(keys[0])), 1, "found by lookup: never sent again")
}
