package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// relay is a mail relay that takes no idempotency key, but whose log can be
// searched by Message-ID: a provider with a natural id.
type relay struct {
	sent map[string]string // queue id by Message-ID
	// dropNext drops the connection after the next message was taken.
	dropNext bool
}

// Call sends a message whose Message-ID is the call's natural id.
func (r *relay) Call(_ context.Context, req outbox.Request) (json.RawMessage, error) {
	r.sent[req.NaturalID] = fmt.Sprintf("q-%d", len(r.sent)+1)
	fmt.Printf("attempt %d: sent %s as %s\n", req.Attempt, req.NaturalID, r.sent[req.NaturalID])
	if r.dropNext {
		r.dropNext = false
		return nil, outbox.Ambiguous(errors.New("connection reset after DATA"))
	}
	return fmt.Appendf(nil, `{"queued_as":%q}`, r.sent[req.NaturalID]), nil
}

// Lookup searches the relay's log by Message-ID: read before write.
func (r *relay) Lookup(_ context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	queued, found := r.sent[req.NaturalID]
	fmt.Printf("attempt %d: looked %s up: found=%t\n", req.Attempt, req.NaturalID, found)
	if !found {
		return nil, false, nil
	}
	return fmt.Appendf(nil, `{"queued_as":%q}`, queued), true, nil
}

// ExampleLookuper registers a provider without keys, a mail relay, as
// LookupByNaturalID: each receipt's Message-ID is its call's natural id,
// and after an attempt whose outcome is unknown (the connection dropped
// after the relay took the message) the next attempt looks it up before it
// sends again, and records what it found. The receipt is sent once.
// examples/natural-id runs the same relay against crashes.
func ExampleLookuper() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	mail := &relay{sent: map[string]string{}, dropNext: true}
	registry := outbox.NewRegistry()
	if err := registry.Register("send_receipt", mail, outbox.LookupByNaturalID); err != nil {
		panic(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, Logger: quiet})
	if err != nil {
		panic(err)
	}
	call := outbox.Call{
		Key:       "receipt:order-8842",
		Tool:      "send_receipt",
		Args:      map[string]any{"order": 8842, "to": "ana@example.com"},
		NaturalID: "<receipt-8842@shop.example>",
	}

	// Do runs the call inline; a dispatcher would do the same.
	res, err := client.Do(ctx, call, nil)
	fmt.Printf("first:  state=%s provider failed=%t\n", res.State, errors.Is(err, outbox.ErrProviderFailed))
	res, err = client.Do(ctx, call, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("again:  state=%s response=%s\n", res.State, res.Response)
	fmt.Println("messages sent:", len(mail.sent))

	// Output:
	// attempt 1: sent <receipt-8842@shop.example> as q-1
	// first:  state=pending provider failed=true
	// attempt 2: looked <receipt-8842@shop.example> up: found=true
	// again:  state=succeeded response={"queued_as":"q-1"}
	// messages sent: 1
}
