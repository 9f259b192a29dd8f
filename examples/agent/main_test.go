package main

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/exampledb/exampletest"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestMain(m *testing.M) { pgoncetest.Main(m) }

// TestAgent builds the program and runs it in a fresh schema of the test
// database: the first runtime process crashes after the payment API
// refunded, the restarted one recovers the refund under its key, and the
// APIs acted exactly once each.
func TestAgent(t *testing.T) {
	t.Parallel()
	bin := exampletest.Build(t)
	schema := pgoncetest.NewSchemaName(t)
	out := exampletest.Run(t, bin, "-schema", schema)
	t.Log(out)

	// The key comes from the conversation: the run id and the call's
	// position in the run, and the canonical arguments.
	refund, err := outbox.DeriveKey(outbox.Call{
		RunID: runID, Step: 1, Tool: "refund",
		Args: json.RawMessage(`{"order": 8842, "amount": "42.00"}`),
	})
	require.NoError(t, err)
	q := regexp.QuoteMeta
	exampletest.RequireLines(t, out,
		`^── the runtime starts \(process 1\)$`,
		`^assistant +refund \{"order": 8842, "amount": "42.00"\}`,
		`^  runtime +step 1 +canonical \{"amount":"42.00","order":8842\} +key `+q(string(refund[:15]))+`…: created$`,
		`^  payments +refunded 42.00 on order 8842 as re_0001`,
		`^  crash +the runtime's process dies`,
		`^── the runtime restarts \(process 2\)$`,
		// The re-asked turn: a number where the step holds a string.
		`^assistant +refund \{"amount": 42, "order": 8842\}`,
		`^tool +call_\w+ +\{"status":"conflict","key":"k1_\w+","existing_key":"`+q(string(refund))+`","existing_tool":"refund"`,
		// The corrected ask reaches the refund of the crashed process.
		`^assistant +refund \{"amount":"42.00","order":8.842e3\}`,
		`^  runtime +the same tool and canonical arguments as step 1`,
		`^tool +call_\w+ +\{"status":"succeeded","key":"`+q(string(refund))+`","replayed":true,"response":\{"refund_id":"re_0001"`,
		`^assistant +create_ticket `,
		`^tool +call_\w+ +\{"status":"in_progress"`,
		`^assistant +Done: I refunded 42.00 on order 8842 \(re_0001\), e-mailed .* \(msg_0001\), and opened ticket TK-0001`,
		`^payments +1 refund$`,
		`^mail +1 e-mail$`,
		`^tickets +1 ticket$`,
		`^Exactly one refund, one e-mail, one ticket\.$`,
	)
	exampletest.RequireSchemaGone(t, schema)
}
