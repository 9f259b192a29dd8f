package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExamplePermanentBody stores a payment API's own decline as the key's
// failure, byte for byte, and replays it to a duplicate.
func ExamplePermanentBody() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// The payment API's answer to a charge, say: a status and a body.
	api := func(json.RawMessage) (status int, body []byte) {
		return http.StatusPaymentRequired, []byte(`{"error": {"code": "card_declined"}}`)
	}
	charge := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		status, body := api(req.Args)
		switch {
		case status == http.StatusPaymentRequired:
			// Declined for good: the API's own body is the failure the
			// model sees, on this request and every duplicate.
			return nil, outbox.PermanentBody(body, fmt.Errorf("charge declined: %d", status))
		case status >= 500:
			return nil, errors.New("payment API unavailable") // retried
		}
		return body, nil
	})

	registry := outbox.NewRegistry()
	if err := registry.Register("charge", charge, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema:   schema,
		Registry: registry,
		// Permanent failures are logged as warnings; this example shows
		// none.
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}

	call := outbox.Call{RunID: "run_01J9Z", Step: 5, Tool: "charge", Args: map[string]any{"amount": "42.00"}}
	for range 2 {
		res, err := client.Do(ctx, call, nil)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s replayed=%t failure=%s last_error=%q\n", res.State, res.Replayed(), res.Failure, res.LastError)
	}

	// Output:
	// failed replayed=false failure={"error": {"code": "card_declined"}} last_error="permanent: charge declined: 402"
	// failed replayed=true failure={"error": {"code": "card_declined"}} last_error="permanent: charge declined: 402"
}
