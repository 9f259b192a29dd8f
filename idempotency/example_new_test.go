package idempotency_test

import (
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleNew honours Idempotency-Key on a service's own API with
// database/sql: the handler writes its order in the request's transaction,
// which also holds the key and, at commit, the stored response. A retry
// with the key is answered from the store, byte for byte, and writes
// nothing; the same key with another body is a 422.
func ExampleNew() {
	// A database and a migrated schema of the example's own (see
	// ExampleNewPgx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	db, schema := exampleDB.SQL, exampleDB.Schema
	orders := exampleDB.Table("orders")
	if _, err := db.Exec(`CREATE TABLE ` + orders + ` (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		panic(err)
	}

	registry := outbox.NewRegistry()
	// The middleware's keys are claimed under a tool of their own.
	if err := idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil); err != nil {
		panic(err)
	}
	client, err := outbox.New(db, outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	m, err := idempotency.New(db, client, idempotency.Config{KeyRequired: true})
	if err != nil {
		panic(err)
	}
	service := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx[*sql.Tx](r.Context())
		item, _ := io.ReadAll(r.Body)
		var id int64
		if err := tx.QueryRowContext(r.Context(), `INSERT INTO `+orders+` (item) VALUES ($1) RETURNING id`,
			string(item)).Scan(&id); err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable) // a 5xx is rolled back
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order_id":%d}`, id)
	})))
	defer service.Close()

	post := func(key, body string) {
		req, err := http.NewRequest(http.MethodPost, service.URL+"/orders", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer func() { _ = resp.Body.Close() }()
		answer, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			answer = []byte(resp.Header.Get("Content-Type"))
		}
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader), answer)
	}
	post(`"o-1"`, "a teapot")
	post(`"o-1"`, "a teapot") // the client retried
	post(`"o-1"`, "a kettle") // the same key for another request

	var count int
	if err := db.QueryRow(`SELECT count(*) FROM ` + orders).Scan(&count); err != nil {
		panic(err)
	}
	fmt.Println("orders:", count)

	// Output:
	// 201 replayed="" {"order_id":1}
	// 201 replayed="true" {"order_id":1}
	// 422 replayed="" application/problem+json
	// orders: 1
}
