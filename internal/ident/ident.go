// Package ident validates and quotes the SQL identifiers pgonce builds from
// configuration: the schema name and the notification channels derived from it.
package ident

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// SchemaMaxLen is the longest schema name accepted. It leaves room within
// PostgreSQL's 63-byte identifier limit for the channel names derived from it.
const SchemaMaxLen = 48

// ErrInvalidSchema is returned for a schema name that is not a plain
// lower-case identifier.
var ErrInvalidSchema = errors.New("invalid schema name")

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ValidateSchema reports whether name is a plain lower-case identifier that
// pgonce accepts as a schema: letters a-z, digits and underscores, not
// starting with a digit, at most [SchemaMaxLen] bytes, and not in the pg_
// namespace PostgreSQL reserves. Lower case only, so that the quoted and the
// unquoted spelling name the same schema.
func ValidateSchema(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: must not be empty", ErrInvalidSchema)
	case len(name) > SchemaMaxLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrInvalidSchema, quoteShort(name), SchemaMaxLen)
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

// Quote returns name as a quoted SQL identifier. It is the one place where
// pgonce turns a name into SQL text.
func Quote(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// WorkChannel is the channel notified when a pending key is ready.
func WorkChannel(schema string) string { return schema + "_pgonce_work" }

// DoneChannel is the channel notified, with the key as payload, when a key
// reaches a final state.
func DoneChannel(schema string) string { return schema + "_pgonce_done" }

// WorkerID returns base with a random suffix, so that several workers of one
// process write distinct ids into the leases they hold.
func WorkerID(base string) string {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	return base + ":" + hex.EncodeToString(suffix[:])
}
