// Package oncetest helps a service test its own use of pgonce, against a
// real PostgreSQL, the way pgonce tests itself: no database mocks, a
// freshly migrated schema per test, and due calls run synchronously
// instead of by a dispatcher in the background.
//
//	func TestRefundHandler(t *testing.T) {
//		db := openTestDB(t) // your *sql.DB; see "The database" below
//		clock := oncetest.NewClock(time.Time{})
//		refunds := &oncetest.Recorder{}
//		registry := outbox.NewRegistry()
//		_ = registry.Register("refund", refunds, outbox.IdempotentByKey)
//		client, _ := outbox.New(db, outbox.Config{
//			Schema:   oncetest.Schema(t, db),
//			Registry: registry,
//			NowFunc:  clock.Now,
//		})
//
//		callTheHandlerTwice(t, client) // submits the same refund twice
//
//		if _, err := oncetest.Drain(t.Context(), client, nil); err != nil {
//			t.Fatal(err)
//		}
//		oncetest.RequireCalledOnce(t, refunds, "refund", map[string]any{"order": 8842, "amount": "42.00"})
//	}
//
// # The database
//
// The package opens no connection of its own: tests bring their database,
// a *sql.DB (pgx's stdlib driver) or a *pgxpool.Pool, usually from a URL
// in an environment variable of their choosing, and fail when it cannot be
// reached. [Schema] (or [SchemaPgx]) creates a schema unique to the test,
// migrates it and drops it when the test ends, so tests run in parallel
// over one database and leave nothing behind. The role needs the right to
// create schemas in that database.
//
// # Running due calls
//
// [Drain] claims and runs every due call of the client's registered tools,
// one at a time, in the calling goroutine, until none is due, and records
// each outcome exactly as a dispatcher would: stored responses, permanent
// failures, retries with backoff, review after an uncertain attempt. It
// claims as a dispatcher does, through the same code, so it honours a
// tool's pause, limits and slow-down. A retried call is due again only
// after its backoff, so Drain leaves it pending; advance a [Clock] past the
// backoff and drain again.
//
// # Recording calls
//
// A [Recorder] is an [outbox.Provider] that remembers every request it
// receives and answers through its RespondFunc. [RequireCalledOnce] fails
// the test unless a tool was called exactly once with the given arguments,
// compared in their canonical (RFC 8785) form, so key order and number
// spelling do not matter.
//
// # Time
//
// A [Clock] is a fake clock for [outbox.Config.NowFunc]. With it, every
// timestamp pgonce writes or compares through that client (submits,
// claims of Drain, leases, backoffs, retention and pruning) follows the
// clock instead of the database's, so a test can move 31 days forward and
// watch a key become a tombstone. Dispatchers and reconcilers over that
// client claim and lease by the clock too, but they wait in real time (a
// poll, a notification) to claim what a moved clock made due: drive a test
// that moves the clock with Drain, which claims at once.
package oncetest
