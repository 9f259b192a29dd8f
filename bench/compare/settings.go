package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The phases of a round, in the order they run.
const (
	phaseDrain    = "drain"
	phaseEnqueue  = "enqueue"
	phaseEndToEnd = "e2e"
	phasePaced    = "paced"
	phaseFloor    = "floor"
)

var allPhases = []string{phaseDrain, phaseEnqueue, phaseEndToEnd, phasePaced, phaseFloor}

// settings are the run's sizes and places, read from the environment.
type settings struct {
	databaseURL string
	quick       bool
	rounds      int
	phases      []string
	// variants, when not empty, are the only variants measured (by name,
	// as the output prints them); the others are left out of every phase.
	variants []string

	// drainCalls is how many due calls (and jobs) each drain runs.
	drainCalls int
	// enqueueTx is how many caller transactions each enqueue block commits,
	// at each of enqueueClients.
	enqueueTx      int
	enqueueClients []int
	// e2eCalls is how many calls the end-to-end phase submits, from
	// e2eCallers goroutines.
	e2eCalls   int
	e2eCallers int
	// pacedRates are the loads of the paced phase, in caller transactions
	// a second, each held for pacedSeconds.
	pacedRates   []int
	pacedSeconds int

	// floorRows is how many due rows the pgbench model drains, floorClients
	// its pgbench clients and floorBatch the rows each claim takes.
	floorRows    int
	floorClients int
	floorBatch   int
	pgbench      string

	// maxConns bounds the pgx pool and the database/sql pool each.
	maxConns int
	// timeout bounds every wait of one measurement.
	timeout time.Duration
	csvPath string
	keep    bool
	// checkpoint runs a CHECKPOINT before every timed section, so that no
	// measurement shares the machine with the writes of one begun by the
	// measurements before it.
	checkpoint bool
}

// loadSettings reads the settings from the environment:
//
//	PGONCE_COMPARE_DATABASE_URL  database (else PGONCE_TEST_DATABASE_URL, else the local server)
//	PGONCE_COMPARE_QUICK=1       the smoke profile: every size below much smaller
//	PGONCE_COMPARE_ROUNDS        rounds (default 5; quick 2)
//	PGONCE_COMPARE_PHASES        phases to run, comma-separated (default drain,enqueue,e2e,paced,floor)
//	PGONCE_COMPARE_VARIANTS      variants to run, by name, comma-separated (default every one)
//	PGONCE_COMPARE_DRAIN         calls per drain (default 40000; quick 2000)
//	PGONCE_COMPARE_ENQUEUE       transactions per enqueue block (default 3000; quick 150)
//	PGONCE_COMPARE_CLIENTS       enqueue clients, comma-separated (default 1,8,16)
//	PGONCE_COMPARE_E2E           calls submitted end to end (default 20000; quick 800)
//	PGONCE_COMPARE_E2E_CALLERS   submitting goroutines end to end and paced (default 16)
//	PGONCE_COMPARE_PACED_RATES   paced loads, transactions a second, comma-separated (default 500,2000,5000)
//	PGONCE_COMPARE_PACED_SECONDS seconds each paced load lasts (default 10; quick 2)
//	PGONCE_COMPARE_FLOOR_ROWS    rows the pgbench model drains (default 200000; quick 10000)
//	PGONCE_COMPARE_FLOOR_CLIENTS pgbench clients (default 4)
//	PGONCE_COMPARE_FLOOR_BATCH   rows per pgbench claim (default 500)
//	PGONCE_COMPARE_PGBENCH       pgbench binary (default: PATH, then /usr/lib/postgresql/*/bin)
//	PGONCE_COMPARE_CONNS         connections per pool (default 24)
//	PGONCE_COMPARE_TIMEOUT       bound on each measurement's waits (default 10m)
//	PGONCE_COMPARE_CSV           CSV output (default out/compare.csv, under bench/)
//	PGONCE_COMPARE_KEEP=1        keep the schemas instead of dropping them
//	PGONCE_COMPARE_CHECKPOINT=0  no CHECKPOINT before each timed section (it needs pg_checkpoint or a superuser)
func loadSettings() (settings, error) {
	s := settings{
		databaseURL: cmp.Or(os.Getenv("PGONCE_COMPARE_DATABASE_URL"), os.Getenv("PGONCE_TEST_DATABASE_URL"),
			"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		quick: envBool("PGONCE_COMPARE_QUICK"),
		keep:  envBool("PGONCE_COMPARE_KEEP"),
		// On unless PGONCE_COMPARE_CHECKPOINT says false.
		checkpoint: os.Getenv("PGONCE_COMPARE_CHECKPOINT") == "" || envBool("PGONCE_COMPARE_CHECKPOINT"),
	}
	pick := func(full, quick int) int {
		if s.quick {
			return quick
		}
		return full
	}
	var errs []error
	intVar := func(name string, fallback int) int {
		v, err := envInt(name, fallback)
		errs = append(errs, err)
		return v
	}
	s.rounds = intVar("PGONCE_COMPARE_ROUNDS", pick(5, 2))
	s.drainCalls = intVar("PGONCE_COMPARE_DRAIN", pick(40_000, 2_000))
	s.enqueueTx = intVar("PGONCE_COMPARE_ENQUEUE", pick(3_000, 150))
	s.e2eCalls = intVar("PGONCE_COMPARE_E2E", pick(20_000, 800))
	s.e2eCallers = intVar("PGONCE_COMPARE_E2E_CALLERS", 16)
	s.pacedSeconds = intVar("PGONCE_COMPARE_PACED_SECONDS", pick(10, 2))
	s.floorRows = intVar("PGONCE_COMPARE_FLOOR_ROWS", pick(200_000, 10_000))
	s.floorClients = intVar("PGONCE_COMPARE_FLOOR_CLIENTS", 4)
	s.floorBatch = intVar("PGONCE_COMPARE_FLOOR_BATCH", 500)
	s.maxConns = intVar("PGONCE_COMPARE_CONNS", 24)

	clients, err := envInts("PGONCE_COMPARE_CLIENTS", []int{1, 8, 16})
	errs = append(errs, err)
	s.enqueueClients = clients
	s.pacedRates, err = envInts("PGONCE_COMPARE_PACED_RATES", []int{500, 2_000, 5_000})
	errs = append(errs, err)

	s.phases, err = envNames("PGONCE_COMPARE_PHASES", "phase", allPhases)
	errs = append(errs, err)
	if s.phases == nil {
		s.phases = allPhases
	}
	s.variants, err = envNames("PGONCE_COMPARE_VARIANTS", "variant", allVariants)
	errs = append(errs, err)

	s.timeout = 10 * time.Minute
	if v := os.Getenv("PGONCE_COMPARE_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("PGONCE_COMPARE_TIMEOUT: want a positive duration, got %q", v))
		}
		s.timeout = d
	}
	s.csvPath = cmp.Or(os.Getenv("PGONCE_COMPARE_CSV"), filepath.Join("out", "compare.csv"))

	if slices.Contains(s.phases, phaseFloor) {
		s.pgbench, err = findPgbench(os.Getenv("PGONCE_COMPARE_PGBENCH"))
		errs = append(errs, err)
	}
	if s.maxConns < s.e2eCallers+4 || s.maxConns < slices.Max(s.enqueueClients)+2 {
		errs = append(errs, fmt.Errorf("PGONCE_COMPARE_CONNS %d is too few for %d callers beside a dispatcher", s.maxConns, max(s.e2eCallers, slices.Max(s.enqueueClients))))
	}
	return s, errors.Join(errs...)
}

// findPgbench returns the pgbench to run: explicit when set, else the one
// on PATH, else the newest under /usr/lib/postgresql.
func findPgbench(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if path, err := exec.LookPath("pgbench"); err == nil {
		return path, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", errors.New("pgbench not found: install the PostgreSQL client tools, set PGONCE_COMPARE_PGBENCH, or leave floor out of PGONCE_COMPARE_PHASES")
}

func envBool(name string) bool {
	v, _ := strconv.ParseBool(os.Getenv(name))
	return v
}

func envInt(name string, fallback int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return fallback, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fallback, fmt.Errorf("%s: want a positive integer, got %q", name, v)
	}
	return n, nil
}

func envInts(name string, fallback []int) ([]int, error) {
	v := os.Getenv(name)
	if v == "" {
		return fallback, nil
	}
	var out []int
	for _, field := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 1 {
			return fallback, fmt.Errorf("%s: want positive integers separated by commas, got %q", name, v)
		}
		out = append(out, n)
	}
	return out, nil
}

// measures reports whether the run measures the variant called name.
func (s settings) measures(name string) bool {
	return len(s.variants) == 0 || slices.Contains(s.variants, name)
}

// envNames returns the comma-separated names of the variable called name,
// each one of known (what names them, for the error), or nil when it is
// not set.
func envNames(name, what string, known []string) ([]string, error) {
	v := os.Getenv(name)
	if v == "" {
		return nil, nil
	}
	var names []string
	var errs []error
	for _, field := range strings.Split(v, ",") {
		field = strings.TrimSpace(field)
		if !slices.Contains(known, field) {
			errs = append(errs, fmt.Errorf("%s: unknown %s %q (know %s)", name, what, field, strings.Join(known, ", ")))
			continue
		}
		names = append(names, field)
	}
	return names, errors.Join(errs...)
}
