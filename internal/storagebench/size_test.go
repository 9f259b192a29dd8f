package storagebench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

const (
	// sizeKeysEnv selects how many calls BenchmarkSize finishes.
	sizeKeysEnv     = "PGONCE_BENCH_KEYS"
	sizeKeysDefault = 100_000

	// Targets of issue 11, heap and indexes together, after VACUUM FULL.
	finishedTargetBytes  = 420
	tombstoneTargetBytes = 300

	// pruneAhead is how far in the future the pruning client's clock runs:
	// past the default retention, before the default tombstone horizon.
	pruneAhead = 60 * 24 * time.Hour
)

// BenchmarkSize measures the bytes a finished key and a tombstone take in
// the key table. It submits PGONCE_BENCH_KEYS refund calls (default
// 100,000) in transactions of a thousand, drains them with a dispatcher
// whose provider answers 60 bytes, and measures the table after VACUUM
// FULL; then it prunes every key into a tombstone with a client whose clock
// runs 60 days ahead (past Retention, before TombstoneRetention) and
// measures again. It also reports the share of HOT updates among those made
// while finishing and while pruning. Run it with -benchtime=1x (make
// bench-size): each iteration builds its table from nothing.
func BenchmarkSize(b *testing.B) {
	keys := envInt(b, sizeKeysEnv, sizeKeysDefault)
	for range b.N {
		report := measureSize(b, keys)
		report.print(os.Stdout)
		b.ReportMetric(perKey(report.Finished.Total(), report.Keys), "B/key")
		b.ReportMetric(perKey(report.Tombstone.Total(), report.Keys), "B/tombstone")
		b.ReportMetric(report.FinishHOTShare*100, "%HOT-finish")
	}
}

// sizeReport is what BenchmarkSize measured.
type sizeReport struct {
	Keys             int64
	Finished         tableSize
	Tombstone        tableSize
	FinishedColumns  []columnSize
	TombstoneColumns []columnSize
	FinishedRow      float64
	// FinishedClean and TombstoneClean report that no older transaction
	// was open when VACUUM FULL ran, so it kept no dead row versions.
	FinishedClean   bool
	TombstoneClean  bool
	TombstoneRow    float64
	FinishHOTShare  float64
	FinishUpdates   int64
	PruneHOTShare   float64
	PruneUpdates    int64
	SubmitDuration  time.Duration
	DrainDuration   time.Duration
	PruneDuration   time.Duration
	ResponseExample string
}

// measureSize finishes keys calls in a fresh schema, turns them into
// tombstones, and measures both.
func measureSize(b *testing.B, keys int) sizeReport {
	b.Helper()
	ctx := context.Background()
	schema := pgoncetest.Schema(b)
	registry := refundRegistry(b)
	report := sizeReport{Keys: int64(keys)}

	// Submit, on a pool of its own: its inserts are counted before the
	// drain begins.
	submitName := newApplicationName("submit")
	submitPool := newPool(b, submitName, 2)
	submitter, err := outbox.NewPgx(submitPool, outbox.Config{Schema: schema, Registry: registry})
	require.NoError(b, err)
	began := time.Now()
	submitted := submitBulk(b, submitter, submitPool, keys)
	report.SubmitDuration = time.Since(began)
	closePool(b, submitPool, submitName)
	beforeFinish := readUpdateCounters(b, schema)

	// Finish every call with a dispatcher.
	drainName := newApplicationName("drain")
	drainPool := newPool(b, drainName, 8)
	finisher, err := outbox.NewPgx(drainPool, outbox.Config{Schema: schema, Registry: registry})
	require.NoError(b, err)
	report.DrainDuration = drain(b, finisher, schema, keys)
	last, err := finisher.Get(ctx, submitted[len(submitted)-1])
	require.NoError(b, err)
	require.Equal(b, outbox.StateSucceeded, last.State)
	require.Len(b, last.Response, refundResponseBytes)
	report.ResponseExample = string(last.Response)
	// Counted whole: Stats estimates the succeeded keys of a table this
	// large.
	var succeeded int64
	require.NoError(b, pgoncetest.Pool(b).QueryRow(ctx, `SELECT count(*) FROM `+ident.Quote(schema)+`.`+ident.Quote(keyTable)+
		` WHERE state = 'succeeded' AND tool = $1`, refundTool).Scan(&succeeded))
	require.Equal(b, int64(keys), succeeded, "every call must have succeeded")
	closePool(b, drainPool, drainName)
	afterFinish := readUpdateCounters(b, schema)
	report.FinishHOTShare, report.FinishUpdates = hotShare(beforeFinish, afterFinish)
	require.GreaterOrEqual(b, report.FinishUpdates, int64(keys), "every finish updates its row: the counters were not flushed")

	report.FinishedClean = vacuumFull(b, schema)
	report.Finished = measureTable(b, schema)
	require.Equal(b, int64(keys), report.Finished.Rows)
	report.FinishedColumns, report.FinishedRow = measureColumns(b, schema)

	// Turn every key into a tombstone.
	pruneName := newApplicationName("prune")
	prunePool := newPool(b, pruneName, 2)
	pruner, err := outbox.NewPgx(prunePool, outbox.Config{
		Schema:   schema,
		Registry: registry,
		NowFunc:  func() time.Time { return time.Now().Add(pruneAhead) },
	})
	require.NoError(b, err)
	began = time.Now()
	pruned, err := pruner.Prune(ctx, nil)
	report.PruneDuration = time.Since(began)
	require.NoError(b, err)
	require.Equal(b, outbox.PruneResult{Keys: int64(keys)}, pruned, "every key, and nothing else, must become a tombstone")
	_, err = pruner.Get(ctx, submitted[0])
	require.ErrorIs(b, err, outbox.ErrExpired)
	closePool(b, prunePool, pruneName)
	afterPrune := readUpdateCounters(b, schema)
	report.PruneHOTShare, report.PruneUpdates = hotShare(afterFinish, afterPrune)

	report.TombstoneClean = vacuumFull(b, schema)
	report.Tombstone = measureTable(b, schema)
	require.Equal(b, int64(keys), report.Tombstone.Rows)
	report.TombstoneColumns, report.TombstoneRow = measureColumns(b, schema)
	return report
}

// print writes the readable block of figures, then one line of JSON after
// "storagebench-size: ".
func (r sizeReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nstorage size: %d refund calls through the public API, %d-byte responses (e.g. %s)\n",
		r.Keys, refundResponseBytes, r.ResponseExample)
	fmt.Fprintf(w, "  submitted in %s (transactions of %d), drained in %s, pruned in %s\n",
		r.SubmitDuration.Round(time.Millisecond), submitsPerTx, r.DrainDuration.Round(time.Millisecond), r.PruneDuration.Round(time.Millisecond))
	block := func(title string, s tableSize, target int, columns []columnSize, row float64, clean bool) {
		fmt.Fprintf(w, "  %s, after VACUUM FULL:\n", title)
		if !clean {
			fmt.Fprintf(w, "    (an older transaction was open: VACUUM FULL may have kept dead row versions; measure again)\n")
		}
		fmt.Fprintf(w, "    %-32s %12s %10s\n", "relation", "bytes", "bytes/key")
		fmt.Fprintf(w, "    %-32s %12d %10.1f\n", "heap (incl. TOAST)", s.Heap+s.Toast, perKey(s.Heap+s.Toast, r.Keys))
		for _, index := range s.Indexes {
			fmt.Fprintf(w, "    %-32s %12d %10.1f\n", index.Name, index.Bytes, perKey(index.Bytes, r.Keys))
		}
		total := perKey(s.Total(), r.Keys)
		verdict := "met"
		if total > float64(target) {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "    %-32s %12d %10.1f   target <= %d: %s\n", "total", s.Total(), total, target, verdict)
		fmt.Fprintf(w, "    a row averages %.1f bytes as a datum (tuple header included); its columns:\n     ", row)
		for i, c := range columns {
			if i > 0 && i%6 == 0 {
				fmt.Fprint(w, "\n     ")
			}
			fmt.Fprintf(w, " %s %.1f", c.Name, c.Bytes)
		}
		fmt.Fprintln(w)
	}
	block("finished keys", r.Finished, finishedTargetBytes, r.FinishedColumns, r.FinishedRow, r.FinishedClean)
	block("tombstones", r.Tombstone, tombstoneTargetBytes, r.TombstoneColumns, r.TombstoneRow, r.TombstoneClean)
	fmt.Fprintf(w, "  HOT updates while finishing: %.1f%% of %d (%.2f updates per key)\n",
		r.FinishHOTShare*100, r.FinishUpdates, float64(r.FinishUpdates)/float64(r.Keys))
	fmt.Fprintf(w, "  HOT updates while pruning:   %.1f%% of %d (%.2f updates per key)\n",
		r.PruneHOTShare*100, r.PruneUpdates, float64(r.PruneUpdates)/float64(r.Keys))

	perKeyOf := func(s tableSize, columns []columnSize, row float64) map[string]any {
		indexes := map[string]float64{}
		for _, index := range s.Indexes {
			indexes[index.Name] = perKey(index.Bytes, r.Keys)
		}
		columnBytes := map[string]float64{}
		for _, c := range columns {
			columnBytes[c.Name] = c.Bytes
		}
		return map[string]any{
			"heap":    perKey(s.Heap+s.Toast, r.Keys),
			"indexes": indexes,
			"total":   perKey(s.Total(), r.Keys),
			"row":     row,
			"columns": columnBytes,
		}
	}
	line, _ := json.Marshal(map[string]any{
		"keys":             r.Keys,
		"finished":         perKeyOf(r.Finished, r.FinishedColumns, r.FinishedRow),
		"tombstone":        perKeyOf(r.Tombstone, r.TombstoneColumns, r.TombstoneRow),
		"hot_share_finish": r.FinishHOTShare,
		"hot_share_prune":  r.PruneHOTShare,
		"updates_finish":   r.FinishUpdates,
		"updates_prune":    r.PruneUpdates,
		"clean":            r.FinishedClean && r.TombstoneClean,
	})
	fmt.Fprintf(w, "storagebench-size: %s\n", line)
}
