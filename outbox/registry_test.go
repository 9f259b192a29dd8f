package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/outbox"
)

func TestRegistryDispatchedLeavesInlineOnlyTools(t *testing.T) {
	t.Parallel()
	provider := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
	require.NoError(t, registry.RegisterWithOpts("http_request", provider, outbox.IdempotentByKey, &outbox.ToolOpts{InlineOnly: true}))

	require.ElementsMatch(t, []string{"refund", "email", "http_request"}, registry.Names())
	require.ElementsMatch(t, []string{"refund", "email"}, registry.Dispatched())
	var none *outbox.Registry
	require.Nil(t, none.Dispatched())
}
