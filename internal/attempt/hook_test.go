package attempt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/store"
)

var (
	errPermanent = errors.New("permanent")
	errAmbiguous = errors.New("ambiguous")
)

func testClassify(err error) ErrorKind {
	switch {
	case errors.Is(err, errPermanent):
		return Permanent
	case errors.Is(err, errAmbiguous):
		return Ambiguous
	}
	return Retryable
}

// TestHookOutcomeAgreesWithRun checks that the outcome a hook is told is
// what the runner then makes of the same answer, for every delivery, error
// kind and attempt limit, calls and lookups alike.
func TestHookOutcomeAgreesWithRun(t *testing.T) {
	t.Parallel()
	kindName := func(out Outcome) string {
		switch {
		case out.Kind == Retry && out.Ambiguous:
			return OutcomeAmbiguous
		case out.Kind == Retry:
			return OutcomeRetry
		}
		return out.Kind.String()
	}
	for _, delivery := range []store.Delivery{store.DeliveryByKey, store.DeliveryByLookup, store.DeliveryAtMostOnce} {
		for _, answer := range []error{nil, errPermanent, errAmbiguous, errors.New("503")} {
			for _, maxAttempts := range []int{0, 2} {
				for _, lookup := range []bool{false, true} {
					if lookup && delivery != store.DeliveryByLookup {
						continue
					}
					name := fmt.Sprintf("Delivery%d/Err=%v/Max%d/Lookup=%t", delivery, answer, maxAttempts, lookup)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						var told []string
						tool := &Tool{
							Name:     "tool",
							Delivery: delivery,
							Call: func(context.Context, Request) (json.RawMessage, error) {
								if lookup {
									return json.RawMessage(`{}`), nil
								}
								return json.RawMessage(`{}`), answer
							},
							Lookup: func(context.Context, Request) (json.RawMessage, bool, error) {
								return json.RawMessage(`{}`), answer == nil, answer
							},
						}
						runner := New(nil, Config{
							CallTimeout: time.Second, Classify: testClassify,
							FailureBody:   func(error) json.RawMessage { return json.RawMessage(`{}`) },
							AmbiguousFunc: func(err error) error { return fmt.Errorf("%w: %w", errAmbiguous, err) },
						})
						tool.Wrap = func(ctx context.Context, op *Op, next func(ctx context.Context) CallResult) CallResult {
							res := next(ctx)
							if op.Lookup == lookup {
								told = append(told, op.Outcome(res, testClassify))
							}
							return res
						}
						out := runner.Run(t.Context(), Attempt{
							Tool:        tool,
							Request:     Request{Key: "k", Tool: "tool", Attempt: 2},
							Ambiguous:   lookup,
							MaxAttempts: maxAttempts,
						}, nil)
						require.Len(t, told, 1)
						if lookup && answer == nil {
							// Found: stored as the response.
							require.Equal(t, OutcomeFound, told[0])
							require.Equal(t, Succeeded, out.Kind)
							return
						}
						require.Equal(t, kindName(out), told[0])
					})
				}
			}
		}
	}
}
