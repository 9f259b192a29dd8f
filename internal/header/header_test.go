package header

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonical(t *testing.T) {
	t.Parallel()

	require.Equal(t, []string{}, Canonical(nil))
	require.Equal(t, []string{"Request-Id", "X-Trace"}, Canonical([]string{"request-id", "X-TRACE"}))
}

func TestKeep(t *testing.T) {
	t.Parallel()

	h := http.Header{"Request-Id": {"a", "b"}, "Other": {"c"}}
	kept := Keep(h, []string{"Request-Id", "Absent"})
	require.Equal(t, http.Header{"Request-Id": {"a", "b"}}, kept)

	kept["Request-Id"][0] = "changed"
	require.Equal(t, "a", h["Request-Id"][0], "Keep copies the values")
}

func TestInvalidName(t *testing.T) {
	t.Parallel()

	_, bad := InvalidName([]string{"Request-Id", "x-trace", "!#$%&'*+-.^_`|~"})
	require.False(t, bad)
	_, bad = InvalidName(nil)
	require.False(t, bad)
	for _, name := range []string{"", "Request Id", "Location:", "é", "a\x00"} {
		got, bad := InvalidName([]string{"Request-Id", name, "Other Bad"})
		require.True(t, bad, "%q", name)
		require.Equal(t, name, got, "the first invalid name")
	}
}
