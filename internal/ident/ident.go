// Package ident validates and quotes the SQL identifiers pgonce builds from
// configuration: the schema name and the notification channels derived from it.
package ident

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
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
		return fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalidSchema, name, SchemaMaxLen)
	case !schemaPattern.MatchString(name):
		return fmt.Errorf("%w: %q must match %s", ErrInvalidSchema, name, schemaPattern)
	case strings.HasPrefix(name, "pg_"):
		return fmt.Errorf("%w: %q uses the pg_ prefix PostgreSQL reserves", ErrInvalidSchema, name)
	}
	return nil
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
