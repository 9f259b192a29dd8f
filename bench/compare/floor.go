package main

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/pgonce/pgonce/migrations"
)

// claimFinishScript is the pgbench script of pgonce's physical model, with
// the schema marker the harness fills in.
//
//go:embed claim_finish.pgbench
var claimFinishScript string

// floorLeaseMs is the lease the model's claims take: the client's default
// (call timeout 30 s, plus 30 s).
const floorLeaseMs = 60_000

// runFloor drains floorRows due rows of a table built by pgonce's own
// migration with pgbench running the model's two statements from
// floorClients clients, and reports rows per second.
func (env *environment) runFloor(ctx context.Context, round int) ([]result, error) {
	if _, err := env.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+quote(env.schemaFloor)+" CASCADE"); err != nil {
		return nil, fmt.Errorf("drop the model's schema: %w", err)
	}
	if err := migrations.Up(ctx, env.db, env.schemaFloor); err != nil {
		return nil, fmt.Errorf("migrate the model's schema: %w", err)
	}
	table := quote(env.schemaFloor) + ".pgonce_key"
	// The rows a submit of compareArgs writes, built in one statement: the
	// model times the claims and completions, not the submits.
	if _, err := env.pool.Exec(ctx, `INSERT INTO `+table+` (
			key,
			scope,
			run_id,
			step,
			tool,
			args
		)
		SELECT
			sha256(convert_to($1::text || '/' || i, 'UTF8')),
			sha256(convert_to('scope/' || $1::text || '/' || i, 'UTF8')),
			$1::text,
			i,
			'noop',
			convert_to('{"n":' || i || ',"round":"' || $1::text || '"}', 'UTF8')
		FROM generate_series(1, $2::bigint) AS i`, fmt.Sprintf("floor/%d", round), env.s.floorRows); err != nil {
		return nil, fmt.Errorf("fill the model's table: %w", err)
	}
	if err := env.analyze(ctx, table); err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "pgonce-compare-")
	if err != nil {
		return nil, fmt.Errorf("pgbench script: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	script := filepath.Join(dir, "claim_finish.pgbench")
	body := strings.ReplaceAll(claimFinishScript, "/* TEMPLATE: schema */", quote(env.schemaFloor)+".")
	if err := os.WriteFile(script, []byte(body), 0o600); err != nil {
		return nil, fmt.Errorf("pgbench script: %w", err)
	}

	clients, batch := env.s.floorClients, env.s.floorBatch
	// Enough claims for every row and one more round of them, which finds
	// the table empty: the last rows are never starved of a claim.
	perClient := (env.s.floorRows+clients*batch-1)/(clients*batch) + 1
	args := []string{
		"--no-vacuum",
		"--protocol=prepared",
		"--client=" + strconv.Itoa(clients),
		"--jobs=" + strconv.Itoa(min(clients, runtime.NumCPU())),
		"--transactions=" + strconv.Itoa(perClient),
		"--define=batch=" + strconv.Itoa(batch),
		"--define=lease_ms=" + strconv.Itoa(floorLeaseMs),
		"--define=channel=" + env.schemaFloor + "_pgonce_done",
		"--file=" + script,
		env.s.databaseURL,
	}
	runCtx, cancel := context.WithTimeout(ctx, env.s.timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, env.s.pgbench, args...) //nolint:gosec // the operator's pgbench and settings
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output

	// pgbench's connections are the run's, as the harness's own are.
	cmd.Env = append(os.Environ(), "PGAPPNAME="+env.applicationName)

	cpuBefore, cpuRead := env.readServerCPU(ctx)
	began := time.Now()
	err = cmd.Run()
	elapsed := time.Since(began)
	serverCPU, serverCPUAll := time.Duration(-1), time.Duration(-1)
	// pgbench's backends end with it, before the second reading, so the
	// run's share is not told for the floor: it has the whole server's
	// figure alone.
	if cpuAfter, ok := env.readServerCPU(ctx); ok && cpuRead {
		_, serverCPUAll = cpuAfter.since(cpuBefore)
	}
	if err != nil {
		return nil, fmt.Errorf("pgbench: %w\n%s", err, output.String())
	}

	var finished, open int
	if err := env.pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE state = 'succeeded'),
			count(*) FILTER (WHERE state <> 'succeeded')
		FROM `+table).Scan(&finished, &open); err != nil {
		return nil, fmt.Errorf("count the model's rows: %w", err)
	}
	if finished != env.s.floorRows || open != 0 {
		return nil, fmt.Errorf("pgbench finished %d of %d rows, %d left open\n%s", finished, env.s.floorRows, open, output.String())
	}
	return []result{{round: round, phase: phaseFloor, variant: floorPgbench, clients: 0, count: finished, elapsed: elapsed, serverCPU: serverCPU, serverCPUAll: serverCPUAll}}, nil
}
