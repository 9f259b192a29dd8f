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
	// position in the run, and the arguments, normalised.
	refund, err := outbox.DeriveKey(outbox.Call{
		RunID: runID, Step: 1, Tool: "refund",
		Args: json.RawMessage(`{"order": 8842, "amount": "42.00"}`),
	})
	require.NoError(t, err)
	q := regexp.QuoteMeta
	exampletest.RequireLines(t, out,
		`^── the runtime starts \(process 1\)$`,
		`^assistant +refund \{"order": 8842, "amount": "42.00"\}`,
		`^  runtime +step 1 +normalised \{"amount":"42.00","order":8842\} +key `+q(string(refund[:15]))+`…: created$`,
		`^  payments +refunded 42.00 on order 8842 as re_0001`,
		`^  crash +the runtime's process dies`,
		`^── the runtime restarts \(process 2\)$`,
		// The re-asked turn: the model re-plans the step, a conflict.
		`^assistant +refund \{"amount": "40.00", "order": 8842\}`,
		`^  runtime +step 1 +normalised \{"amount":"40.00","order":8842\}: conflict; nothing runs$`,
		`^tool +call_\w+ +\{"status":"conflict","key":"k1_\w+","existing_key":"`+q(string(refund))+`","existing_tool":"refund"`,
		// The original asked again, spelled otherwise, reaches the refund of
		// the crashed process.
		`^assistant +refund \{"amount":42,"order":8.842e3\}`,
		`^  runtime +the same tool and arguments as step 1`,
		`^  runtime +step 1 +normalised \{"amount":"42.00","order":8842\} +key `+q(string(refund[:15]))+`…: found `,
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

// TestNormalise checks that every spelling of one intention decodes to one
// value, and that what does not decode is reported as invalid arguments,
// with its path.
func TestNormalise(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		tool, arguments string
		want            any
		path            string
	}{
		{"refund", `{"order": 8842, "amount": "42.00"}`, refundArgs{Order: 8842, Amount: "42.00"}, ""},
		{"refund", `{"amount":42,"order":8.842e3}`, refundArgs{Order: 8842, Amount: "42.00"}, ""},
		{"refund", `{"amount":"42","order":"8842"}`, refundArgs{Order: 8842, Amount: "42.00"}, ""},
		{"refund", `{"amount":4.2e1,"order":8842.0}`, refundArgs{Order: 8842, Amount: "42.00"}, ""},
		{"refund", `{"amount":42.005,"order":8842}`, nil, "$.amount"},
		{"refund", `{"amount":"forty-two","order":8842}`, nil, "$.amount"},
		{"refund", `{"amount":-1,"order":8842}`, nil, "$.amount"},
		{"refund", `{"amount":"42.00","order":8842.5}`, nil, "$.order"},
		{"refund", `{"amount":"42.00","order":1e999}`, nil, "$.order"},
		{"refund", `{"amount":"42.00"}`, nil, "$"},
		{"refund", `{"amount":"42.00","order":8842,"note":"x"}`, nil, "$"},
		{"refund", `[8842, "42.00"]`, nil, "$"},
		{"refund", `{"amount":"42.00","order":8842} {}`, nil, "$"},
		{"send_email", `{"to":"a@example.com","subject":"s","body":"b"}`, sendEmailArgs{To: "a@example.com", Subject: "s", Body: "b"}, ""},
		{"send_email", `{"to":1,"subject":"s","body":"b"}`, nil, "$.to"},
		{"create_ticket", `{"order":8842,"title":"t"}`, createTicketArgs{Title: "t", Order: 8842}, ""},
	} {
		got, err := normalise(tt.tool, tt.arguments)
		if tt.path == "" {
			require.NoError(t, err, tt.arguments)
			require.Equal(t, tt.want, got, tt.arguments)
			continue
		}
		obs := outbox.ObservationFor(outbox.Result{}, err)
		require.Equal(t, outbox.ObservationInvalidArguments, obs.Status, tt.arguments)
		require.Equal(t, tt.path, obs.Path, tt.arguments)
	}
	_, err := normalise("refund_twice", `{}`)
	require.ErrorIs(t, err, outbox.ErrUnknownTool)
}
