package outbox

import (
	"reflect"
	"time"
)

// Call describes one intended side-effecting action: the thing that must
// happen exactly once however often it is asked for. Every attempt of the
// same intended action must describe it with the same Call, so that it
// derives the same [Key]; see [DeriveKey] for how, and KEYSPEC.md for the
// exact derivation.
//
// A Call is either a step call, identified by RunID and Step, or a business
// call, identified by Key. Nothing random, no timestamp and no text a model
// wrote should go into any field.
type Call struct {
	// Tenant is an optional namespace. Keys of different tenants never
	// collide, even with equal other fields. At most [CallStringMaxBytes]
	// bytes of valid UTF-8, without NUL bytes (PostgreSQL text cannot hold
	// them).
	Tenant string

	// RunID names the run, workflow or request that owns the action.
	// Required unless Key is set, and then ignored. At most
	// [CallStringMaxBytes] bytes of valid UTF-8, without NUL bytes.
	RunID string

	// Step is the logical step of the action within its run. One step is one
	// action: asking for the same run and step again with a different Tool or
	// different Args is a conflict, not a second action, so parallel tool
	// calls in one turn need distinct steps. Must not be negative; ignored
	// when Key is set.
	Step int64

	// Tool is the registered tool name, e.g. "refund". Required; it must
	// match ^[a-z][a-z0-9_.:-]{0,63}$.
	Tool string

	// Args are the tool's arguments. They must be JSON-serialisable and are
	// canonicalised per RFC 8785 as [Canonicalize] describes: a
	// [json.RawMessage] or []byte is taken as JSON text, anything else is
	// marshalled. nil means JSON null. Numbers must keep their value when
	// canonicalised, which writes the nearest float64 in its shortest
	// round-trip form: 9007199254740993 and 2^60 do not, and [DeriveKey]
	// refuses them with an error matching [ErrNotCanonical]. Send big ids
	// and decimal money as strings.
	Args any

	// Key is an optional explicit business key, such as an order id for a
	// refund. When set, it replaces RunID and Step in the derivation: the
	// action is identified by Tenant, Tool and Key, and Args are checked by
	// fingerprint rather than hashed into the key, so reusing a business key
	// with different arguments is a conflict instead of a new action. At
	// most [CallStringMaxBytes] bytes of valid UTF-8, without NUL bytes.
	Key string

	// NaturalID is an optional deterministic id for providers that cannot
	// deduplicate on our key but can be asked whether an action with this id
	// happened. It is passed to the provider and does not affect the key. At
	// most [CallStringMaxBytes] bytes of valid UTF-8, without NUL bytes.
	// Required for a tool registered [LookupByNaturalID]: without it, a
	// submit returns [ErrInvalidCall].
	NaturalID string

	// Metadata is data that travels with the call but is not part of the
	// action: a trace context, a request id, the user who asked. It is
	// never hashed, so changing it never changes the key; it is stored with
	// the key the first submit writes (a duplicate's metadata is not
	// stored), passed to the provider in [Request.Metadata] and shown by
	// [Client.Inspect]. nil or empty stores nothing. At most
	// [MetadataMaxEntries] entries and [MetadataMaxBytes] bytes as JSON;
	// names must not be empty; names and values must be valid UTF-8
	// without NUL bytes.
	Metadata map[string]string

	// NotBefore, when not zero, schedules the call: a dispatcher claims it
	// no earlier than NotBefore (by the database's clock). It does not
	// affect the key, and only the submit that creates the key schedules
	// it. A time in the past means now.
	NotBefore time.Time

	// Delay, when positive, schedules the call Delay after the submit (by
	// the database's clock), like NotBefore; at most one of the two may be
	// set, and Delay must not be negative.
	Delay time.Duration
}

// Bounds of [Call.Metadata].
const (
	// MetadataMaxEntries is the most entries [Call.Metadata] may hold.
	MetadataMaxEntries = 64
	// MetadataMaxBytes is the most bytes [Call.Metadata] may take as JSON.
	MetadataMaxBytes = 4096
)

// scheduled reports whether c asks to run later than now.
func (c Call) scheduled() bool { return !c.NotBefore.IsZero() || c.Delay > 0 }

// isNilTx reports whether tx is nil: a nil interface (pgx.Tx) or a nil
// pointer (*sql.Tx), including a nil pointer inside a pgx.Tx, whose methods
// would panic.
func isNilTx(tx any) bool {
	if tx == nil {
		return true
	}
	switch v := reflect.ValueOf(tx); v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	default:
		return false
	}
}
