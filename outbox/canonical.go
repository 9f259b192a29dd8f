package outbox

import (
	"errors"
	"strconv"

	"github.com/pgonce/pgonce/internal/jcs"
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
	out, err := jcs.Canonicalize(v, jcs.NumbersRounded)
	if err != nil {
		return nil, notCanonical(err)
	}
	return out, nil
}

// notCanonical turns a [jcs.Error] into the public [*NotCanonicalError] and
// passes other errors through.
func notCanonical(err error) error {
	var jerr *jcs.Error
	if errors.As(err, &jerr) {
		return &NotCanonicalError{Path: jerr.Path, Reason: jerr.Reason, Err: jerr.Err}
	}
	return err
}

// quoteShort quotes s for an error message, cut to 40 bytes.
func quoteShort(s string) string {
	const limit = 40
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return strconv.Quote(s)
}
