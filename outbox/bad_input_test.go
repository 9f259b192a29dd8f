package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestBadInput feeds every public entry point of outbox hostile input and
// checks, for each, that the documented typed error comes back, that no byte
// of any pgonce table changed, that the caller's transaction is as usable as
// it was before, and that the client keeps serving.
func TestBadInput(t *testing.T) {
	t.Parallel()
	eachHarness(t, testBadInput[pgx.Tx], testBadInput[*sql.Tx])
}

// txKind is the state of the caller's transaction that a bad-input row
// passes to SubmitTx.
type txKind int

const (
	txOpen txKind = iota
	txNil
	txCommitted
	txAborted
)

// Hostile values shared by the rows.
var (
	megabyte     = strings.Repeat("x", 1<<20)
	sqlInName    = `x'; DROP TABLE pgonce_key; --`
	deepNesting  = strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000)
	tenMegabytes = `"` + strings.Repeat("y", 10<<20) + `"`
)

// badCalls are calls that no entry point may accept, each with the error
// it must return.
func badCalls() []struct {
	name string
	call outbox.Call
	want error
} {
	base := func(mutate func(*outbox.Call)) outbox.Call {
		c := refundCall("run-bad")
		mutate(&c)
		return c
	}
	type row = struct {
		name string
		call outbox.Call
		want error
	}
	rows := []row{
		{"ToolEmpty", base(func(c *outbox.Call) { c.Tool = "" }), outbox.ErrInvalidCall},
		{"ToolNUL", base(func(c *outbox.Call) { c.Tool = "refund\x00" }), outbox.ErrInvalidCall},
		{"ToolInvalidUTF8", base(func(c *outbox.Call) { c.Tool = "refund\xff" }), outbox.ErrInvalidCall},
		{"ToolSQL", base(func(c *outbox.Call) { c.Tool = sqlInName }), outbox.ErrInvalidCall},
		{"ToolMegabyte", base(func(c *outbox.Call) { c.Tool = "r" + megabyte }), outbox.ErrInvalidCall},
		{"ToolUnregistered", base(func(c *outbox.Call) { c.Tool = "charge" }), outbox.ErrUnknownTool},
		{"RunIDEmpty", base(func(c *outbox.Call) { c.RunID = "" }), outbox.ErrInvalidCall},
		{"StepNegative", base(func(c *outbox.Call) { c.Step = -1 }), outbox.ErrInvalidCall},
		{"StepMinInt64", base(func(c *outbox.Call) { c.Step = math.MinInt64 }), outbox.ErrInvalidCall},
		{"ArgsTenMegabytes", base(func(c *outbox.Call) { c.Args = json.RawMessage(tenMegabytes) }), outbox.ErrNotCanonical},
		{"ArgsDeepNesting", base(func(c *outbox.Call) { c.Args = json.RawMessage(deepNesting) }), outbox.ErrNotCanonical},
		{"ArgsTwoPow53Plus1", base(func(c *outbox.Call) { c.Args = json.RawMessage(`{"id":9007199254740993}`) }), outbox.ErrNotCanonical},
		{"Args1e400", base(func(c *outbox.Call) { c.Args = json.RawMessage(`{"amount":1e400}`) }), outbox.ErrNotCanonical},
		{"ArgsDuplicateMembers", base(func(c *outbox.Call) { c.Args = json.RawMessage(`{"a":1,"a":1}`) }), outbox.ErrNotCanonical},
		{"ArgsInvalidUTF8", base(func(c *outbox.Call) { c.Args = json.RawMessage("{\"s\":\"\xff\"}") }), outbox.ErrNotCanonical},
		{"ArgsRawNUL", base(func(c *outbox.Call) { c.Args = json.RawMessage("{\"s\":\"\x00\"}") }), outbox.ErrNotCanonical},
		{"ArgsNotJSON", base(func(c *outbox.Call) { c.Args = json.RawMessage(`{"a":1`) }), outbox.ErrNotCanonical},
		{"ArgsTwoValues", base(func(c *outbox.Call) { c.Args = json.RawMessage(`1 2`) }), outbox.ErrNotCanonical},
		{"ArgsNaN", base(func(c *outbox.Call) { c.Args = map[string]any{"n": math.NaN()} }), outbox.ErrNotCanonical},
		{"ArgsUnmarshalable", base(func(c *outbox.Call) { c.Args = map[string]any{"ch": make(chan int)} }), outbox.ErrNotCanonical},
	}
	for _, field := range []struct {
		name string
		set  func(*outbox.Call, string)
	}{
		{"Tenant", func(c *outbox.Call, s string) { c.Tenant = s }},
		{"RunID", func(c *outbox.Call, s string) { c.RunID = s }},
		{"Key", func(c *outbox.Call, s string) { c.Key = s }},
		{"NaturalID", func(c *outbox.Call, s string) { c.NaturalID = s }},
	} {
		for _, value := range []struct{ name, value string }{
			{"NUL", "a\x00b"},
			{"OnlyNUL", "\x00"},
			{"InvalidUTF8", "a\xffb"},
			{"Surrogate", "\xed\xa0\x80"},
			{"Megabyte", megabyte},
		} {
			rows = append(rows, row{field.name + value.name, base(func(c *outbox.Call) { field.set(c, value.value) }), outbox.ErrInvalidCall})
		}
	}
	return rows
}

// badKeys are keys that Get, Wait, Inspect and Resolve must refuse unread.
var badKeys = []struct{ name, key string }{
	{"Empty", ""},
	{"PrefixOnly", "k1_"},
	{"Short", "k1_" + strings.Repeat("a", 63)},
	{"Long", "k1_" + strings.Repeat("a", 65)},
	{"UpperCaseHex", "k1_" + strings.Repeat("A", 64)},
	{"UnknownVersion", "k2_" + strings.Repeat("a", 64)},
	{"NUL", "k1_" + strings.Repeat("a", 63) + "\x00"},
	{"InvalidUTF8", "k1_" + strings.Repeat("a", 63) + "\xff"},
	{"SQL", "k1_" + (sqlInName + strings.Repeat("a", 64))[:64]},
	{"Megabyte", "k1_" + megabyte},
}

func testBadInput[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	schema := pgoncetest.Schema(t)
	provider := &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
	client := h.newClient(t, outbox.Config{Schema: schema, Registry: registry})

	// Fixtures: a pending, a succeeded and a needs-review key.
	pending, err := client.Submit(t.Context(), refundCall("run-pending"))
	require.NoError(t, err)
	succeeded, err := client.Do(t.Context(), refundCall("run-succeeded"), nil)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, succeeded.State)
	needsReview := needsReviewKey(t, client, schema, refundCall("run-review"))
	calls := provider.calls.Load()

	type row struct {
		name string
		// run calls the entry point; tx is the caller's transaction, for
		// SubmitTx.
		run  func(ctx context.Context, tx TTx) error
		tx   txKind
		want error
		// cancelled runs the entry point under a cancelled context.
		cancelled bool
	}
	var rows []row
	for _, bad := range badCalls() {
		rows = append(rows,
			row{name: "Submit" + bad.name, want: bad.want, run: func(ctx context.Context, _ TTx) error {
				_, err := client.Submit(ctx, bad.call)
				return err
			}},
			row{name: "SubmitTx" + bad.name, want: bad.want, run: func(ctx context.Context, tx TTx) error {
				_, err := client.SubmitTx(ctx, tx, bad.call)
				return err
			}},
			row{name: "Do" + bad.name, want: bad.want, run: func(ctx context.Context, _ TTx) error {
				_, err := client.Do(ctx, bad.call, nil)
				return err
			}},
		)
	}
	for _, bad := range badKeys {
		key := outbox.Key(bad.key)
		rows = append(rows,
			row{name: "GetKey" + bad.name, want: outbox.ErrInvalidKey, run: func(ctx context.Context, _ TTx) error {
				_, err := client.Get(ctx, key)
				return err
			}},
			row{name: "WaitKey" + bad.name, want: outbox.ErrInvalidKey, run: func(ctx context.Context, _ TTx) error {
				_, err := client.Wait(ctx, key)
				return err
			}},
			row{name: "InspectKey" + bad.name, want: outbox.ErrInvalidKey, run: func(ctx context.Context, _ TTx) error {
				_, err := client.Inspect(ctx, key)
				return err
			}},
			row{name: "ResolveKey" + bad.name, want: outbox.ErrInvalidKey, run: func(ctx context.Context, _ TTx) error {
				_, err := client.Resolve(ctx, key, outbox.Resolution{Action: outbox.ResolveRetry, By: "ops", Reason: "checked"})
				return err
			}},
		)
	}
	resolve := func(key outbox.Key, resolution outbox.Resolution) func(context.Context, TTx) error {
		return func(ctx context.Context, _ TTx) error {
			_, err := client.Resolve(ctx, key, resolution)
			return err
		}
	}
	ok := func(r outbox.Resolution) outbox.Resolution {
		r.By, r.Reason = cmpOr(r.By, "ops"), cmpOr(r.Reason, "checked the provider")
		return r
	}
	for _, bad := range []struct {
		name       string
		resolution outbox.Resolution
	}{
		{"ActionEmpty", ok(outbox.Resolution{})},
		{"ActionUnknown", ok(outbox.Resolution{Action: "delete"})},
		{"ActionSQL", ok(outbox.Resolution{Action: outbox.ResolutionAction(sqlInName)})},
		{"ByEmpty", outbox.Resolution{Action: outbox.ResolveRetry, By: " ", Reason: "r"}},
		{"ReasonEmpty", outbox.Resolution{Action: outbox.ResolveRetry, By: "ops"}},
		{"ByNUL", ok(outbox.Resolution{Action: outbox.ResolveRetry, By: "ops\x00"})},
		{"ReasonNUL", ok(outbox.Resolution{Action: outbox.ResolveRetry, Reason: "\x00"})},
		{"ByInvalidUTF8", ok(outbox.Resolution{Action: outbox.ResolveRetry, By: "\xffops"})},
		{"ReasonInvalidUTF8", ok(outbox.Resolution{Action: outbox.ResolveRetry, Reason: "r\xc3"})},
		{"ByMegabyte", ok(outbox.Resolution{Action: outbox.ResolveRetry, By: megabyte})},
		{"ReasonMegabyte", ok(outbox.Resolution{Action: outbox.ResolveRetry, Reason: megabyte})},
		{"SucceededWithoutResponse", ok(outbox.Resolution{Action: outbox.ResolveSucceeded})},
		{"SucceededResponseNotJSON", ok(outbox.Resolution{Action: outbox.ResolveSucceeded, Response: json.RawMessage(`{"a":`)})},
		{"SucceededWithFailure", ok(outbox.Resolution{Action: outbox.ResolveSucceeded, Response: json.RawMessage(`{}`), Failure: json.RawMessage(`{}`)})},
		{"FailedFailureNotJSON", ok(outbox.Resolution{Action: outbox.ResolveFailed, Failure: json.RawMessage("\x00")})},
		{"FailedWithResponse", ok(outbox.Resolution{Action: outbox.ResolveFailed, Failure: json.RawMessage(`{}`), Response: json.RawMessage(`{}`)})},
		{"RetryWithResponse", ok(outbox.Resolution{Action: outbox.ResolveRetry, Response: json.RawMessage(`{}`)})},
	} {
		rows = append(rows, row{name: "Resolve" + bad.name, want: outbox.ErrInvalidResolution, run: resolve(needsReview, bad.resolution)})
	}
	retry := outbox.Resolution{Action: outbox.ResolveRetry, By: "ops", Reason: "checked"}
	unknown := mustKey(t, refundCall("run-never-submitted"))
	rows = append(rows,
		row{name: "ResolvePendingKey", want: outbox.ErrNotNeedsReview, run: resolve(pending.Key, retry)},
		row{name: "ResolveSucceededKey", want: outbox.ErrNotNeedsReview, run: resolve(succeeded.Key, retry)},
		row{name: "ResolveUnknownKey", want: outbox.ErrNotFound, run: resolve(unknown, retry)},
		row{name: "GetUnknownKey", want: outbox.ErrNotFound, run: func(ctx context.Context, _ TTx) error {
			_, err := client.Get(ctx, unknown)
			return err
		}},
		row{name: "WaitUnknownKey", want: outbox.ErrNotFound, run: func(ctx context.Context, _ TTx) error {
			_, err := client.Wait(ctx, unknown)
			return err
		}},
		row{name: "PruneHugeBatchSize", want: nil, run: func(ctx context.Context, _ TTx) error {
			_, err := client.Prune(ctx, &outbox.PruneOpts{BatchSize: math.MaxInt32 + 1})
			return err
		}},
		row{name: "PruneNegativeBatchSize", want: nil, run: func(ctx context.Context, _ TTx) error {
			_, err := client.Prune(ctx, &outbox.PruneOpts{BatchSize: -1})
			return err
		}},
	)

	// The caller's transaction in every state SubmitTx may be handed.
	submitTx := func(ctx context.Context, tx TTx) error {
		_, err := client.SubmitTx(ctx, tx, refundCall("run-tx"))
		return err
	}
	rows = append(rows,
		row{name: "SubmitTxNilTx", tx: txNil, want: outbox.ErrInvalidTx, run: submitTx},
		row{name: "SubmitTxCommittedTx", tx: txCommitted, want: outbox.ErrTxDone, run: submitTx},
		row{name: "SubmitTxAbortedTx", tx: txAborted, want: outbox.ErrTxAborted, run: submitTx},
	)

	// A cancelled context at every entry point, with otherwise good input.
	for _, entry := range []struct {
		name string
		run  func(ctx context.Context, tx TTx) error
	}{
		{"Submit", func(ctx context.Context, _ TTx) error {
			_, err := client.Submit(ctx, refundCall("run-cancelled"))
			return err
		}},
		{"SubmitTx", func(ctx context.Context, tx TTx) error {
			_, err := client.SubmitTx(ctx, tx, refundCall("run-cancelled"))
			return err
		}},
		{"Do", func(ctx context.Context, _ TTx) error {
			_, err := client.Do(ctx, refundCall("run-cancelled"), nil)
			return err
		}},
		{"Get", func(ctx context.Context, _ TTx) error {
			_, err := client.Get(ctx, pending.Key)
			return err
		}},
		{"Wait", func(ctx context.Context, _ TTx) error {
			_, err := client.Wait(ctx, pending.Key)
			return err
		}},
		{"Resolve", resolve(needsReview, retry)},
		{"Prune", func(ctx context.Context, _ TTx) error {
			_, err := client.Prune(ctx, nil)
			return err
		}},
	} {
		rows = append(rows, row{name: entry.name + "CancelledContext", cancelled: true, want: context.Canceled, run: entry.run})
	}

	// The rows share one schema, whose digest each compares before and
	// after, so they run one after another rather than in parallel.
	for i, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			tx := h.begin(t, nil)
			arg := tx
			switch tt.tx {
			case txNil:
				var zero TTx
				arg = zero
			case txCommitted:
				require.NoError(t, h.commit(tx))
			case txAborted:
				require.Error(t, h.exec(tx, "SELECT 1/0"))
			case txOpen:
			}
			ctx := t.Context()
			if tt.cancelled {
				cancelled, cancel := context.WithCancel(ctx)
				cancel()
				ctx = cancelled
			}
			before := tableHashes(t, schema)

			err := tt.run(ctx, arg)
			if tt.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.want)
			}
			require.Equal(t, before, tableHashes(t, schema), "a refused request changed a table")

			// The caller's transaction is as usable as it was.
			switch tt.tx {
			case txOpen, txNil:
				require.NoError(t, h.exec(tx, "SELECT 1"))
				require.NoError(t, h.commit(tx))
			case txAborted:
				require.NoError(t, h.rollback(tx))
			case txCommitted:
			}
			require.Equal(t, before, tableHashes(t, schema), "the caller's transaction wrote something")

			// The client keeps serving; SQL in a value is only a value.
			res, err := client.Submit(t.Context(), refundCall(fmt.Sprintf("%s-%d", sqlInName, i)))
			require.NoError(t, err)
			require.True(t, res.Created)
		})
	}
	require.Equal(t, calls, provider.calls.Load(), "a refused request ran the provider")
	keys, _ := rowCounts(t, schema)
	require.Equal(t, 3+len(rows), keys)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// lookingUpProvider is a countingProvider that can also be asked whether
// an action happened.
type lookingUpProvider struct{ countingProvider }

func (p *lookingUpProvider) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	return nil, false, nil
}

// TestLookupToolRefusesCallWithoutNaturalID: a tool registered
// LookupByNaturalID settles an uncertain attempt by its natural id, so a
// call without one is refused before anything is written.
func TestLookupToolRefusesCallWithoutNaturalID(t *testing.T) {
	t.Parallel()
	eachHarness(t, testLookupToolRefusesCallWithoutNaturalID[pgx.Tx], testLookupToolRefusesCallWithoutNaturalID[*sql.Tx])
}

func testLookupToolRefusesCallWithoutNaturalID[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()
	schema := pgoncetest.Schema(t)
	provider := &lookingUpProvider{countingProvider{response: json.RawMessage(`{"transfer_id":"tr_1"}`)}}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("transfer", provider, outbox.LookupByNaturalID))
	client := h.newClient(t, outbox.Config{Schema: schema, Registry: registry})
	call := outbox.Call{RunID: "run-no-natural-id", Step: 1, Tool: "transfer", Args: map[string]any{"amount": 10}}

	for _, entry := range []struct {
		name string
		run  func(ctx context.Context, tx TTx) error
	}{
		{"Submit", func(ctx context.Context, _ TTx) error {
			_, err := client.Submit(ctx, call)
			return err
		}},
		{"SubmitTx", func(ctx context.Context, tx TTx) error {
			_, err := client.SubmitTx(ctx, tx, call)
			return err
		}},
		{"Do", func(ctx context.Context, _ TTx) error {
			_, err := client.Do(ctx, call, nil)
			return err
		}},
	} {
		t.Run(entry.name, func(t *testing.T) {
			before := tableHashes(t, schema)
			tx := h.begin(t, nil)
			err := entry.run(t.Context(), tx)
			require.ErrorIs(t, err, outbox.ErrInvalidCall)
			var invalid *outbox.InvalidCallError
			require.ErrorAs(t, err, &invalid)
			require.Equal(t, "NaturalID", invalid.Field)
			// The caller's transaction is untouched, and nothing was
			// written or called.
			require.NoError(t, h.exec(tx, "SELECT 1"))
			require.NoError(t, h.commit(tx))
			require.Equal(t, before, tableHashes(t, schema), "a refused call changed a table")
			require.Zero(t, provider.calls.Load())
		})
	}

	// With a natural id, the same call is accepted.
	call.NaturalID = "tr-run-no-natural-id"
	res, err := client.Submit(t.Context(), call)
	require.NoError(t, err)
	require.True(t, res.Created)
}
