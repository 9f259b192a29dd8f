package httpprovider_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleNew passes the key downstream: one attempt goes to a payment API
// with the call's key in Idempotency-Key, and the stored envelope (status,
// kept headers, body verbatim) is read back with Decode. Registered with
// Provider.Register, a dispatcher makes the calls.
func ExampleNew() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("API got %s %s, Idempotency-Key %s...\n", r.Method, body, r.Header.Get("Idempotency-Key")[:11])
		w.Header().Set("Request-Id", "req_1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id": "re_1", "amount": 42}`))
	}))
	defer api.Close()

	p, err := httpprovider.New(httpprovider.Config{URL: api.URL + "/v1/refunds", KeepHeaders: []string{"Request-Id"}})
	if err != nil {
		panic(err)
	}
	call := outbox.Call{RunID: "run-1", Step: 3, Tool: "refund", Args: map[string]any{"order": 8842, "amount": 42}}
	key, err := outbox.DeriveKey(call)
	if err != nil {
		panic(err)
	}
	args, err := outbox.Canonicalize(call.Args)
	if err != nil {
		panic(err)
	}
	stored, err := p.Call(context.Background(), outbox.Request{Key: key, Tool: "refund", Args: args, Attempt: 1})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(stored))
	resp, err := httpprovider.Decode(stored)
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status, resp.Header.Get("Request-Id"), string(resp.Body))

	// Output:
	// API got POST {"amount":42,"order":8842}, Idempotency-Key k1_7715954c...
	// {"status":201,"headers":{"Request-Id":["req_1"]},"body":{"id": "re_1", "amount": 42}}
	// 201 req_1 {"id": "re_1", "amount": 42}
}
