// Command compare measures pgonce beside river on one PostgreSQL database,
// through both libraries' public APIs, with a no-op provider and a no-op
// worker: the drain of a backlog, the enqueue inside a caller's transaction
// beside a business row, and the end-to-end path with commit-to-call
// latency, closed loop and at paced loads. It also runs pgbench over the
// two statements a pgonce claim and batch completion need (pgonce's
// physical model), so that every figure can be read against that floor.
//
// Every measurement runs once per round; the rounds alternate the order of
// the variants, so that a machine that slows down or speeds up during the
// run moves both sides alike. It prints medians, spreads (min–max) and the
// ratios pgonce ÷ river (each ratio the median of the rounds' own ratios),
// and writes every measurement to a CSV file. Beside each rate it gives
// the WAL, the heap allocations and, when the server runs on this machine,
// the server's CPU time per call, job or transaction.
//
// Each library runs on both of pgonce's drivers where that applies: pgx,
// and database/sql through pgx's stdlib driver (river's
// riverdatabasesql, which works jobs in poll-only mode).
//
// Run it with `make bench-compare` from the repository root. The settings
// are environment variables (see [loadSettings]); PGONCE_COMPARE_QUICK=1
// selects a tiny profile for smoke runs.
//
// pgonce lives in one schema (migrated with migrations.Up), river in
// another (migrated with rivermigrate), the business table and the pgbench
// model in two more; all four are dropped at the end.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"time"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("compare: ")
	settings, err := loadSettings()
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, settings); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, s settings) error {
	env, err := newEnvironment(ctx, s)
	if err != nil {
		return err
	}
	defer env.close()
	fmt.Println(env.describe())

	results := &resultSet{}
	began := time.Now()
	for round := range s.rounds {
		forward := round%2 == 0
		log.Printf("round %d of %d (%s order)", round+1, s.rounds, map[bool]string{true: "forward", false: "reverse"}[forward])
		for _, phase := range s.phases {
			var phaseResults []result
			switch phase {
			case phaseDrain:
				phaseResults, err = env.runDrain(ctx, round, forward)
			case phaseEnqueue:
				phaseResults, err = env.runEnqueue(ctx, round, forward)
			case phaseEndToEnd:
				phaseResults, err = env.runEndToEnd(ctx, round, forward)
			case phasePaced:
				phaseResults, err = env.runPaced(ctx, round, forward)
			case phaseFloor:
				if s.measures(floorPgbench) {
					phaseResults, err = env.runFloor(ctx, round)
				}
			}
			for _, r := range phaseResults {
				log.Printf("  %s", r)
			}
			results.add(phaseResults...)
			if err != nil {
				// What was measured still goes to the CSV, for the record.
				if csvErr := results.writeCSV(s.csvPath, results.summarize(s)); csvErr == nil {
					log.Printf("wrote the measurements so far to %s", s.csvPath)
				}
				return fmt.Errorf("round %d, %s: %w", round+1, phase, err)
			}
		}
	}
	log.Printf("%d rounds in %s", s.rounds, time.Since(began).Round(time.Second))

	summary := results.summarize(s)
	fmt.Print(summary.text(env))
	if err := results.writeCSV(s.csvPath, summary); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s\n", s.csvPath)
	return nil
}

// measured returns the variants the settings measure, named by name.
func measured[T any](s settings, variants []T, name func(T) string) []T {
	return slices.DeleteFunc(slices.Clone(variants), func(v T) bool { return !s.measures(name(v)) })
}

// order returns variants as given in a forward round and reversed in the
// others.
func order[T any](variants []T, forward bool) []T {
	out := slices.Clone(variants)
	if !forward {
		slices.Reverse(out)
	}
	return out
}
