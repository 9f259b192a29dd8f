// Command refunds is a small service behind the Idempotency-Key middleware:
// POST /refunds submits a refund for a keyed payment API (an in-process fake
// that logs what it receives) in the request's own transaction, and a
// dispatcher delivers it with the refund's key in Idempotency-Key. POST
// /refunds/now calls the payment API in the request itself, passing it the
// request's key: a request abandoned mid-way runs again at the client's
// next request with the key, and the payment API answers it from its
// memory of the key.
//
//	go run ./examples/refunds
//
// Then, from another terminal (docs/http.md has every case):
//
//	curl -i -X POST localhost:8080/refunds -H 'Idempotency-Key: "r-1"' \
//		-H 'Account: acct_1' -d '{"order": 8842, "amount": "42.00"}'
//
// The service's log shows one refund at the payment API however often a
// request is retried. Stop it with Ctrl-C.
//
// The database is -db, else $PGONCE_DATABASE_URL, else $DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. The service
// makes the schema -schema (default pgonce_example_refunds), migrates it,
// and drops it when it stops unless -keep. It listens on -addr (default
// localhost:8080; port 0 picks a free port), and runs under pgonce's
// development preset (docs/examples.md), so that a POST /refunds/now
// abandoned mid-way is reconciled within seconds.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

func main() {
	dbURL := flag.String("db", exampledb.URL(), "PostgreSQL URL; default $PGONCE_DATABASE_URL, else $DATABASE_URL, else "+exampledb.URLDefault)
	addr := flag.String("addr", "localhost:8080", "listen address")
	schema := flag.String("schema", "pgonce_example_refunds", "the schema to make, use and drop")
	keep := flag.Bool("keep", false, "keep the schema when the service stops, to look at it with the pgonce command")
	flag.Parse()
	if err := run(*dbURL, *addr, *schema, *keep); err != nil {
		log.Fatal(err)
	}
}

func run(dbURL, addr, schema string, keep bool) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := exampledb.Open(ctx, dbURL, schema, "refunds")
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			db.Keep()
			log.Printf("kept schema %s; drop it with DROP SCHEMA %s CASCADE", schema, schema)
		}
		if closeErr := db.Close(ctx); err == nil {
			err = closeErr
		}
	}()
	pool := db.Pool

	payments, err := fakePaymentAPI()
	if err != nil {
		return err
	}
	provider, err := httpprovider.New(httpprovider.Config{URL: payments + "/v1/refunds", KeyRetention: 24 * time.Hour})
	if err != nil {
		return err
	}
	registry := outbox.NewRegistry()
	if err := provider.Register(registry, "refund"); err != nil {
		return err
	}
	// The keys of each route are claimed under a tool of their own, which
	// no dispatcher runs: POST /refunds's must not run twice, and POST
	// /refunds/now's passes the key to an API that deduplicates on it.
	if err := idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil); err != nil {
		return err
	}
	if err := idempotency.Register(registry, "refund_now_request", outbox.IdempotentByKey,
		&outbox.ToolOpts{KeyRetention: 24 * time.Hour}); err != nil {
		return err
	}
	// The development preset: an abandoned request is reconciled within
	// seconds.
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema:      schema,
		Registry:    registry,
		CallTimeout: outbox.CallTimeoutDevelopment,
		Lease:       outbox.LeaseDevelopment,
	})
	if err != nil {
		return err
	}
	// A real service returns the authenticated account here.
	accountOf := func(r *http.Request) (string, error) {
		if account := r.Header.Get("Account"); account != "" {
			return account, nil
		}
		return "", fmt.Errorf("no Account header")
	}
	m, err := idempotency.NewPgx(pool, client, idempotency.Config{KeyRequired: true, ScopeFunc: accountOf})
	if err != nil {
		return err
	}
	now, err := idempotency.NewPgx(nil, client, idempotency.Config{
		Mode:        idempotency.ModeLease,
		Tool:        "refund_now_request",
		KeyRequired: true,
		ScopeFunc:   accountOf,
	})
	if err != nil {
		return err
	}
	// The dispatcher also reconciles: a POST /refunds/now abandoned
	// mid-way goes back to pending once its lease expires.
	d, err := dispatcher.New(client, dispatcher.Config{
		MaintenanceInterval: dispatcher.MaintenanceIntervalDevelopment,
		Reconcile:           dispatcher.ReconcileConfig{Grace: reconcile.GraceDevelopment},
	})
	if err != nil {
		return err
	}
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		if err := d.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	// The dispatcher drains before the schema goes.
	defer func() { <-dispatched }()

	mux := http.NewServeMux()
	mux.Handle("POST /refunds", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx[pgx.Tx](r.Context())
		var req struct {
			Order  int    `json:"order"`
			Amount string `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Order == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"send {\"order\": <int>, \"amount\": \"<decimal>\"}"}`))
			return
		}
		res, err := client.SubmitTx(r.Context(), tx, outbox.Call{
			Tenant: r.Header.Get("Account"),
			Tool:   "refund",
			Key:    fmt.Sprintf("refund-order-%d", req.Order),
			Args:   map[string]any{"order": req.Order, "amount": req.Amount},
		})
		if err != nil {
			// A 5xx is rolled back and not stored: the same key runs again.
			http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = fmt.Fprintf(w, "{\"refund_key\":%q,\"created_at\":%q}\n", res.Key, time.Now().UTC().Format(time.RFC3339Nano))
	})))
	mux.Handle("POST /refunds/now", now.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The request's key, scoped by account: the same for every retry
		// of this request, never the same for two accounts.
		key, _ := idempotency.Key(r.Context())
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, payments+"/v1/refunds", r.Body)
		if err != nil {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		req.Header.Set("Idempotency-Key", string(key))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// A 5xx is not stored on this route: the same key runs again.
			http.Error(w, `{"error":"payment API unavailable"}`, http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			http.Error(w, `{"error":"payment API unavailable"}`, http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	})))
	mux.HandleFunc("GET /refunds/{key}", func(w http.ResponseWriter, r *http.Request) {
		res, err := client.Get(r.Context(), outbox.Key(r.PathValue("key")))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res.Observation())
	})
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = server.Shutdown(context.WithoutCancel(ctx))
	}()
	log.Printf("refunds on http://%s, payment API on %s", listener.Addr(), payments)
	if err := server.Serve(listener); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// fakePaymentAPI serves a payment API that logs each refund it receives,
// deduplicating on Idempotency-Key, and returns its URL.
func fakePaymentAPI() (string, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	seen := map[string][]byte{}
	requests := make(chan func(), 1)
	go func() {
		for f := range requests {
			f()
		}
	}()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		answer := make(chan []byte, 1)
		requests <- func() {
			if stored, ok := seen[key]; ok {
				answer <- stored
				return
			}
			stored := []byte(fmt.Sprintf(`{"id":"re_%d","status":"succeeded"}`, len(seen)+1))
			seen[key] = stored
			log.Printf("payment API: refund %q (Idempotency-Key %q)", body, key) //nolint:gosec // quoted
			answer <- stored
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(<-answer)
	})
	go func() { _ = http.Serve(listener, handler) }() //nolint:gosec // an example's loopback fake
	return "http://" + listener.Addr().String(), nil
}
