package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"

	"github.com/pgonce/pgonce/outbox"
)

// The tools' own argument types. The runtime decodes a model's arguments
// into them and submits those, so that every spelling of one intention is
// one value, and so one key: an amount is a decimal string with two
// places whether the model wrote 42, 42.0 or "42.00", an order an integer
// whether it wrote 8842 or 8.842e3. Canonical JSON alone makes member order,
// spacing and number spelling irrelevant, but not a number a string.
type (
	refundArgs struct {
		Order  int64  `json:"order"`
		Amount string `json:"amount"`
	}
	sendEmailArgs struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
		Body    string `json:"body"`
	}
	createTicketArgs struct {
		Title string `json:"title"`
		Order int64  `json:"order"`
	}
)

// normalise decodes the arguments the model wrote for tool into the tool's
// type. What does not decode is the model's to correct: an error that
// outbox.ObservationFor reports as invalid_arguments, with the path.
func normalise(tool, arguments string) (any, error) {
	var members map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader([]byte(arguments)))
	if err := dec.Decode(&members); err != nil || dec.More() {
		return nil, invalid("$", "the arguments must be one JSON object")
	}
	want := map[string][]string{
		"refund":        {"order", "amount"},
		"send_email":    {"to", "subject", "body"},
		"create_ticket": {"title", "order"},
	}[tool]
	if want == nil {
		return nil, fmt.Errorf("%w: %q", outbox.ErrUnknownTool, tool)
	}
	if len(members) != len(want) {
		return nil, invalid("$", fmt.Sprintf("%s takes exactly %q", tool, want))
	}
	for _, name := range want {
		if _, ok := members[name]; !ok {
			return nil, invalid("$."+name, "missing")
		}
	}
	var err error
	text := func(name string) string {
		var s string
		if err == nil && json.Unmarshal(members[name], &s) != nil {
			err = invalid("$."+name, "must be a string")
		}
		return s
	}
	switch tool {
	case "refund":
		var args refundArgs
		if args.Order, err = integer(members, "order"); err != nil {
			return nil, err
		}
		args.Amount, err = money(members, "amount")
		return args, err
	case "send_email":
		args := sendEmailArgs{To: text("to"), Subject: text("subject"), Body: text("body")}
		return args, err
	default:
		args := createTicketArgs{Title: text("title")}
		if err != nil {
			return nil, err
		}
		args.Order, err = integer(members, "order")
		return args, err
	}
}

// integer reads an integer written as a JSON number in any spelling.
func integer(members map[string]json.RawMessage, name string) (int64, error) {
	n, ok := number(members[name])
	if !ok || !n.IsInt() || !n.Num().IsInt64() {
		return 0, invalid("$."+name, "must be an integer")
	}
	return n.Num().Int64(), nil
}

// money reads an amount written as a number or a decimal string, with at
// most two places, as a decimal string with two.
func money(members map[string]json.RawMessage, name string) (string, error) {
	raw := members[name]
	var s string
	if json.Unmarshal(raw, &s) == nil {
		raw = json.RawMessage(s)
	}
	n, ok := number(raw)
	if !ok || n.Sign() < 0 || !new(big.Rat).Mul(n, big.NewRat(100, 1)).IsInt() {
		return "", invalid("$."+name, "must be an amount with at most two decimal places")
	}
	return n.FloatString(2), nil
}

// number reads a JSON number literal exactly, if a float64 can hold its
// magnitude.
func number(raw json.RawMessage) (*big.Rat, bool) {
	var literal json.Number
	if json.Unmarshal(raw, &literal) != nil {
		return nil, false
	}
	if _, err := strconv.ParseFloat(literal.String(), 64); err != nil {
		return nil, false
	}
	return new(big.Rat).SetString(literal.String())
}

func invalid(path, reason string) error {
	return &outbox.NotCanonicalError{Path: path, Reason: reason}
}
