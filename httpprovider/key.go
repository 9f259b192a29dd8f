package httpprovider

import (
	"fmt"
	"strings"

	"github.com/pgonce/pgonce/outbox"
)

// TruncateMin is the shortest length [Truncate] accepts: the key's version
// prefix and 16 hex digits, 64 bits of the key's digest.
const TruncateMin = 19

// Truncate returns a [Config.KeyFunc] for a provider that limits keys to n
// bytes: the key's first n bytes. A pgonce key is "k1_" and the hex digits
// of a SHA-256 digest, so a prefix is as deterministic as the key and keeps
// 4·(n−3) bits of it; two actions share a truncated key with negligible
// likelihood down to [TruncateMin]. A key already short enough is sent
// whole. It panics for n below TruncateMin, a wiring mistake.
func Truncate(n int) func(outbox.Key) (string, error) {
	if n < TruncateMin {
		panic(fmt.Sprintf("httpprovider.Truncate: n must be at least %d, got %d", TruncateMin, n))
	}
	return func(key outbox.Key) (string, error) {
		s := string(key)
		if len(s) <= n {
			return s, nil
		}
		return s[:n], nil
	}
}

// HexOnly is a [Config.KeyFunc] for a provider that accepts only
// hexadecimal digits (or only letters and digits): the key without its
// version prefix, 64 lower-case hex digits.
func HexOnly(key outbox.Key) (string, error) {
	s := string(key)
	i := strings.IndexByte(s, '_')
	if i < 0 || i == len(s)-1 {
		return "", fmt.Errorf("key %q has no version prefix", s)
	}
	return s[i+1:], nil
}
