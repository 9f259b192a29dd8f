// Package storagebench holds the storage benchmarks of pgonce: how many bytes
// a finished key and a tombstone take in the key table, and how submit,
// claim, get and prune costs change from ten thousand to ten million
// finished keys. It has no code outside its tests.
//
// Both benchmarks talk to the test database through the public API
// (outbox.NewPgx, SubmitTx, a dispatcher, Get, Prune), each in a schema of
// its own that is dropped at the end, and print a readable block of figures
// followed by one machine-readable line:
//
//	make bench-size   # PGONCE_BENCH_KEYS finished calls, default 100000
//	make bench-scale  # PGONCE_BENCH_SCALE_KEYS finished keys, default 10000000
//
// The scale benchmark builds its large table in bulk inside PostgreSQL, by
// replicating a thousand keys finished through the public API. The one
// statement that knows the key table's columns is in keytable_test.go; it
// must follow every migration that changes them, and the benchmark fails,
// naming the columns, when it no longer does.
package storagebench
