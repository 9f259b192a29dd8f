package httpprovider_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"

	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleNewLookup calls an API that takes no idempotency key but can be
// asked whether an action happened, by an id the caller chose: the call's
// natural id. After an attempt whose outcome is unknown, pgonce runs Lookup
// before any new call (read before write): a 2xx is the action found, its
// envelope stored as the response; a 404 is the action not found, and the
// call is made.
func ExampleNewLookup() {
	var (
		mu       sync.Mutex
		messages = map[string]string{} // body by Message-ID
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id := r.URL.Query().Get("message_id")
		switch r.Method {
		case http.MethodPost:
			body, _ := io.ReadAll(r.Body)
			messages[id] = string(body)
			w.WriteHeader(http.StatusAccepted)
		case http.MethodGet:
			body, found := messages[id]
			if !found {
				http.NotFound(w, r)
				return
			}
			_, _ = io.WriteString(w, body)
		}
	}))
	defer api.Close()

	byMessageID := func(req outbox.Request) (string, error) {
		return api.URL + "/v1/messages?message_id=" + url.QueryEscape(req.NaturalID), nil
	}
	p, err := httpprovider.NewLookup(httpprovider.Config{URLFunc: byMessageID}, httpprovider.LookupConfig{URLFunc: byMessageID})
	if err != nil {
		panic(err)
	}
	registry := outbox.NewRegistry()
	if err := p.Register(registry, "send_receipt"); err != nil { // LookupByNaturalID
		panic(err)
	}

	// The request a dispatcher makes after an attempt whose outcome is
	// unknown. (The API ignores the key it is sent.)
	ctx := context.Background()
	call := outbox.Call{
		Key:       "receipt:order-8842",
		Tool:      "send_receipt",
		Args:      map[string]any{"order": 8842},
		NaturalID: "<receipt-8842@shop.example>",
	}
	key, err := outbox.DeriveKey(call)
	if err != nil {
		panic(err)
	}
	args, err := outbox.Canonicalize(call.Args)
	if err != nil {
		panic(err)
	}
	req := outbox.Request{Key: key, Tool: call.Tool, NaturalID: call.NaturalID, Args: args, Attempt: 2}
	_, found, err := p.Lookup(ctx, req)
	if err != nil {
		panic(err)
	}
	fmt.Println("before sending, found:", found)
	if _, err := p.Call(ctx, req); err != nil {
		panic(err)
	}
	stored, found, err := p.Lookup(ctx, req)
	if err != nil {
		panic(err)
	}
	resp, err := httpprovider.Decode(stored)
	if err != nil {
		panic(err)
	}
	fmt.Println("after sending, found:", found, resp.Status, string(resp.Body))

	// Output:
	// before sending, found: false
	// after sending, found: true 200 {"order":8842}
}
