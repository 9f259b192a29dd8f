// Package ident quotes the SQL identifiers pgonce builds from configuration
// and derives the notification channels and worker ids from them. The schema
// name itself is validated by migrations.ValidateSchema before it gets here.
package ident

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// Quote returns name as a quoted SQL identifier. It is the one place where
// pgonce's runtime turns a name into SQL text (migrations, which imports
// nothing internal, quotes its schema the same way).
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
