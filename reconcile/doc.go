// Package reconcile resolves in-flight rows whose lease expired — a worker
// crashed, or an attempt ended ambiguously with nobody left to record it —
// by each tool's delivery mode, without ever calling a provider.
//
// Run it on a schedule (a cron entry, a Kubernetes CronJob) with
// [Reconciler.RunOnce], or as a loop inside a service with [Reconciler.Run]:
//
//	r, err := reconcile.New(client, reconcile.Config{Grace: 30 * time.Second})
//	if err != nil {
//		return err
//	}
//	go func() { _ = r.Run(ctx, time.Minute) }()
//
// Keyed rows go back to pending (the provider deduplicates on the key),
// natural-id rows are looked up before anything is written again, and
// at-most-once rows go to review. Rows of tools the process does not register
// are skipped and counted; pending rows nobody picks up are reported. It is
// safe to run beside dispatchers and other reconcilers.
package reconcile
