package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleRegister is a route whose handler calls a payment API that
// deduplicates on Idempotency-Key, passing it the request's key
// ([idempotency.Key]). Its tool is registered [outbox.IdempotentByKey], so
// a request abandoned mid-way (the server killed) is not sent to review:
// once its lease expires the reconciler puts the key back to pending, and
// the client's next request with the key runs the handler again, which the
// payment API answers as before. Here the handler fails once with a 503
// after the API acted; the retry runs it again, with one refund at the API.
func ExampleRegister() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// The payment API: one refund per key, its answer replayed.
	refunds := map[string]string{}
	payments := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if _, ok := refunds[key]; !ok {
			refunds[key] = fmt.Sprintf(`{"id":"re_%d"}`, len(refunds)+1)
			fmt.Println("payment API: refund", len(refunds))
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, refunds[key])
	}))
	defer payments.Close()

	registry := outbox.NewRegistry()
	err := idempotency.Register(registry, "refund_request", outbox.IdempotentByKey,
		&outbox.ToolOpts{KeyRetention: 24 * time.Hour}) // how long the payment API remembers a key
	if err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	m, err := idempotency.NewPgx(nil, client, idempotency.Config{
		Mode: idempotency.ModeLease,
		Tool: "refund_request",
		// A real service returns the authenticated account.
		ScopeFunc: func(r *http.Request) (string, error) { return r.Header.Get("Account"), nil },
	})
	if err != nil {
		panic(err)
	}
	failOnce := true
	service := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := idempotency.Key(r.Context())
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, payments.URL+"/v1/refunds", r.Body)
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		req.Header.Set("Idempotency-Key", string(key))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway) // not stored: the same key runs again
			return
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		if failOnce {
			failOnce = false
			w.WriteHeader(http.StatusServiceUnavailable) // not stored either
			_, _ = io.WriteString(w, `{"error":"try again"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	})))
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
	post() // the handler fails after the API acted: nothing stored
	post() // runs again; the API answers from its memory of the key
	post() // answered from the store

	// Output:
	// payment API: refund 1
	// 503 replayed="" {"error":"try again"}
	// 201 replayed="" {"id":"re_1"}
	// 201 replayed="true" {"id":"re_1"}
}
