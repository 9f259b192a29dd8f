// Package reconcile resolves in-flight rows whose lease expired, after a
// crash or an ambiguous timeout, and prunes keys past their retention.
package reconcile
