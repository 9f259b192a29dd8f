package jcs

import (
	"bytes"
	"fmt"
	"slices"
	"unicode/utf8"
)

// parser is a strict JSON parser that writes canonical output as it goes.
type parser struct {
	st   *Buffer
	data []byte
	pos  int
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) syntaxError(reason string) error {
	return &Error{Reason: fmt.Sprintf("not JSON: %s at offset %d", reason, p.pos)}
}

func (p *parser) unexpected() error {
	if p.pos >= len(p.data) {
		return p.syntaxError("unexpected end of input")
	}
	c := p.data[p.pos]
	if c >= 0x20 && c < utf8.RuneSelf {
		return p.syntaxError(fmt.Sprintf("unexpected character %q", c))
	}
	return p.syntaxError(fmt.Sprintf("unexpected byte 0x%02x", c))
}

// value parses one JSON value at depth (the number of enclosing arrays and
// objects) and appends its canonical form to out.
func (p *parser) value(out []byte, depth int) ([]byte, error) {
	p.skipSpace()
	if p.pos >= len(p.data) {
		return out, p.unexpected()
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(out, depth+1)
	case c == '[':
		return p.array(out, depth+1)
	case c == '"':
		out, _, err := p.str(out, false)
		return out, err
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number(out)
	case c == 't':
		return p.literal(out, "true")
	case c == 'f':
		return p.literal(out, "false")
	case c == 'n':
		return p.literal(out, "null")
	default:
		return out, p.unexpected()
	}
}

func (p *parser) literal(out []byte, lit string) ([]byte, error) {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(lit)) {
		return out, p.unexpected()
	}
	p.pos += len(lit)
	return append(out, lit...), nil
}

func (p *parser) array(out []byte, depth int) ([]byte, error) {
	if depth > MaxDepth {
		return out, errTooDeep()
	}
	p.pos++ // [
	out = append(out, '[')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return append(out, ']'), nil
	}
	for i := 0; ; i++ {
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if out, err = p.value(out, depth); err != nil {
			return out, prefixPath(err, indexSegment(i))
		}
		p.skipSpace()
		if p.pos < len(p.data) {
			switch p.data[p.pos] {
			case ',':
				p.pos++
				continue
			case ']':
				p.pos++
				return append(out, ']'), nil
			}
		}
		return out, prefixPath(p.unexpected(), indexSegment(i))
	}
}

func (p *parser) object(out []byte, depth int) ([]byte, error) {
	if depth > MaxDepth {
		return out, errTooDeep()
	}
	st := p.st
	p.pos++ // {
	out = append(out, '{')
	base := len(out)
	membersBase := len(st.members)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return append(out, '}'), nil
	}
	for i := 0; ; i++ {
		if i > 0 {
			out = append(out, ',')
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return out, p.unexpected()
		}
		start := len(out)
		var name []byte
		var err error
		out, name, err = p.str(out, true)
		if err != nil {
			return out, err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return out, prefixPath(p.unexpected(), nameSegment(string(name)))
		}
		p.pos++
		out = append(out, ':')
		if out, err = p.value(out, depth); err != nil {
			return out, prefixPath(err, nameSegment(string(name)))
		}
		st.members = append(st.members, member{name: name, start: start, end: len(out)})

		p.skipSpace()
		if p.pos < len(p.data) {
			switch p.data[p.pos] {
			case ',':
				p.pos++
				continue
			case '}':
				p.pos++
			default:
				return out, prefixPath(p.unexpected(), nameSegment(string(name)))
			}
		} else {
			return out, prefixPath(p.unexpected(), nameSegment(string(name)))
		}
		break
	}

	members := st.members[membersBase:]
	st.members = st.members[:membersBase] // entries stay readable until the next append
	sorted := slices.IsSortedFunc(members, compareMembers)
	if !sorted {
		slices.SortFunc(members, compareMembers)
	}
	for i := 1; i < len(members); i++ {
		if bytes.Equal(members[i-1].name, members[i].name) {
			return out, &Error{
				Path:   nameSegment(string(members[i].name)),
				Reason: "duplicate member name",
			}
		}
	}
	if !sorted {
		// Members were written in input order; rewrite them sorted.
		st.scratch = append(st.scratch[:0], out[base:]...)
		out = out[:base]
		for i, m := range members {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, st.scratch[m.start-base:m.end-base]...)
		}
	}
	return append(out, '}'), nil
}

func compareMembers(a, b member) int { return compareUTF16(a.name, b.name) }

// compareUTF16 orders valid UTF-8 strings by their UTF-16 code units, as RFC
// 8785 sorts member names. UTF-8 byte order equals code point order, which
// differs from UTF-16 order only between supplementary characters (surrogate
// pairs, 0xD800-0xDBFF first unit) and U+E000-U+FFFF.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	// Back up to the start of the rune holding the first difference.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	return int(utf16Unit(ra)) - int(utf16Unit(rb))
}

// utf16Unit maps r to a number that orders runes as their UTF-16 encodings
// do: a BMP rune is its single code unit, a supplementary rune its high
// surrogate, each scaled by 2^10, plus (for supplementary runes) the low ten
// bits that its low surrogate carries. A BMP rune never equals a surrogate,
// so no two different runes tie.
func utf16Unit(r rune) rune {
	if r < 0x10000 {
		return r << 10
	}
	return (0xD800+(r-0x10000)>>10)<<10 | (r-0x10000)&0x3FF
}

// str parses a JSON string at p.pos (the opening quote) and appends its
// canonical form to out. For a member name it also returns the unescaped
// name, which aliases the input when the name has no escapes.
func (p *parser) str(out []byte, isName bool) ([]byte, []byte, error) {
	p.pos++ // "
	out = append(out, '"')
	begin := p.pos
	run := p.pos
	var decoded []byte // the unescaped name, once an escape is seen
	escaped := false
	for {
		if p.pos >= len(p.data) {
			return out, nil, p.syntaxError("unterminated string")
		}
		// Skip the bytes that are copied verbatim: printable ASCII but the
		// quote and the backslash.
		i := p.pos
		for i < len(p.data) && plainStringByte[p.data[i]] {
			i++
		}
		p.pos = i
		if p.pos >= len(p.data) {
			continue
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			out = append(out, p.data[run:p.pos]...)
			name := p.data[begin:p.pos]
			if escaped {
				name = append(decoded, p.data[run:p.pos]...)
			}
			p.pos++
			return append(out, '"'), name, nil
		case c == '\\':
			out = append(out, p.data[run:p.pos]...)
			if isName {
				if !escaped {
					decoded = make([]byte, 0, p.pos-begin+8)
					escaped = true
				}
				decoded = append(decoded, p.data[run:p.pos]...)
			}
			r, err := p.escape()
			if err != nil {
				return out, nil, err
			}
			out = appendEscapedRune(out, r)
			if isName {
				decoded = utf8.AppendRune(decoded, r)
			}
			run = p.pos
		case c < 0x20:
			return out, nil, p.syntaxError(fmt.Sprintf("control character 0x%02x in string", c))
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size == 1 {
				what := "string"
				if isName {
					what = "member name"
				}
				return out, nil, &Error{Reason: fmt.Sprintf("invalid UTF-8 in %s at offset %d", what, p.pos)}
			}
			p.pos += size
		}
	}
}

// plainStringByte marks the bytes a JSON string holds as they are: printable
// ASCII other than the quote and the backslash.
var plainStringByte = func() (table [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		table[c] = c != '"' && c != '\\'
	}
	return table
}()

// escape decodes the escape sequence at p.pos (the backslash), joining
// surrogate pairs and refusing lone surrogates.
func (p *parser) escape() (rune, error) {
	if p.pos+1 >= len(p.data) {
		p.pos = len(p.data)
		return 0, p.syntaxError("unterminated string")
	}
	c := p.data[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r1, ok := p.hex4()
		if !ok {
			return 0, p.syntaxError(`invalid \u escape`)
		}
		switch {
		case r1 >= 0xDC00 && r1 <= 0xDFFF:
			return 0, &Error{Reason: fmt.Sprintf(`lone surrogate \u%04x in string`, r1)}
		case r1 >= 0xD800 && r1 <= 0xDBFF:
			if p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
				save := p.pos
				p.pos += 2
				if r2, ok := p.hex4(); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
					return 0x10000 + (r1-0xD800)<<10 + (r2 - 0xDC00), nil
				}
				p.pos = save
			}
			return 0, &Error{Reason: fmt.Sprintf(`lone surrogate \u%04x in string`, r1)}
		}
		return r1, nil
	default:
		p.pos--
		return 0, p.syntaxError(fmt.Sprintf("invalid escape %q", "\\"+string(rune(c))))
	}
}

func (p *parser) hex4() (rune, bool) {
	if p.pos+4 > len(p.data) {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

const hexDigits = "0123456789abcdef"

// appendEscapedRune appends r as RFC 8785 writes it inside a string: the two
// mandatory escapes, the five short control escapes, \u00xx (lower-case hex)
// for the other control characters, and UTF-8 for everything else.
func appendEscapedRune(dst []byte, r rune) []byte {
	switch r {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
	}
	return utf8.AppendRune(dst, r)
}
