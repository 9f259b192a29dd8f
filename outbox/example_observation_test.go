package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleResult_Observation turns results into what an agent runtime puts in
// the model's context. The document's keys come in a fixed order, and the
// provider's response is embedded exactly as stored, whitespace included.
func ExampleResult_Observation() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	refund := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		var args struct {
			Order  int    `json:"order"`
			Amount string `json:"amount"`
		}
		if err := json.Unmarshal(req.Args, &args); err != nil {
			return nil, outbox.Permanent(err)
		}
		if args.Order == 9999 {
			// Stored as the key's failure and replayed, never retried.
			return nil, outbox.Permanent(errors.New("order already refunded"))
		}
		return json.RawMessage(`{"refund_id": "re_1", "amount": "` + args.Amount + `"}`), nil
	})

	registry := outbox.NewRegistry()
	if err := registry.Register("refund", refund, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	refund8842 := outbox.Call{
		RunID: "run_01J9Z",
		Step:  3,
		Tool:  "refund",
		Args:  map[string]any{"order": 8842, "amount": "42.00"},
	}
	refund9999 := outbox.Call{
		RunID: "run_01J9Z",
		Step:  4,
		Tool:  "refund",
		Args:  map[string]any{"order": 9999, "amount": "10.00"},
	}
	// The model asks for the first refund twice, then for one that fails.
	for _, call := range []outbox.Call{refund8842, refund8842, refund9999} {
		res, err := client.Do(ctx, call, nil)
		if err != nil {
			panic(err)
		}
		fmt.Println(string(res.Observation().JSON()))
	}

	// Output:
	// {"status":"succeeded","key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","response":{"refund_id": "re_1", "amount": "42.00"}}
	// {"status":"succeeded","key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","replayed":true,"response":{"refund_id": "re_1", "amount": "42.00"}}
	// {"status":"failed","key":"k1_2df0411b740feb8ce0018e596e7de89170082b235cce1c910a05a2fb6810b6d8","failure":{"error":"order already refunded"}}
}
