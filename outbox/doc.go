// Package outbox is the core of pgonce: exactly-once effects for
// side-effecting calls, with PostgreSQL as the arbiter. Ask twice, execute
// once.
//
// # Keys
//
// A [Call] describes an intended action: a run id and logical step (or an
// explicit business key), a tool and its arguments. [DeriveKey] turns it into
// a versioned, fixed-length idempotency key over the RFC 8785 canonical form
// of the arguments ([Canonicalize]), so every attempt of the same action gets
// the same key. KEYSPEC.md specifies the derivation for other languages.
//
// # Submitting in your transaction
//
// [Client.SubmitTx] claims the key inside the caller's own transaction, with
// one single-row statement (the key's row is also its outbox entry):
//
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	res, err := client.SubmitTx(ctx, tx, outbox.Call{
//		RunID: runID, Step: 3, Tool: "refund",
//		Args:  map[string]any{"order": 8842, "amount": "42.00"},
//	})
//	...
//	err = tx.Commit()
//
// If the transaction rolls back, so do the key and the row. After commit, a
// dispatcher (package dispatcher) calls the tool's [Provider] with the key.
// A duplicate gets the existing key's [Result]: in progress with a
// retry-after hint, or the stored response replayed byte for byte.
// [ObservationFor] turns any Result and error into what a model should see.
//
// A call that breaks a validation rule returns [ErrInvalidCall] (or
// [ErrNotCanonical], for its arguments) before any SQL runs, so the caller's
// transaction is untouched. A nil, finished or aborted transaction returns
// [ErrInvalidTx], [ErrTxDone] or [ErrTxAborted]; a lock_timeout or
// statement_timeout of the caller's session returns [ErrTimeout].
//
// # Inline
//
// [Client.Do] claims, calls the provider and records the outcome in one call,
// without a dispatcher. [Client.Get] reads a key; [Client.Wait] blocks until
// it is final, and [Client.WaitResult] does so for the key a request
// submitted, keeping whether that request created it (see [Result.Replayed]).
//
// # Providers and delivery
//
// Tools are registered in a [Registry] with a [Delivery] that says how an
// uncertain attempt is made certain: [IdempotentByKey] providers deduplicate
// on the key, [LookupByNaturalID] providers are asked before a retry, and
// [AtMostOnce] providers send the key to review.
//
// # Operating on keys
//
// [Client.List] pages through the keys an operator acts on (pending, in
// flight, failed, in review, cancelled) by state, tool, tenant, run and
// creation time, on an index. [Client.RunSteps] returns a run's steps in step
// order, finished ones included, and [Client.Stats] counts keys per tool
// and state without reading a large table whole. [Client.Cancel] cancels a
// pending key and
// [Client.Retry] runs a failed or cancelled key again; [Client.Resolve]
// decides a key in review. Each is recorded with who and why, and none
// touches a key in flight. [Client.Search] finds keys by what an operator
// knows of a call (an order id in its arguments, a natural id, a business
// key, a run id), and [Client.Inspect] shows every attempt of a key
// ([Inspection.AttemptHistory]). [Call.NotBefore] and [Call.Delay] schedule a
// call; [Call.Metadata] travels with it to the provider without being part
// of its key.
package outbox
