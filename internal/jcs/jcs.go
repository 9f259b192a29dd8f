// Package jcs implements RFC 8785, the JSON Canonicalization Scheme, for
// outbox: Go values to JSON text (encode.go), a strict JSON parser that writes
// canonical output as it reads (parse.go), and ECMAScript number formatting
// (number.go).
package jcs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
)

const (
	// MaxDepth is the deepest nesting of arrays and objects accepted. The
	// top-level array or object is depth 1.
	MaxDepth = 128

	// MaxBytes is the largest JSON text, in bytes, accepted: the text as
	// given for json.RawMessage and []byte arguments, or as produced by
	// marshalling a Go value.
	MaxBytes = 1 << 20
)

// Numbers is the number policy of a canonicalisation.
type Numbers int

const (
	// NumbersRounded rounds number literals to the nearest float64, as RFC
	// 8785 requires.
	NumbersRounded Numbers = iota

	// NumbersExact refuses number literals whose canonical form is a
	// different decimal value (the key number policy of KEYSPEC.md).
	NumbersExact
)

// Error says why a value cannot be canonicalised and where. outbox turns it
// into its public NotCanonicalError.
type Error struct {
	// Path locates the offending value, rooted at "$".
	Path string

	// Reason says which rule the value breaks.
	Reason string

	// Err is an underlying error, if any.
	Err error

	// tooLarge marks the refusal of text larger than MaxBytes, which is
	// reported at "$" wherever it was found.
	tooLarge bool
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("not canonical at %s: %s", e.Path, e.Reason)
}

// Unwrap returns the underlying error, if any.
func (e *Error) Unwrap() error { return e.Err }

// Canonicalize returns the RFC 8785 form of v, owned by the caller, under the
// number policy numbers. It is safe for concurrent use.
func Canonicalize(v any, numbers Numbers) ([]byte, error) {
	st := Get()
	defer st.Release()

	out, err := st.Canonicalize(v, numbers)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(out), nil
}

// Buffer holds the reusable memory of one canonicalisation. It is not safe
// for concurrent use; take one with [Get] per call and [Buffer.Release] it.
type Buffer struct {
	// Frame is scratch space for the caller (outbox frames key hashes in
	// it), kept with the state's other buffers.
	Frame []byte

	strict  bool     // key number policy: refuse literals that canonicalise to another value
	text    []byte   // JSON text produced from a Go value
	out     []byte   // canonical output
	scratch []byte   // object member reordering
	members []member // stack of members of the objects being parsed
	digits  []byte   // strict number check
}

// member is one object member written to Buffer.out as `"name":value`
// at out[start:end]; name is its unescaped name.
type member struct {
	name       []byte
	start, end int
}

var statePool = sync.Pool{New: func() any { return new(Buffer) }}

// Get returns a Buffer from a pool.
func Get() *Buffer {
	st, _ := statePool.Get().(*Buffer)
	st.members = st.members[:0]
	return st
}

// stateKeepBytes bounds the buffers kept in the pool, so one large
// argument does not pin memory for the life of the process.
const stateKeepBytes = 64 << 10

// Release returns st to the pool. Results st returned are invalid after.
func (st *Buffer) Release() {
	if cap(st.text) > stateKeepBytes || cap(st.out) > stateKeepBytes ||
		cap(st.scratch) > stateKeepBytes || cap(st.Frame) > stateKeepBytes {
		return
	}
	clear(st.members[:cap(st.members)]) // drop references into caller memory
	st.members = st.members[:0]
	statePool.Put(st)
}

// Canonicalize writes the canonical form of v into the state's buffer and
// returns it. The result is valid until st is used again or released.
func (st *Buffer) Canonicalize(v any, numbers Numbers) ([]byte, error) {
	st.strict = numbers == NumbersExact

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
			if jerr, ok := err.(*Error); ok && jerr.tooLarge { //nolint:errorlint // only our own unwrapped errors
				// The limit is on the whole text, wherever writing it
				// went past: "$", as for text.
				jerr.Path = ""
			}
			return nil, rootPath(err)
		}
		text = st.text
	}
	if len(text) > MaxBytes {
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
	return &Error{
		Reason:   fmt.Sprintf("input larger than the limit of %d bytes", MaxBytes),
		tooLarge: true,
	}
}

func errTooDeep() error {
	return &Error{
		Reason: fmt.Sprintf("nesting deeper than the limit of %d levels", MaxDepth),
	}
}

// rootPath completes the relative path of a *Error built while
// unwinding into a path rooted at "$".
func rootPath(err error) error {
	if nce, ok := err.(*Error); ok { //nolint:errorlint // only our own unwrapped errors
		nce.Path = "$" + nce.Path
	}
	return err
}

// prefixPath prepends one path segment to a *Error as the
// recursion unwinds; paths cost nothing unless something fails.
func prefixPath(err error, segment string) error {
	if nce, ok := err.(*Error); ok { //nolint:errorlint // only our own unwrapped errors
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

func quoteShort(s string) string {
	const limit = 40
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return strconv.Quote(s)
}
