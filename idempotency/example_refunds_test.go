package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleNewPgx is a refunds service: POST /refunds runs behind the
// middleware, and its handler submits the refund for a keyed payment API in
// the request's own transaction, so the stored response and the queued
// refund commit together. A dispatcher then calls the payment API with the
// refund's key in Idempotency-Key. A retry of the request with the same key
// is answered from the store; the payment API sees one refund.
func ExampleNewPgx() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// The downstream payment API.
	payments := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("payment API: %s %s\n", r.URL.Path, body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id": "re_1", "status": "succeeded"}`))
	}))
	defer payments.Close()

	provider, err := httpprovider.New(httpprovider.Config{URL: payments.URL + "/v1/refunds", KeyRetention: 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	registry := outbox.NewRegistry()
	if err := provider.Register(registry, "refund"); err != nil {
		panic(err)
	}
	// The middleware's keys are claimed under a tool of their own.
	if err := idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil); err != nil {
		panic(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, Logger: quiet})
	if err != nil {
		panic(err)
	}
	m, err := idempotency.NewPgx(pool, client, idempotency.Config{
		KeyRequired: true,
		// A real service returns the authenticated account.
		ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("Account"), nil },
	})
	if err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /refunds", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx[pgx.Tx](r.Context())
		var req struct {
			Order  int    `json:"order"`
			Amount string `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, `{"error":"bad body"}`, http.StatusBadRequest)
			return
		}
		res, err := client.SubmitTx(r.Context(), tx, outbox.Call{
			Tenant: r.Header.Get("Account"),
			Tool:   "refund",
			Key:    fmt.Sprintf("refund-order-%d", req.Order),
			Args:   map[string]any{"order": req.Order, "amount": req.Amount},
		})
		if err != nil {
			http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = fmt.Fprintf(w, `{"refund_key":%q,"state":%q}`, res.Key[:11], res.State)
	})))
	service := httptest.NewServer(mux)
	defer service.Close()

	post := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, service.URL+"/refunds", strings.NewReader(`{"order": 8842, "amount": "42.00"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("Account", "acct_1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader), body)
	}
	post()
	post() // the client retried: answered from the store

	d, err := dispatcher.New(client, dispatcher.Config{PollInterval: 50 * time.Millisecond, MaintenanceDisabled: true})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	key, err := outbox.DeriveKey(outbox.Call{Tenant: "acct_1", Tool: "refund", Key: "refund-order-8842", Args: map[string]any{"order": 8842, "amount": "42.00"}})
	if err != nil {
		panic(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	res, err := client.Wait(waitCtx, key)
	cancel()
	stop()
	if err != nil || <-done != nil {
		panic(err)
	}
	stored, err := httpprovider.Decode(res.Response)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.State, stored.Status, string(stored.Body))

	// Output:
	// 202 replayed="" {"refund_key":"k1_d1c3abdc","state":"pending"}
	// 202 replayed="true" {"refund_key":"k1_d1c3abdc","state":"pending"}
	// payment API: /v1/refunds {"amount":"42.00","order":8842}
	// succeeded 201 {"id": "re_1", "status": "succeeded"}
}
