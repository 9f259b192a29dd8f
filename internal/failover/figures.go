package failover

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
)

// Figures are what a failover cost a campaign, as [Measure] counts them
// once all work is done.
type Figures struct {
	// Mode names the campaign: its replication mode, and whether its tools
	// claim with [outbox.ToolOpts.ReplicatedClaim].
	Mode string
	// Calls counts the calls submitted or run; Committed those whose
	// transaction committed.
	Calls, Committed int
	// Duplicates counts effects beyond the first of a call, per tool.
	Duplicates map[string]int
	// Lost counts committed calls whose key the new primary does not hold,
	// and LostActed those of them whose provider had acted; LostCalls names
	// the first ten, and LostKeys are their keys.
	Lost, LostActed int
	LostCalls       []string
	LostKeys        []string
	// ClaimsForgotten counts provider calls made under a claim that the new
	// primary does not hold: an attempt the new primary claimed again, or
	// one past the attempt it holds.
	ClaimsForgotten int
	// OutcomesDropped counts calls whose success a caller was told (by Do
	// or Wait) that the new primary does not hold, byte for byte.
	OutcomesDropped int
	// Reviewed counts keys in review.
	Reviewed int
	// Waits counts the waits run across the failover, and WaitErrors those
	// that ended with an error instead of the key's outcome.
	Waits, WaitErrors int
	// Promotion is the time from the old primary's stop until the standby
	// accepted writes; FirstClaim until the first provider call of a claim
	// on the promoted standby.
	Promotion, FirstClaim time.Duration
}

// Duplicated returns the duplicates of every tool together.
func (f *Figures) Duplicated() int {
	n := 0
	for _, d := range f.Duplicates {
		n += d
	}
	return n
}

// String returns the figures on one line:
//
//	failover: mode=M calls=N committed=N duplicates=N (keyed=N natural=N once=N) lost=N (acted=N) ...
func (f *Figures) String() string {
	return fmt.Sprintf("failover: mode=%s calls=%d committed=%d duplicates=%d (keyed=%d natural=%d once=%d) lost=%d (acted=%d) "+
		"claims_forgotten=%d outcomes_dropped=%d review=%d waits=%d wait_errors=%d promotion=%s first_claim=%s",
		f.Mode, f.Calls, f.Committed, f.Duplicated(), f.Duplicates[faults.ToolKeyed], f.Duplicates[faults.ToolNatural],
		f.Duplicates[faults.ToolOnce], f.Lost, f.LostActed, f.ClaimsForgotten, f.OutcomesDropped, f.Reviewed,
		f.Waits, f.WaitErrors, f.Promotion.Round(time.Millisecond), f.FirstClaim.Round(time.Millisecond))
}

// TableHeader and Row print figures as a Markdown table.
const TableHeader = "| mode | calls | duplicates (keyed / natural / once) | lost keys (acted) | claims forgotten | " +
	"known outcomes dropped | in review | waits errored | promotion | first claim |\n" +
	"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"

// Row returns the figures as a row of the [TableHeader] table.
func (f *Figures) Row() string {
	return fmt.Sprintf("| %s | %d | %d (%d / %d / %d) | %d (%d) | %d | %d | %d | %d of %d | %s | %s |",
		f.Mode, f.Calls, f.Duplicated(), f.Duplicates[faults.ToolKeyed], f.Duplicates[faults.ToolNatural],
		f.Duplicates[faults.ToolOnce], f.Lost, f.LostActed, f.ClaimsForgotten, f.OutcomesDropped, f.Reviewed,
		f.WaitErrors, f.Waits, f.Promotion.Round(10*time.Millisecond), f.FirstClaim.Round(10*time.Millisecond))
}

// Measure counts what the history's calls became: store is the new
// primary, whose schema holds pgonce's tables; ledger holds the tables of
// [faults.CreateLedger] in ledgerSchema (a database that did not fail
// over, as the downstream systems it models do not). The caller sets Mode,
// the waits and the times.
func Measure(ctx context.Context, store *pgxpool.Pool, schema string, ledger *pgxpool.Pool, ledgerSchema string, h *faults.History) (*Figures, error) {
	type keyRow struct {
		state    string
		response []byte
		attempt  int
	}
	keys := map[string]keyRow{}
	rows, err := store.Query(ctx, `SELECT 'k1_' || encode(key, 'hex'), state::text, response, attempt
		FROM `+ident.Quote(schema)+`.pgonce_key`)
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	for rows.Next() {
		var key string
		var row keyRow
		if err := rows.Scan(&key, &row.state, &row.response, &row.attempt); err != nil {
			return nil, fmt.Errorf("read keys: %w", err)
		}
		keys[key] = row
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}

	effects := map[string]int{}
	l := ident.Quote(ledgerSchema)
	rows, err = ledger.Query(ctx, `SELECT key, count(*) FROM `+l+`.faults_effect GROUP BY key`)
	if err != nil {
		return nil, fmt.Errorf("read effects: %w", err)
	}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return nil, fmt.Errorf("read effects: %w", err)
		}
		effects[key] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read effects: %w", err)
	}

	f := &Figures{Duplicates: map[string]int{}}
	// A provider call of an attempt the new primary does not hold, or holds
	// from a claim of its own: the same attempt called again.
	rows, err = ledger.Query(ctx, `SELECT key, attempt FROM `+l+`.faults_attempt ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read attempts: %w", err)
	}
	called := map[string]map[int]bool{}
	for rows.Next() {
		var key string
		var attempt int
		if err := rows.Scan(&key, &attempt); err != nil {
			return nil, fmt.Errorf("read attempts: %w", err)
		}
		if called[key] == nil {
			called[key] = map[int]bool{}
		}
		row, ok := keys[key]
		if called[key][attempt] || !ok || row.attempt < attempt {
			f.ClaimsForgotten++
		}
		called[key][attempt] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read attempts: %w", err)
	}

	for _, e := range h.Entries() {
		key := string(e.Key)
		f.Calls++
		if n := effects[key]; n > 1 {
			f.Duplicates[e.Call.Tool] += n - 1
		}
		row, exists := keys[key]
		if e.Fate == faults.FateCommitted {
			f.Committed++
			if !exists {
				f.Lost++
				if len(f.LostCalls) < 10 {
					f.LostCalls = append(f.LostCalls, fmt.Sprintf("%s step %d (%s)", e.Call.RunID, e.Call.Step, e.Call.Tool))
					f.LostKeys = append(f.LostKeys, key)
				}
				if effects[key] > 0 {
					f.LostActed++
				}
			}
		}
		if row.state == "needs_review" {
			f.Reviewed++
		}
		for _, seen := range e.Observed {
			if row.state != "succeeded" || !bytes.Equal(seen, row.response) {
				f.OutcomesDropped++
				break
			}
		}
	}
	return f, nil
}

// CopyLedger copies the ledger's tables from ledgerSchema of ledger into
// schema of store, which must not hold them yet, so that
// [faults.Check] can read the store and the ledger through one pool.
func CopyLedger(ctx context.Context, ledger *pgxpool.Pool, ledgerSchema string, store *pgxpool.Pool, schema string) error {
	if err := faults.CreateLedger(ctx, store, schema); err != nil {
		return err
	}
	for _, table := range []string{"faults_attempt", "faults_effect", "faults_idem"} {
		var buf bytes.Buffer
		conn, err := ledger.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("copy %s: %w", table, err)
		}
		_, err = conn.Conn().PgConn().CopyTo(ctx, &buf, `COPY `+ident.Quote(ledgerSchema)+`.`+table+` TO STDOUT`)
		conn.Release()
		if err != nil {
			return fmt.Errorf("copy %s out: %w", table, err)
		}
		conn, err = store.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("copy %s: %w", table, err)
		}
		_, err = conn.Conn().PgConn().CopyFrom(ctx, strings.NewReader(buf.String()), `COPY `+ident.Quote(schema)+`.`+table+` FROM STDIN`)
		conn.Release()
		if err != nil {
			return fmt.Errorf("copy %s in: %w", table, err)
		}
	}
	return nil
}
