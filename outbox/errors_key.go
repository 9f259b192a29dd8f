package outbox

import "fmt"

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
