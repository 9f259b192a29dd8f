// Package httpstatus maps pgonce's outcomes and errors to HTTP responses, so
// that a gateway that takes an agent's tool call over HTTP answers every
// outcome the same way, with the model's observation as the body.
//
// # Mapping
//
// [For] reads what a call of an [outbox.Client] returned, a Result and an
// error, through [outbox.ObservationFor], and answers by the observation's
// status:
//
//	succeeded, this request created the key      201 Created
//	succeeded, a replay                           200 OK, Idempotent-Replayed: true
//	failed (a permanent failure), first or replay 200 OK (replay: Idempotent-Replayed: true)
//	cancelled by an operator                      200 OK
//	in progress (pending, in flight)              202 Accepted, Retry-After
//	needs review                                  202 Accepted, no Retry-After
//	expired (a tombstone)                         410 Gone
//	conflict (same step or key, another action)   409 Conflict
//	invalid arguments, unknown tool               422 Unprocessable Content
//	invalid call, malformed key                   400 Bad Request
//	not found                                     404 Not Found
//	unavailable (lost connection, timeout, …)     503 Service Unavailable, Retry-After
//	any other error                               500 Internal Server Error
//
// A permanent failure is an outcome the request produced (or replays), not an
// error of the gateway, so it is a 200 whose body says "failed"; a gateway
// that wants another status for it checks [outbox.Result.State] first. A
// cancellation is an outcome the same way, the operator's rather than any
// request's, so it is never marked replayed.
// A key in review has been accepted and has no outcome yet, and asking again
// changes nothing until an operator resolves it: 202 without a hint.
//
// The Idempotency-Key draft of the IETF (draft-ietf-httpapi-idempotency-key-header)
// answers a request that is still being processed with 409 and a key reused
// with another payload with 422. pgonce's in-progress key is accepted work
// that will finish without the client, hence 202 with Retry-After; and a
// conflict is with the state of the step, which another action holds (RFC
// 9110's 409), while 422 is kept for content that no state could make
// acceptable: arguments without a canonical form, a tool that does not
// exist. A replay carries Idempotent-Replayed: true, as Stripe's API does.
//
// # Writing a response
//
// [Write] writes the headers, the status code and the observation's JSON:
//
//	res, err := client.SubmitTx(ctx, tx, call) // with the request's other writes
//	if err != nil {
//		_ = tx.Rollback(ctx)
//		_ = httpstatus.Write(w, res, err)
//		return
//	}
//	if err := tx.Commit(ctx); err != nil {
//		_ = httpstatus.Write(w, outbox.Result{}, err) // the key was not claimed
//		return
//	}
//	res, err = client.WaitResult(ctx, res) // created: 201; a duplicate: 200, replayed
//	_ = httpstatus.Write(w, res, err)
//
// WaitResult, not Wait, keeps whether this request created the key, so the
// request that ran the action gets 201 and its duplicates 200 with
// Idempotent-Replayed. A gateway that must not block bounds ctx: a key still
// in progress when ctx ends is a 202 with Retry-After.
package httpstatus
