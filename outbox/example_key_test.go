package outbox_test

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/outbox"
)

// ExampleDeriveKey derives the key of a model's tool call from the run, the
// call's step and its canonical arguments. Asked again with its members in
// another order and its numbers spelled otherwise, the call derives the
// same key; an amount written as the number 42 instead of the string
// "42.00" is another value, so another key, and for the same step a
// conflict. Nothing the model wrote goes into a key but its arguments.
func ExampleDeriveKey() {
	call := outbox.Call{
		RunID: "run-8842", // the conversation's id
		Step:  1,          // the call's position in the run
		Tool:  "refund",
		Args:  json.RawMessage(`{"order": 8842, "amount": "42.00"}`),
	}
	key, err := outbox.DeriveKey(call)
	if err != nil {
		panic(err)
	}
	fmt.Println(key)

	again := call
	again.Args = json.RawMessage(`{"amount":"42.00","order":8.842e3}`)
	same, err := outbox.DeriveKey(again)
	if err != nil {
		panic(err)
	}
	fmt.Println("re-spelled, same key:", same == key)

	number := call
	number.Args = json.RawMessage(`{"order": 8842, "amount": 42}`)
	other, err := outbox.DeriveKey(number)
	if err != nil {
		panic(err)
	}
	fmt.Println(`42 for "42.00", same key:`, other == key)

	next := call
	next.Step = 2
	other, err = outbox.DeriveKey(next)
	if err != nil {
		panic(err)
	}
	fmt.Println("next step, same key:", other == key)

	// A number no float64 holds exactly is refused, not rounded: send big
	// ids as strings.
	big := call
	big.Args = json.RawMessage(`{"order": 9007199254740993, "amount": "42.00"}`)
	_, err = outbox.DeriveKey(big)
	fmt.Println("too precise refused:", errors.Is(err, outbox.ErrNotCanonical))

	// Output:
	// k1_51cd51794200cb783d239b37f1955b1faaaaad9b2a1e5e8c65b94a40d1890312
	// re-spelled, same key: true
	// 42 for "42.00", same key: false
	// next step, same key: false
	// too precise refused: true
}

// ExampleCanonicalize shows the RFC 8785 form the key hashes: members in
// order, no spaces, numbers in their shortest form, strings as written.
func ExampleCanonicalize() {
	canonical, err := outbox.Canonicalize(json.RawMessage(`{
		"order": 8.842e3,
		"amount": "42.00",
		"fee": 0.50,
		"note": "caf\u00e9"
	}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(canonical))

	_, err = outbox.Canonicalize(json.RawMessage(`{"order": 1, "order": 2}`))
	var notCanonical *outbox.NotCanonicalError
	if errors.As(err, &notCanonical) {
		fmt.Println("refused:", notCanonical.Path, notCanonical.Reason)
	}

	// Output:
	// {"amount":"42.00","fee":0.5,"note":"café","order":8842}
	// refused: $.order duplicate member name
}
