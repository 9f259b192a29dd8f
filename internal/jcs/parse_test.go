package jcs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCompareUTF16(t *testing.T) {
	t.Parallel()

	// U+FB33 is above every surrogate in code point order but below them in
	// UTF-16 order; U+1F602 is a surrogate pair.
	ordered := []string{"", "\n", "1", "A", "a", "aa", "\u00f6", "\u20ac", "\U0001F602", "\U0001F603", "\ufb33", "\uffff"}
	for i := range ordered {
		for j := range ordered {
			got := compareUTF16([]byte(ordered[i]), []byte(ordered[j]))
			switch {
			case i < j:
				require.Negative(t, got, "%q < %q", ordered[i], ordered[j])
			case i > j:
				require.Positive(t, got, "%q > %q", ordered[i], ordered[j])
			default:
				require.Zero(t, got)
			}
		}
	}
}
