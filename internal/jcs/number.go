package jcs

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// number parses a JSON number literal and appends its canonical form.
func (p *parser) number(out []byte) ([]byte, error) {
	start := p.pos
	end, ok := scanNumber(p.data, p.pos)
	if !ok {
		p.pos = end
		return out, p.unexpected()
	}
	p.pos = end
	lit := p.data[start:end]
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return out, &Error{Reason: fmt.Sprintf("number %s is out of float64 range (it rounds to %v)", quoteShort(string(lit)), f)}
	}
	n := len(out)
	out = appendES6Number(out, f)
	if p.st.strict && !sameDecimal(lit, out[n:], &p.st.digits) {
		return out, &Error{Reason: fmt.Sprintf(
			"number %s would become %s, a different value; send exact values as strings",
			quoteShort(string(lit)), out[n:])}
	}
	return out, nil
}

// scanNumber returns the end of the number literal starting at i and whether
// it matches the JSON grammar -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func scanNumber(data []byte, i int) (int, bool) {
	digits := func() int {
		n := 0
		for i < len(data) && '0' <= data[i] && data[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case digits() == 0:
		return i, false
	}
	if i < len(data) && data[i] == '.' {
		i++
		if digits() == 0 {
			return i, false
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, false
		}
	}
	return i, true
}

// IsNumber reports whether b is exactly one JSON number literal.
func IsNumber(b []byte) bool {
	end, ok := scanNumber(b, 0)
	return ok && end == len(b)
}

// appendES6Number appends f as ECMAScript's Number.prototype.toString (ES6
// 7.1.12.1) writes it: the shortest digits that round-trip, in plain notation
// for exponents -7 < n <= 21 and exponential notation ("1e+21", "1e-7")
// otherwise. Negative zero is "0". f must be finite.
func appendES6Number(dst []byte, f float64) []byte { return appendES6Float(dst, f, 64) }

// appendES6Float is appendES6Number for a float of bitSize bits (32 or 64):
// a float32 has its own shortest digits (float32(0.1) is "0.1"), spelled as
// a float64's are, as encoding/json spells them.
func appendES6Float(dst []byte, f float64, bitSize int) []byte {
	if f == 0 {
		return append(dst, '0')
	}
	var buf [32]byte
	b := strconv.AppendFloat(buf[:0], f, 'e', -1, bitSize) // -d.ddde±dd
	if b[0] == '-' {
		dst = append(dst, '-')
		b = b[1:]
	}
	e := bytes.IndexByte(b, 'e')
	exp, _ := strconv.Atoi(string(b[e+1:]))
	var digitBuf [24]byte
	digits := append(digitBuf[:0], b[0])
	if e > 1 {
		digits = append(digits, b[2:e]...)
	}
	k, n := len(digits), exp+1 // f = 0.digits × 10^n

	switch {
	case k <= n && n <= 21:
		dst = append(dst, digits...)
		for range n - k {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for range -n {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst
}

// sameDecimal reports whether two JSON number literals denote the same
// decimal value, e.g. "4.2e1" and "42". It compares significant digits and
// exponents, never floats, so it sees differences a float64 cannot hold.
func sameDecimal(a, b []byte, scratch *[]byte) bool {
	negA, digitsA, expA := normalizeDecimal(a, (*scratch)[:0])
	*scratch = digitsA
	negB, digitsB, expB := normalizeDecimal(b, digitsA[len(digitsA):])
	if len(digitsA) == 0 || len(digitsB) == 0 {
		return len(digitsA) == len(digitsB) // zero equals zero, whatever its sign
	}
	return negA == negB && expA == expB && bytes.Equal(digitsA, digitsB)
}

// normalizeDecimal returns the sign, significant digits (no leading or
// trailing zeros; empty for zero) and exponent e of a number literal, whose
// value is then 0.digits × 10^e. Digits are appended to buf.
func normalizeDecimal(lit []byte, buf []byte) (neg bool, digits []byte, exp int) {
	i := 0
	if i < len(lit) && lit[i] == '-' {
		neg = true
		i++
	}
	pointExp := 0 // digits seen before the decimal point, less leading zeros
	leading := true
	for ; i < len(lit) && lit[i] != 'e' && lit[i] != 'E'; i++ {
		c := lit[i]
		switch {
		case c == '.':
			for i+1 < len(lit) && lit[i+1] >= '0' && lit[i+1] <= '9' {
				i++
				if leading && lit[i] == '0' {
					pointExp--
					continue
				}
				leading = false
				buf = append(buf, lit[i])
			}
		case leading && c == '0':
		default:
			leading = false
			buf = append(buf, c)
			pointExp++
		}
	}
	if i < len(lit) { // exponent
		i++
		expNeg := false
		if lit[i] == '+' || lit[i] == '-' {
			expNeg = lit[i] == '-'
			i++
		}
		e := 0
		for ; i < len(lit); i++ {
			if e < 1<<30 {
				e = e*10 + int(lit[i]-'0')
			}
		}
		if expNeg {
			e = -e
		}
		pointExp += e
	}
	for len(buf) > 0 && buf[len(buf)-1] == '0' {
		buf = buf[:len(buf)-1]
	}
	return neg, buf, pointExp
}
