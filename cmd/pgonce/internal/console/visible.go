package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The console shows text with one rule, wherever it comes from (the
// database or the request) and wherever it goes (page text, an attribute,
// a form's input or text area): characters that a browser would not show
// as themselves are written out as ⟨U+202E⟩ and the like (visible). Shown
// raw, a bidi control reorders the text around it (a tenant
// "acme\u202egnp.exe" reads as "acmeexe.png"), and a zero-width one makes
// two different strings look the same, so that a page would show another
// string than the one stored or typed. Templates print text through the
// "show" function, which is visible, or through one built on it;
// TestTemplatesPrintTextThroughOneRule walks every template for a print
// that does not. The text an operator sends back (a search, a filter, a
// name and reason, a response) reads the same notation as the characters
// it stands for (fromVisible), so that a form shown again and sent again
// means what it meant the first time. The raw bytes stay downloadable.

// isHidden reports whether c is written out: a format character (Unicode
// category Cf: the bidi controls U+061C, U+200E, U+200F, U+202A to U+202E
// and U+2066 to U+2069, the zero-width U+200B, U+200C, U+200D, U+2060 and
// U+FEFF, the soft hyphen, and the like) or a control character other than
// tab, line feed and carriage return.
func isHidden(c rune) bool {
	if c == '\t' || c == '\n' || c == '\r' {
		return false
	}
	return unicode.Is(unicode.Cf, c) || unicode.IsControl(c)
}

// visible writes out the hidden characters of s (see isHidden) as
// ⟨U+202E⟩ and the like.
func visible(s string) string {
	if !strings.ContainsFunc(s, isHidden) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if isHidden(c) {
			fmt.Fprintf(&b, "⟨U+%04X⟩", c)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fromVisible reads back what visible writes: each ⟨U+XXXX⟩ that names a
// hidden character becomes that character. Other text, a ⟨U+0041⟩
// included, stays as it is.
func fromVisible(s string) string {
	const open, closing = "⟨U+", "⟩"
	if !strings.Contains(s, open) {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, open)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		rest := s[i+len(open):]
		j := strings.Index(rest, closing)
		if j >= 4 && j <= 6 {
			code, err := strconv.ParseUint(rest[:j], 16, 32)
			// Only the spelling visible writes: upper case, at least four
			// digits, no more leading zeros.
			if c := rune(code); err == nil && utf8.ValidRune(c) && isHidden(c) && fmt.Sprintf("%04X", c) == rest[:j] {
				b.WriteRune(c)
				s = rest[j+len(closing):]
				continue
			}
		}
		b.WriteString(open)
		s = rest
	}
}

// queryText is the request's query value name, as an operator typed it
// (see fromVisible).
func queryText(q url.Values, name string) string {
	return fromVisible(q.Get(name))
}

// formText is the request's form value name, as an operator typed it (see
// fromVisible).
func formText(r *http.Request, name string) string {
	return fromVisible(r.PostFormValue(name))
}
