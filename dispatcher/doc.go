// Package dispatcher runs the calls that clients submit: it claims due
// pending keys, calls each key's provider under a lease, and records the
// outcome.
//
//	d, err := dispatcher.New(client, dispatcher.Config{Concurrency: 32})
//	if err != nil {
//		return err
//	}
//	go func() { _ = d.Run(ctx) }() // blocks until ctx is done, then drains
//
// # Claims and leases
//
// A claim takes up to [Config.BatchSize] due pending rows of the tools in the
// client's registry in one statement with FOR UPDATE SKIP LOCKED, marks them
// in flight under a lease that ends by the database's clock, and commits
// before any provider is called: no transaction is held across a network
// call. The lease lasts the client's [outbox.Config.Lease], and each provider
// call runs under its [outbox.Config.CallTimeout], shorter than the lease, so
// a live worker never outlives its claim. Each claim runs under the
// client's [outbox.Config.StatementTimeout]: a claim stuck on a connection
// whose server vanished is cancelled, its connection dropped, and the next
// claim takes another. Rows of tools this
// process does not register are left for processes that do; rows nobody
// serves for [Config.UnservedAfter] are reported. Tools registered
// [outbox.ToolOpts.InlineOnly] are never claimed nor reported: their
// callers run them with [outbox.Client.Do]. Maintenance (below) still
// resolves their expired leases.
//
// # Outcomes
//
// A response is stored verbatim and the key leaves the queue;
// [outbox.Permanent] is stored as the failure; other errors go back to
// pending after an exponential, jittered backoff until [Config.MaxAttempts],
// after which the key fails with the last error. After an uncertain attempt
// ([outbox.IsAmbiguous]), and after a provider panic, which may come after
// the provider acted, the tool's [outbox.Delivery] decides: retry with the
// same key, look up before writing, or send the key to review.
//
// Outcomes that finish together are recorded in one statement, each fenced
// by its attempt, so a worker whose lease was taken over changes nothing. A
// record statement that fails transiently is tried again on another
// connection for up to 30 seconds, past the lease if need be: a write after
// a takeover changes nothing, and an outcome fenced out so is logged at
// warn. An outcome of 256 KiB or more is recorded alone, beside the
// batches, under a lease it keeps extending.
//
// # Wake-ups and shutdown
//
// Submitting transactions notify; the dispatcher listens and wakes within
// milliseconds of a commit, and polls every [Config.PollInterval] for rows
// whose backoff elapsed or whose notification was lost. The listener
// reconnects after a dropped connection. It holds a pool connection for as
// long as Run runs, so it listens only when the pool keeps another one for
// claims and records: over a pool of one connection (pgxpool MaxConns 1,
// database/sql SetMaxOpenConns(1)) Run logs a warning at start-up and polls
// every PollInterval instead. When Run's context is done it stops
// claiming, lets calls in flight finish for [Config.ShutdownTimeout], records
// them, and returns; calls cut off stay in flight for the reconciler. A pool
// smaller than the 3 connections a dispatcher and waits in one process need
// to listen is named in a warning when Run starts.
//
// Behind a transaction pooler (PgBouncer in transaction mode,
// [outbox.PoolingTransaction]) a LISTEN through the pool hears nothing: the
// client's [outbox.Config.ListenConnectFunc] gives the listener a direct
// connection of its own, or [outbox.Config.NotifyDisabled] makes the
// dispatcher poll; [New] refuses a dispatcher with neither.
//
// # Maintenance
//
// Unless [Config.MaintenanceDisabled], the dispatchers that serve the same
// tools in one schema elect one of themselves, through a row with a lease in
// the schema's pgonce_leader table (safe behind PgBouncer, unlike a session
// advisory lock), and the leader runs a reconciler every
// [Config.MaintenanceInterval]: keys left in flight by a crashed worker are
// resolved, and retention is applied, with no reconciler of your own. A
// leader that stops resigns; one that crashes is replaced once its lease,
// three intervals, expires. Running `pgonce reconcile --once` or another
// reconciler beside it is safe.
package dispatcher
