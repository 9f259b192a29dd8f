package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/outbox"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()

	t.Run("NilStaysNil", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, outbox.RetryAfter(nil, time.Second))
	})

	t.Run("NoDelayReturnsErrItself", func(t *testing.T) {
		t.Parallel()
		cause := errors.New("busy")
		require.Equal(t, cause, outbox.RetryAfter(cause, 0))
	})

	t.Run("KeepsAmbiguityAndCause", func(t *testing.T) {
		t.Parallel()
		cause := errors.New("503")
		err := outbox.RetryAfter(outbox.Ambiguous(cause), 3*time.Second)
		var hinted *outbox.RetryAfterError
		require.ErrorAs(t, err, &hinted)
		require.Equal(t, 3*time.Second, hinted.RetryDelay())
		require.True(t, outbox.IsAmbiguous(err))
		require.ErrorIs(t, err, cause)
		require.Equal(t, "ambiguous: 503 (retry after 3s)", err.Error())
	})
}
