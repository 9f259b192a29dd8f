package migrations

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// schemaMaxLen is the longest schema name accepted. It leaves room within
// PostgreSQL's 63-byte identifier limit for the notification channel names
// pgonce derives from it.
const schemaMaxLen = 48

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// errInvalidSchema makes [ErrInvalidSchema], which outbox's ErrInvalidSchema
// shares by value.
func errInvalidSchema() error { return errors.New("invalid schema name") }

// ValidateSchema returns an error matching [ErrInvalidSchema] when name is
// not a schema name pgonce accepts: a plain lower-case identifier (letters
// a-z, digits, underscores, not starting with a digit), at most 48 bytes, and
// not in the pg_ namespace.
func ValidateSchema(name string) error {
	// Lower case only, so that the quoted and the unquoted spelling name the
	// same schema.
	switch {
	case name == "":
		return fmt.Errorf("%w: must not be empty", ErrInvalidSchema)
	case len(name) > schemaMaxLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalidSchema, quoteShort(name), schemaMaxLen)
	case !schemaPattern.MatchString(name):
		return fmt.Errorf("%w: %s must match %s", ErrInvalidSchema, quoteShort(name), schemaPattern)
	case strings.HasPrefix(name, "pg_"):
		return fmt.Errorf("%w: %s uses the pg_ prefix PostgreSQL reserves", ErrInvalidSchema, quoteShort(name))
	}
	return nil
}

// quoteMaxBytes is the most bytes of a rejected name that an error quotes.
const quoteMaxBytes = 64

// quoteShort quotes name for an error message: in full up to quoteMaxBytes,
// otherwise its first bytes (cut at a character boundary) and its length, so
// that a huge name cannot flood a log.
func quoteShort(name string) string {
	if len(name) <= quoteMaxBytes {
		return strconv.Quote(name)
	}
	cut := quoteMaxBytes
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(name[:cut]), len(name))
}

// quoteIdent returns name as a quoted SQL identifier.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}
