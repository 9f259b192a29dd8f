package outbox

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

const (
	// CanonicalMaxDepth is the deepest nesting of arrays and objects that
	// [Canonicalize] and [DeriveKey] accept. The top-level array or object is
	// depth 1. Deeper values are refused with [ErrNotCanonical].
	CanonicalMaxDepth = 128

	// CanonicalMaxBytes is the largest JSON text, in bytes, that
	// [Canonicalize] and [DeriveKey] accept: the text as given for
	// [json.RawMessage] and []byte arguments, or as produced by marshalling a
	// Go value. Larger input is refused with [ErrNotCanonical].
	CanonicalMaxBytes = 1 << 20
)

// Canonicalize returns the RFC 8785 (JSON Canonicalization Scheme) form of v:
// object members sorted by their UTF-16 code units, no insignificant
// whitespace, numbers serialised as ECMAScript's Number.prototype.toString
// does (shortest round-trip form of the float64 value, so 4.50 becomes 4.5,
// 1E30 becomes 1e+30 and -0 becomes 0), and strings escaped only where the
// RFC requires it. The result is UTF-8 and owned by the caller.
//
// How v is read:
//
//   - [json.RawMessage] and []byte are JSON text, not a byte string to be
//     base64-encoded. A nil one is JSON null. (A []byte nested inside another
//     Go value follows encoding/json and becomes a base64 string.)
//   - string is a Go string value, canonicalised as a JSON string. To
//     canonicalise JSON text held in a string, convert it to
//     [json.RawMessage].
//   - [json.Number] is a number literal.
//   - nil is JSON null.
//   - Any other Go value (maps with string keys, slices, structs with json
//     tags, types implementing [json.Marshaler]) is marshalled as
//     encoding/json would and the result is canonicalised.
//
// Canonicalize refuses, with an error matching [ErrNotCanonical] (a
// [*NotCanonicalError] naming a JSON path and a reason), what has no
// canonical form: NaN and infinite floats, number literals out of float64
// range, invalid UTF-8, lone surrogates in \u escapes, duplicate object
// member names (compared after unescaping), nesting deeper than
// [CanonicalMaxDepth], input larger than [CanonicalMaxBytes], and text that
// is not exactly one JSON value.
//
// Number literals are rounded to the nearest float64 as the RFC requires, so
// 9007199254740993 canonicalises to 9007199254740992. [DeriveKey] is
// stricter and refuses such literals; see KEYSPEC.md.
//
// Canonicalize is safe for concurrent use.
func Canonicalize(v any) ([]byte, error) {
	st := getCanonState()
	defer putCanonState(st)

	out, err := st.canonicalize(v, false)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(out), nil
}

// canonState holds the reusable buffers of one canonicalisation. It is not
// safe for concurrent use; get one from the pool per call.
type canonState struct {
	strict  bool     // key number policy: refuse literals that canonicalise to another value
	text    []byte   // JSON text produced from a Go value
	out     []byte   // canonical output
	scratch []byte   // object member reordering
	members []member // stack of members of the objects being parsed
	digits  []byte   // strict number check
	frame   []byte   // hash framing (key derivation)
}

// member is one object member written to canonState.out as `"name":value`
// at out[start:end]; name is its unescaped name.
type member struct {
	name       []byte
	start, end int
}

var canonStatePool = sync.Pool{New: func() any { return new(canonState) }}

func getCanonState() *canonState {
	st, _ := canonStatePool.Get().(*canonState)
	st.members = st.members[:0]
	return st
}

// canonStateKeepBytes bounds the buffers kept in the pool, so one large
// argument does not pin memory for the life of the process.
const canonStateKeepBytes = 64 << 10

func putCanonState(st *canonState) {
	if cap(st.text) > canonStateKeepBytes || cap(st.out) > canonStateKeepBytes ||
		cap(st.scratch) > canonStateKeepBytes || cap(st.frame) > canonStateKeepBytes {
		return
	}
	clear(st.members[:cap(st.members)]) // drop references into caller memory
	st.members = st.members[:0]
	canonStatePool.Put(st)
}

// canonicalize writes the canonical form of v into st.out and returns it. The
// result is valid until st is reused.
func (st *canonState) canonicalize(v any, strict bool) ([]byte, error) {
	st.strict = strict

	var text []byte
	switch x := v.(type) {
	case json.RawMessage:
		text = x
		if x == nil {
			text = literalNull
		}
	case []byte:
		text = x
		if x == nil {
			text = literalNull
		}
	default:
		var err error
		st.text, err = st.encode(st.text[:0], v, 0)
		if err != nil {
			return nil, rootPath(err)
		}
		text = st.text
	}
	if len(text) > CanonicalMaxBytes {
		return nil, rootPath(errTooLarge())
	}

	p := parser{st: st, data: text}
	out, err := p.value(st.out[:0], 0)
	if err == nil {
		p.skipSpace()
		if p.pos < len(p.data) {
			err = p.syntaxError("trailing data after the JSON value")
		}
	}
	if err != nil {
		st.out = out[:0]
		return nil, rootPath(err)
	}
	st.out = out
	return out, nil
}

var literalNull = []byte("null")

func errTooLarge() error {
	return &NotCanonicalError{
		Reason: fmt.Sprintf("input larger than the limit of %d bytes", CanonicalMaxBytes),
	}
}

func errTooDeep() error {
	return &NotCanonicalError{
		Reason: fmt.Sprintf("nesting deeper than the limit of %d levels", CanonicalMaxDepth),
	}
}

// rootPath completes the relative path of a *NotCanonicalError built while
// unwinding into a path rooted at "$".
func rootPath(err error) error {
	if nce, ok := err.(*NotCanonicalError); ok { //nolint:errorlint // only our own unwrapped errors
		nce.Path = "$" + nce.Path
	}
	return err
}

// prefixPath prepends one path segment to a *NotCanonicalError as the
// recursion unwinds; paths cost nothing unless something fails.
func prefixPath(err error, segment string) error {
	if nce, ok := err.(*NotCanonicalError); ok { //nolint:errorlint // only our own unwrapped errors
		nce.Path = segment + nce.Path
	}
	return err
}

func indexSegment(i int) string { return "[" + strconv.Itoa(i) + "]" }

// nameSegment renders a member name as a path segment: ".name" for simple
// identifiers, `["any name"]` otherwise.
func nameSegment(name string) string {
	simple := name != ""
	for i := 0; i < len(name) && simple; i++ {
		c := name[i]
		simple = c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || (i > 0 && '0' <= c && c <= '9')
	}
	if simple {
		return "." + name
	}
	return "[" + strconv.Quote(name) + "]"
}

//
// Go values to JSON text.
//

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// encode appends JSON text for the Go value v to dst. Common dynamic types
// are written directly; anything else is checked for what encoding/json
// would silently change (invalid UTF-8) or refuse without a path (NaN, ±Inf),
// then marshalled by encoding/json. The text need not be canonical: it is
// parsed again.
func (st *canonState) encode(dst []byte, v any, depth int) ([]byte, error) {
	if len(dst) > CanonicalMaxBytes {
		return dst, errTooLarge()
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		return strconv.AppendBool(dst, x), nil
	case string:
		return appendGoString(dst, x)
	case float64:
		return appendGoFloat(dst, x, 64)
	case float32:
		return appendGoFloat(dst, float64(x), 32)
	case int:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(dst, x, 10), nil
	case int32:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int16:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int8:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(dst, x, 10), nil
	case uint32:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint16:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint8:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case json.Number:
		if x == "" { // as encoding/json does
			return append(dst, '0'), nil
		}
		if !isNumberLiteral([]byte(x)) {
			return dst, &NotCanonicalError{Reason: fmt.Sprintf("json.Number %s is not a JSON number", quoteShort(string(x)))}
		}
		return append(dst, x...), nil
	case json.RawMessage:
		if x == nil {
			return append(dst, "null"...), nil
		}
		// Checked here only so that the text cannot change the structure
		// around it (e.g. `1,2`); the strict checks happen on the re-parse.
		if !json.Valid(x) {
			return dst, &NotCanonicalError{Reason: "json.RawMessage is not a single JSON value"}
		}
		return append(dst, x...), nil
	case map[string]any:
		if depth++; depth > CanonicalMaxDepth {
			return dst, errTooDeep()
		}
		dst = append(dst, '{')
		first := true
		for name, elem := range x {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			if dst, err = appendGoString(dst, name); err != nil {
				return dst, prefixPath(errInvalidUTF8Name(), nameSegment(name))
			}
			dst = append(dst, ':')
			if dst, err = st.encode(dst, elem, depth); err != nil {
				return dst, prefixPath(err, nameSegment(name))
			}
		}
		return append(dst, '}'), nil
	case []any:
		if depth++; depth > CanonicalMaxDepth {
			return dst, errTooDeep()
		}
		dst = append(dst, '[')
		for i, elem := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = st.encode(dst, elem, depth); err != nil {
				return dst, prefixPath(err, indexSegment(i))
			}
		}
		return append(dst, ']'), nil
	case map[string]string:
		dst = append(dst, '{')
		first := true
		for name, elem := range x {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			if dst, err = appendGoString(dst, name); err != nil {
				return dst, prefixPath(errInvalidUTF8Name(), nameSegment(name))
			}
			dst = append(dst, ':')
			if dst, err = appendGoString(dst, elem); err != nil {
				return dst, prefixPath(err, nameSegment(name))
			}
		}
		return append(dst, '}'), nil
	case []string:
		dst = append(dst, '[')
		for i, elem := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendGoString(dst, elem); err != nil {
				return dst, prefixPath(err, indexSegment(i))
			}
		}
		return append(dst, ']'), nil
	}

	// Anything else goes through encoding/json, after a check for what it
	// would accept but change or refuse without saying where.
	if err := checkGoValue(reflect.ValueOf(v), depth, 0); err != nil {
		return dst, err
	}
	text, err := json.Marshal(v)
	if err != nil {
		return dst, &NotCanonicalError{Reason: fmt.Sprintf("cannot marshal %T: %v", v, err), Err: err}
	}
	if len(dst)+len(text) > CanonicalMaxBytes {
		return dst, errTooLarge()
	}
	return append(dst, text...), nil
}

func errInvalidUTF8Name() error { return &NotCanonicalError{Reason: "invalid UTF-8 in member name"} }

func appendGoFloat(dst []byte, f float64, bitSize int) ([]byte, error) {
	if err := checkFloat(f); err != nil {
		return dst, err
	}
	return strconv.AppendFloat(dst, f, 'g', -1, bitSize), nil
}

func checkFloat(f float64) error {
	switch {
	case math.IsNaN(f):
		return &NotCanonicalError{Reason: "NaN is not a JSON number"}
	case math.IsInf(f, 1):
		return &NotCanonicalError{Reason: "+Inf is not a JSON number"}
	case math.IsInf(f, -1):
		return &NotCanonicalError{Reason: "-Inf is not a JSON number"}
	}
	return nil
}

// appendGoString appends s as a JSON string, refusing invalid UTF-8 (which
// encoding/json would silently replace with U+FFFD).
func appendGoString(dst []byte, s string) ([]byte, error) {
	dst = append(dst, '"')
	run := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[run:i]...)
		if c < utf8.RuneSelf {
			dst = appendEscapedRune(dst, rune(c))
			i++
			run = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return dst, &NotCanonicalError{Reason: fmt.Sprintf("invalid UTF-8 in string at byte %d", i)}
		}
		dst = append(dst, s[i:i+size]...)
		i += size
		run = i
	}
	dst = append(dst, s[run:]...)
	return append(dst, '"'), nil
}

// checkGoValue walks a value that encoding/json will marshal and refuses,
// with a path, NaN and infinite floats and strings with invalid UTF-8. It
// stops at types with their own marshalling, whose output is checked when it
// is parsed. level bounds the walk (pointer and interface hops count), so a
// cyclic value cannot recurse forever; encoding/json reports the cycle.
func checkGoValue(rv reflect.Value, depth, level int) error {
	if !rv.IsValid() {
		return nil
	}
	if level > 4*CanonicalMaxDepth {
		return &NotCanonicalError{Reason: "value nests too deep, or is cyclic"}
	}
	rt := rv.Type()
	if rt.Implements(jsonMarshalerType) || rt.Implements(textMarshalerType) {
		return nil
	}
	if rt.Kind() != reflect.Pointer {
		pt := reflect.PointerTo(rt)
		if pt.Implements(jsonMarshalerType) || pt.Implements(textMarshalerType) {
			return nil
		}
	}

	switch rv.Kind() {
	case reflect.Float32, reflect.Float64:
		return checkFloat(rv.Float())
	case reflect.String:
		if s := rv.String(); !utf8.ValidString(s) {
			return &NotCanonicalError{Reason: "invalid UTF-8 in string"}
		}
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil
		}
		return checkGoValue(rv.Elem(), depth, level+1)
	case reflect.Struct:
		if depth++; depth > CanonicalMaxDepth {
			return errTooDeep()
		}
		for i := range rt.NumField() {
			field := rt.Field(i)
			if !field.IsExported() && !field.Anonymous {
				continue
			}
			tag := field.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := cutComma(tag)
			segment := ""
			if name != "" || !field.Anonymous {
				segment = nameSegment(cmp.Or(name, field.Name))
			} else {
				depth-- // promoted fields live at the same level
			}
			if err := checkGoValue(rv.Field(i), depth, level+1); err != nil {
				return prefixPath(err, segment)
			}
			if segment == "" {
				depth++
			}
		}
	case reflect.Map:
		if depth++; depth > CanonicalMaxDepth {
			return errTooDeep()
		}
		iter := rv.MapRange()
		for iter.Next() {
			key := iter.Key()
			name := fmt.Sprint(key)
			if key.Kind() == reflect.String {
				name = key.String()
			}
			if key.Kind() == reflect.String && !utf8.ValidString(key.String()) {
				return prefixPath(errInvalidUTF8Name(), nameSegment(name))
			}
			if err := checkGoValue(iter.Value(), depth, level+1); err != nil {
				return prefixPath(err, nameSegment(name))
			}
		}
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rt.Elem().Kind() == reflect.Uint8 {
			return nil // base64
		}
		if depth++; depth > CanonicalMaxDepth {
			return errTooDeep()
		}
		for i := range rv.Len() {
			if err := checkGoValue(rv.Index(i), depth, level+1); err != nil {
				return prefixPath(err, indexSegment(i))
			}
		}
	default:
	}
	return nil
}

func cutComma(s string) (before, after string, found bool) {
	if i := bytes.IndexByte([]byte(s), ','); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

func quoteShort(s string) string {
	const limit = 40
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return strconv.Quote(s)
}

//
// JSON text to canonical bytes.
//

// parser is a strict JSON parser that writes canonical output as it goes.
type parser struct {
	st   *canonState
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
	return &NotCanonicalError{Reason: fmt.Sprintf("not JSON: %s at offset %d", reason, p.pos)}
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
	if depth > CanonicalMaxDepth {
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
	if depth > CanonicalMaxDepth {
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
			return out, &NotCanonicalError{
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
				return out, nil, &NotCanonicalError{Reason: fmt.Sprintf("invalid UTF-8 in %s at offset %d", what, p.pos)}
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
			return 0, &NotCanonicalError{Reason: fmt.Sprintf(`lone surrogate \u%04x in string`, r1)}
		case r1 >= 0xD800 && r1 <= 0xDBFF:
			if p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
				save := p.pos
				p.pos += 2
				if r2, ok := p.hex4(); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
					return 0x10000 + (r1-0xD800)<<10 + (r2 - 0xDC00), nil
				}
				p.pos = save
			}
			return 0, &NotCanonicalError{Reason: fmt.Sprintf(`lone surrogate \u%04x in string`, r1)}
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
		return out, &NotCanonicalError{Reason: fmt.Sprintf("number %s is out of float64 range (it rounds to %v)", quoteShort(string(lit)), f)}
	}
	n := len(out)
	out = appendES6Number(out, f)
	if p.st.strict && !sameDecimal(lit, out[n:], &p.st.digits) {
		return out, &NotCanonicalError{Reason: fmt.Sprintf(
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

func isNumberLiteral(b []byte) bool {
	end, ok := scanNumber(b, 0)
	return ok && end == len(b)
}

// appendES6Number appends f as ECMAScript's Number.prototype.toString (ES6
// 7.1.12.1) writes it: the shortest digits that round-trip, in plain notation
// for exponents -7 < n <= 21 and exponential notation ("1e+21", "1e-7")
// otherwise. Negative zero is "0". f must be finite.
func appendES6Number(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, '0')
	}
	var buf [32]byte
	b := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // -d.ddde±dd
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
