// Package dispatcher claims pending outbox rows with FOR UPDATE SKIP LOCKED,
// commits the in-flight claim, calls each row's provider under a lease, and
// persists the outcome.
package dispatcher
