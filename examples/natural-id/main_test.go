package main

import (
	"testing"

	"github.com/pgonce/pgonce/internal/exampledb/exampletest"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestMain(m *testing.M) { pgoncetest.Main(m) }

// TestNaturalID builds the program and runs it in a fresh schema of the
// test database: after each attempt whose outcome is unknown the relay is
// asked before anything is sent again, and each receipt is sent once.
func TestNaturalID(t *testing.T) {
	t.Parallel()
	bin := exampletest.Build(t)
	schema := pgoncetest.NewSchemaName(t)
	out := exampletest.Run(t, bin, "-schema", schema)
	t.Log(out)
	exampletest.RequireLines(t, out,
		`^Receipt for order 8842, Message-ID <receipt-8842@shop.example>$`,
		`^   attempt 1  send    the relay took the message as q-0001, and the connection dropped`,
		`^   attempt 2  lookup  in the relay's log as q-0001: recorded as the response, not sent again$`,
		`^   succeeded after 2 attempts: \{"message_id":"<receipt-8842@shop.example>","queued_as":"q-0001"\}$`,
		`^Receipt for order 8843, Message-ID <receipt-8843@shop.example>$`,
		`^   attempt 1  send    timed out before the relay took the message`,
		`^   attempt 2  lookup  not in the relay's log: it is sent$`,
		`^   attempt 2  send    the relay took the message as q-0002$`,
		`^   succeeded after 2 attempts: \{"message_id":"<receipt-8843@shop.example>","queued_as":"q-0002"\}$`,
		`^Receipt for order 8844, Message-ID <receipt-8844@shop.example>$`,
		`^   attempt 1  send    the relay took the message as q-0003; the worker dies`,
		`^   attempt 2  lookup  in the relay's log as q-0003: recorded as the response, not sent again$`,
		`^   succeeded after 2 attempts: \{"message_id":"<receipt-8844@shop.example>","queued_as":"q-0003"\}$`,
		`^The relay's log: 3 messages$`,
		`^   q-0001  <receipt-8842@shop.example>$`,
		`^   q-0002  <receipt-8843@shop.example>$`,
		`^   q-0003  <receipt-8844@shop.example>$`,
		`^Each receipt sent once\.$`,
	)
	exampletest.RequireSchemaGone(t, schema)
}
