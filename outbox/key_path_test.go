package outbox

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// keyspecPathSegment is KEYSPEC.md's rule for a member name in a path
// ("Errors", "Paths"), written from the text alone: ".name" for an ASCII
// identifier, else the name quoted in brackets.
func keyspecPathSegment(name string) string {
	identifier := name != ""
	for i := 0; i < len(name) && identifier; i++ {
		c := name[i]
		identifier = c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
	}
	if identifier {
		return "." + name
	}
	return "[" + keyspecQuote(name) + "]"
}

// keyspecQuote is KEYSPEC.md's quoting of a member name, written from the
// text alone, without strconv or unicode/utf8.
func keyspecQuote(name string) string {
	b := []byte{'"'}
	hexDigits := func(v rune, width int) {
		for shift := 4 * (width - 1); shift >= 0; shift -= 4 {
			b = append(b, "0123456789abcdef"[v>>shift&0xf])
		}
	}
	for i := 0; i < len(name); {
		r, size := keyspecDecode(name[i:])
		if size == 0 {
			b = append(b, `\x`...)
			hexDigits(rune(name[i]), 2)
			i++
			continue
		}
		i += size
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r == ' ' || unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S):
			b = append(b, name[i-size:i]...)
		case r == 0x07:
			b = append(b, `\a`...)
		case r == 0x08:
			b = append(b, `\b`...)
		case r == 0x0c:
			b = append(b, `\f`...)
		case r == 0x0a:
			b = append(b, `\n`...)
		case r == 0x0d:
			b = append(b, `\r`...)
		case r == 0x09:
			b = append(b, `\t`...)
		case r == 0x0b:
			b = append(b, `\v`...)
		case r < 0x20 || r == 0x7f:
			b = append(b, `\x`...)
			hexDigits(r, 2)
		case r < 0x10000:
			b = append(b, `\u`...)
			hexDigits(r, 4)
		default:
			b = append(b, `\U`...)
			hexDigits(r, 8)
		}
	}
	return string(append(b, '"'))
}

// keyspecDecode decodes the UTF-8 sequence (RFC 3629) at the start of s,
// and returns size 0 when s does not start with one.
func keyspecDecode(s string) (r rune, size int) {
	c := s[0]
	var n int
	var low rune // the least code point of an n-byte sequence: no overlong forms
	switch {
	case c < 0x80:
		return rune(c), 1
	case c&0xe0 == 0xc0:
		n, r, low = 2, rune(c&0x1f), 0x80
	case c&0xf0 == 0xe0:
		n, r, low = 3, rune(c&0x0f), 0x800
	case c&0xf8 == 0xf0:
		n, r, low = 4, rune(c&0x07), 0x10000
	default:
		return 0, 0
	}
	if len(s) < n {
		return 0, 0
	}
	for i := 1; i < n; i++ {
		if s[i]&0xc0 != 0x80 {
			return 0, 0
		}
		r = r<<6 | rune(s[i]&0x3f)
	}
	if r < low || r > 0x10ffff || 0xd800 <= r && r <= 0xdfff {
		return 0, 0
	}
	return r, n
}

// TestKeyspecPathQuoting checks the quoting KEYSPEC.md spells out against
// strconv.Quote, which Go's paths use, for every code point, every string
// of one and two bytes and many random strings, and against the paths
// DeriveKey reports, so that the text cannot drift from the code.
func TestKeyspecPathQuoting(t *testing.T) {
	t.Parallel()

	// The text names the Unicode version of the printable test.
	require.Equal(t, "15.0.0", unicode.Version, "KEYSPEC.md names Unicode 15.0.0 for printable characters")

	check := func(name string) {
		if want, got := strconv.Quote(name), keyspecQuote(name); got != want {
			require.Equal(t, want, got, "name % x", name)
		}
	}
	// The path DeriveKey reports for a member of a native map.
	checkPath := func(name string) {
		_, err := DeriveKey(Call{RunID: "run-p", Tool: "t", Args: map[string]any{name: math.NaN()}})
		var nce *NotCanonicalError
		if !errors.As(err, &nce) || nce.Path != "$"+keyspecPathSegment(name) {
			require.Failf(t, "path", "name % x: %v, want path %s", name, err, "$"+keyspecPathSegment(name))
		}
	}
	for r := rune(0); r <= 0x10ffff; r++ {
		if 0xd800 <= r && r <= 0xdfff {
			// Not a Go string's rune: its three bytes are invalid UTF-8.
			check(string([]byte{0xe0 | byte(r>>12), 0x80 | byte(r>>6)&0x3f, 0x80 | byte(r)&0x3f}))
			continue
		}
		check(string(r))
		if r%251 == 0 {
			checkPath(string(r))
		}
	}

	var names []string
	for i := range 1 << 16 {
		names = append(names, string([]byte{byte(i >> 8), byte(i)}))
	}
	pieces := []string{
		"a", "Z", "_", "0", " ", `"`, `\`, "'", "/", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\x00", "\x1f", "\x7f",
		"\u0080", "\u00a0", "\u00ad", "é", "e\u0301", "\u2028", "\ufeff", "\ufffd", "\ue000", "😂", "\U0001fae8",
		"\U0002ebf0", "\U000e0001", "\U0010ffff", "\xff", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80",
	}
	rng := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // reproducible test input
	for range 20_000 {
		var b strings.Builder
		for range rng.IntN(8) {
			if rng.IntN(4) == 0 {
				b.WriteByte(byte(rng.IntN(256)))
			} else {
				b.WriteString(pieces[rng.IntN(len(pieces))])
			}
		}
		names = append(names, b.String())
	}

	for i, name := range names {
		check(name)
		if i%31 == 0 {
			checkPath(name)
		}
	}
}
