package outbox

import (
	"errors"
	"fmt"
)

// ErrNotCanonical is returned (wrapped in a [*NotCanonicalError]) by
// [Canonicalize] and [DeriveKey] when a value has no RFC 8785 canonical form
// or breaks the key number policy: NaN or infinite numbers, number literals
// out of float64 range, invalid UTF-8, lone surrogates, duplicate object
// member names, nesting deeper than [CanonicalMaxDepth], input larger than
// [CanonicalMaxBytes], text that is not JSON, and (for keys only) numbers
// whose canonical form is a different value, such as 9007199254740993 and
// 2^60. Match it with [errors.Is].
var ErrNotCanonical = errors.New("not canonical")

// ErrInvalidCall is returned (wrapped in an [*InvalidCallError]) by
// [DeriveKey] when a [Call] breaks a validation rule: a missing or malformed
// tool name, a missing run id, a negative step, or a string field that is
// oversized, not valid UTF-8 or holds a NUL byte. [Client.SubmitTx],
// [Client.Submit] and [Client.Do] return it before any SQL runs, so the
// caller's transaction is untouched. They also return it for a call
// without a NaturalID to a tool registered [LookupByNaturalID]. Match it
// with [errors.Is].
var ErrInvalidCall = errors.New("invalid call")

// ErrInvalidKey is returned by [ParseKey] when a string is not a well-formed
// [Key] of a known version. Match it with [errors.Is].
var ErrInvalidKey = errors.New("invalid key")

// NotCanonicalError says why a value cannot be canonicalised and where. It
// matches [ErrNotCanonical] under [errors.Is].
type NotCanonicalError struct {
	// Path locates the offending value as a JSONPath-like expression rooted
	// at "$", e.g. "$.items[2].amount". Member names that are not ASCII
	// identifiers ([A-Za-z_][A-Za-z0-9_]*) are written in brackets, quoted
	// as [strconv.Quote] does: `$["a b"]`, `$["é"]`, `$["\x01"]`.
	Path string

	// Reason says which rule the value breaks, e.g. "duplicate member name".
	Reason string

	// Err is an underlying error, if any (for instance from encoding/json
	// when a Go value cannot be marshalled). It may be nil.
	Err error
}

// Error implements error.
func (e *NotCanonicalError) Error() string {
	return fmt.Sprintf("not canonical at %s: %s", e.Path, e.Reason)
}

// Is reports whether target is [ErrNotCanonical].
func (e *NotCanonicalError) Is(target error) bool { return target == ErrNotCanonical }

// Unwrap returns the underlying error, if any.
func (e *NotCanonicalError) Unwrap() error { return e.Err }

// InvalidCallError says which field of a [Call] breaks which rule. It matches
// [ErrInvalidCall] under [errors.Is].
type InvalidCallError struct {
	// Field is the name of the offending [Call] field, e.g. "Tool".
	Field string

	// Reason states the rule the field breaks.
	Reason string
}

// Error implements error.
func (e *InvalidCallError) Error() string {
	return fmt.Sprintf("invalid call: %s %s", e.Field, e.Reason)
}

// Is reports whether target is [ErrInvalidCall].
func (e *InvalidCallError) Is(target error) bool { return target == ErrInvalidCall }
