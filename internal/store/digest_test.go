package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDigests(t *testing.T) {
	t.Parallel()

	key := "k1_" + strings.Repeat("0123456789abcdef", 4)
	require.Len(t, keyDigest(key), digestSize)
	require.Equal(t, key, keyText(keyDigest(key)))

	scope := strings.Repeat("fedcba9876543210", 4)
	require.Equal(t, scope, hexText(hexDigest(scope)))
	require.Empty(t, hexText(hexDigest("")), "an empty fingerprint is not stored")

	for _, malformed := range []string{"", "k1_", "k2_" + key[3:], key[:len(key)-1], key + "0", "k1_" + strings.Repeat("zz", 32), "K1_" + key[3:]} {
		require.Nil(t, keyDigest(malformed), "%q matches no stored key", malformed)
	}
}
