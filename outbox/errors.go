package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/migrations"
)

// ErrKeyConflict is returned by [Client.SubmitTx], [Client.Submit] and
// [Client.Do] when the key or the logical step is already taken by another
// request: the same explicit key with other arguments or another tool, or the
// same run and step asked again with another tool or other arguments. The
// error is a [*KeyConflictError]. Nothing is written and nothing runs.
var ErrKeyConflict = errors.New("key conflict")

// ErrInProgress is returned by [Client.Do] when another attempt holds the key,
// and by [Client.Wait] and [Client.WaitResult], beside ctx's error, when ctx
// ends while the key is pending or in flight; the returned [Result] says
// when to ask again. The error is an [*InProgressError].
var ErrInProgress = errors.New("in progress, retry later")

// ErrNotFound is returned by [Client.Get] and [Client.Wait] for a key that
// the database does not hold: never submitted, submitted in a transaction
// that has not committed or rolled back, or committed on a primary that
// failed over to a standby that never received the commit. Wait's error
// names these causes and matches ErrNotFound.
var ErrNotFound = errors.New("key not found")

// ErrExpired is returned for a key that outlived its retention: only its
// tombstone remains. The error is an [*ExpiredError] carrying the completion
// time, and every call returns it with the tombstone's [Result] (state
// [StateExpired]). Nothing runs again.
var ErrExpired = errors.New("key expired")

// ErrUnknownTool is returned by submits and [Client.Do] for a tool that is not
// in the client's [Registry]. Nothing is written.
var ErrUnknownTool = errors.New("unknown tool")

// ErrInvalidRegistration is returned by [Registry.Register] for a tool that
// cannot be registered.
var ErrInvalidRegistration = errors.New("invalid tool registration")

// ErrTxRequired is returned by the Call method of a [Transactional] tool's
// provider ([TxProviderFunc], or one given to [RegisterTx]): such a
// provider runs only in the transaction that pgonce opens for its attempt,
// never through [Provider.Call].
var ErrTxRequired = errors.New("a transactional provider runs only in a transaction")

// ErrTxType is returned by [Client.Do], and recorded as the last error of
// a dispatcher's attempt, for a [Transactional] tool whose provider takes
// another transaction type than the client's (a [TxProviderFunc] of pgx.Tx
// run by a [New] client, say). Nothing runs and nothing is written by Do;
// a dispatcher's attempt changes nothing and is tried again.
var ErrTxType = errors.New("transactional provider takes another transaction type than the client's")

// ErrTxTimeout is the error of an attempt of a [Transactional] tool whose
// transaction hit a statement or lock timeout (SQLSTATE 57014, 55P03), or
// whose provider held it longer than [Config.CallTimeout]. The transaction
// was rolled back, effect included, and the key is tried again: a later
// [Client.Do] or a dispatcher runs it. [Client.Do] returns it wrapped in
// [ErrProviderFailed].
var ErrTxTimeout = attempt.ErrTxTimeout

// ErrTxClosed is the error of an attempt of a [Transactional] tool whose
// provider committed or rolled back the transaction itself. Its effect may
// then have committed without its outcome, so the key goes to
// [StateNeedsReview] with this error as its last error, and [Client.Do]
// returns it beside the key's Result.
var ErrTxClosed = attempt.ErrTxClosed

// ErrInvalidConfig is returned by [New] and [NewPgx] for an invalid [Config],
// and for a nil db or pool.
var ErrInvalidConfig = errors.New("invalid config")

// ErrInvalidSchema is returned by [New] and [NewPgx] for a schema name that is
// not a plain lower-case identifier.
var ErrInvalidSchema = errInvalidSchema()

// ErrNotPgxStdlib is returned by [New] for a *sql.DB opened with a driver
// other than pgx's stdlib driver.
var ErrNotPgxStdlib = errNotPgxStdlib()

// ErrSerialization is returned by [Client.SubmitTx] when PostgreSQL aborted
// the caller's REPEATABLE READ or SERIALIZABLE transaction because another
// transaction claimed the same key first (SQLSTATE 40001) or by a deadlock
// (40P01). Roll back and retry the whole transaction: the retry sees the
// winner's key.
var ErrSerialization = errSerialization()

// ErrInvalidTx is returned by [Client.SubmitTx] for a nil transaction: a nil
// *sql.Tx or pgx.Tx. Nothing is written; pass the transaction the call
// belongs to, or use [Client.Submit] to write in a transaction of its own.
var ErrInvalidTx = errors.New("invalid transaction: SubmitTx needs the caller's open transaction, got nil")

// ErrTimeout is returned by [Client.SubmitTx], [Client.Submit], [Client.Get]
// and the other calls that run statements when PostgreSQL cancelled one under
// the session's lock_timeout (SQLSTATE 55P03) or statement_timeout (57014):
// typically a SubmitTx waiting for a concurrent transaction that claimed the
// same key and has not ended. In the caller's transaction, PostgreSQL has
// aborted the transaction: roll it back and retry it, perhaps with a longer
// timeout. A statement cancelled because the caller's ctx ended returns ctx's
// error instead.
var ErrTimeout = errTimeout()

// ErrTxAborted is returned by [Client.SubmitTx] for a transaction that an
// earlier failed statement already aborted (SQLSTATE 25P02): PostgreSQL runs
// nothing more in it. Nothing is written; roll the transaction back and retry
// it from the start.
var ErrTxAborted = errTxAborted()

// ErrTxDone is returned by [Client.SubmitTx] for a transaction that has
// already committed or rolled back (database/sql's sql.ErrTxDone, pgx's
// pgx.ErrTxClosed). Nothing is written; submit in an open transaction.
var ErrTxDone = errTxDone()

// ErrProviderFailed is returned by [Client.Do] when the provider failed in a
// way that may be retried. The key stays pending: a dispatcher or a later Do
// retries it.
var ErrProviderFailed = errors.New("provider failed, retry later")

// ErrNotMigrated is returned by [Client.CheckSchema], and by every operation
// of a [Client], a dispatcher or a reconciler, when the client's schema is
// missing or migrated by an older build: a statement named a table, a column
// or a type the schema lacks. The message names the schema, the version
// applied to it, the version this build needs and the fix, `pgonce migrate
// up --schema NAME` or migrations.Up. Nothing was written.
var ErrNotMigrated = errNotMigrated()

// KeyConflictError details an [ErrKeyConflict].
type KeyConflictError struct {
	// Key is the key the request derived.
	Key Key
	// ExistingKey is the key that holds the scope. It equals Key when an
	// explicit key was reused with another request.
	ExistingKey Key
	// Fingerprint is the request's fingerprint (tool and canonical args).
	Fingerprint string
	// ExistingFingerprint is the fingerprint stored with ExistingKey. It is
	// empty when ExistingKey is a step call's: such a key hashes its tool and
	// arguments itself, and no fingerprint is stored beside it.
	ExistingFingerprint string
	// ExistingTool is the tool stored with ExistingKey.
	ExistingTool string
}

// Error describes the conflict.
func (e *KeyConflictError) Error() string {
	if e.ExistingFingerprint == "" {
		return fmt.Sprintf("key conflict: request fingerprint %s, but %s already holds tool %q in the same scope",
			e.Fingerprint, e.ExistingKey, e.ExistingTool)
	}
	return fmt.Sprintf("key conflict: request fingerprint %s, but %s already holds tool %q with fingerprint %s",
		e.Fingerprint, e.ExistingKey, e.ExistingTool, e.ExistingFingerprint)
}

// Is matches [ErrKeyConflict].
func (e *KeyConflictError) Is(target error) bool { return target == ErrKeyConflict }

// ExpiredError details an [ErrExpired].
type ExpiredError struct {
	// Key is the expired key.
	Key Key
	// CompletedAt is when the key's action completed.
	CompletedAt time.Time
}

// Error says when the action ran.
func (e *ExpiredError) Error() string {
	return fmt.Sprintf("key expired: %s executed at %s", e.Key, e.CompletedAt.UTC().Format(time.RFC3339))
}

// Is matches [ErrExpired].
func (e *ExpiredError) Is(target error) bool { return target == ErrExpired }

// InProgressError details an [ErrInProgress].
type InProgressError struct {
	// Key is the key in progress.
	Key Key
	// RetryAfter suggests when to ask again.
	RetryAfter time.Duration
}

// Error says when to retry.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("key %s in progress, retry after %s", e.Key, e.RetryAfter)
}

// Is matches [ErrInProgress].
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// The errors the store returns are the ones users match, shared by value.
// Functions, as io/fs's errInvalid and its siblings are, keep the internal
// packages out of the public declarations.

func errInvalidSchema() error { return migrations.ErrInvalidSchema }
func errNotPgxStdlib() error  { return store.ErrNotPgxStdlib }
func errSerialization() error { return store.ErrSerialization }
func errTimeout() error       { return store.ErrTimeout }
func errTxAborted() error     { return store.ErrTxAborted }
func errTxDone() error        { return store.ErrTxDone }
func errNotMigrated() error   { return store.ErrNotMigrated }

// IsTransient reports whether err is a failure of the database that the
// same operation may survive when it is asked again: the connection was lost
// or could not be had (a killed backend, a restarting or unreachable server,
// a network cut, a statement deadline, no free connection in the pool), or
// PostgreSQL refused for the moment (too many connections, a serialization
// failure, a deadlock, a statement_timeout, a lock_timeout or a cancel
// request). Nothing was decided for the key: ask again with the same call.
// The caller's own context being done is not transient, and neither is an
// error in the call or its data, nor any of this package's sentinel errors
// but [ErrTimeout] and [ErrSerialization].
//
// Extensions over the client (an HTTP middleware answering 503, a retry
// loop) use it to tell "try again" from "give up".
func IsTransient(err error) bool { return store.IsTransient(err) }

// ErrInvalidParams is returned by [Client.Cancel], [Client.Retry] and
// [Client.List] for malformed parameters: a By or Reason that is empty, too
// long, not valid UTF-8 or holds a NUL byte; a state that cannot be listed,
// a limit out of range or a cursor that is not one [Client.List] returned.
// It is returned before any SQL runs; nothing is changed.
var ErrInvalidParams = errors.New("invalid params")

// ErrNotCancellable is returned by [Client.Cancel] for a key that is not
// pending: only a key no attempt holds can be cancelled. The error is a
// [*KeyStateError]. Nothing is changed.
var ErrNotCancellable = errors.New("key is not pending")

// ErrNotRetryable is returned by [Client.Retry] for a key that is neither
// failed nor cancelled. The error is a [*KeyStateError]. Nothing is changed.
var ErrNotRetryable = errors.New("key is neither failed nor cancelled")

// ErrNotClaimed is returned by [Client.CompleteTx] for a Result that is not
// the in-flight claim [Client.ClaimTx] made in the same transaction.
// Nothing is written.
var ErrNotClaimed = errors.New("key not claimed by this transaction")

// ErrTransactionPooling is returned, beside [ErrInvalidConfig], by [NewPgx]
// and [Client.CheckSchema] for a client with [PoolingTransaction] over a
// pool that keeps prepared statements across transactions, and by the
// dispatcher's New for a dispatcher that would LISTEN through a
// transaction pooler: session state that a transaction pooler does not
// keep. The error names the setting that fixes it.
var ErrTransactionPooling = errors.New("configuration needs session state that a transaction pooler does not keep")

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

// ErrInvalidResolution is returned by [Client.Resolve] for a malformed
// resolution: an unknown action, a response or failure that is missing, not
// JSON or not allowed for the action, or a By or Reason that is empty, too
// long, not valid UTF-8 or holds a NUL byte. It is returned before any SQL
// runs; nothing is changed.
var ErrInvalidResolution = errors.New("invalid resolution")

// ErrNotNeedsReview is returned by [Client.Resolve] for a key that is not in
// needs review. The error is a [*NotNeedsReviewError]. Nothing is changed.
var ErrNotNeedsReview = errors.New("key is not in needs review")
