package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// Environment of a child dispatcher process.
const (
	childSchemaEnv = "PGONCE_FAULTS_CHILD_SCHEMA"
	childURLEnv    = "PGONCE_FAULTS_CHILD_URL"
	childAppEnv    = "PGONCE_FAULTS_CHILD_APP"
	// childWorkerEnv, when set, is the child's WorkerID.
	childWorkerEnv = "PGONCE_FAULTS_CHILD_WORKER"
	// childLatencyEnv, when set, is the ledger's latency (a Go duration).
	childLatencyEnv = "PGONCE_FAULTS_CHILD_LATENCY"
	// childMaxConnsEnv, when set, is the child pool's MaxConns: children
	// running beside the campaign's tests share the server's
	// max_connections with them.
	childMaxConnsEnv = "PGONCE_FAULTS_CHILD_MAX_CONNS"
	// childSubmitEnv, when set, makes the child a submitter instead of a
	// dispatcher: it runs the workload with this run id until it is told
	// to stop, then writes its history to standard output, one JSON entry a
	// line.
	childSubmitEnv = "PGONCE_FAULTS_CHILD_SUBMIT"
)

// runChild is the body of a dispatcher process of the crash loop: the
// ledger's tools over the schema, until it is killed, signalled, or its
// standard input closes (the test process is gone).
func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	err := func() error {
		schema := os.Getenv(childSchemaEnv)
		url := os.Getenv(childURLEnv)
		if maxConns := os.Getenv(childMaxConnsEnv); maxConns != "" {
			url += "&pool_max_conns=" + maxConns
		}
		var holds *holder
		var pool *pgxpool.Pool
		var err error
		if n := os.Getenv(childHoldEnv); n != "" {
			maxHeld, err := strconv.Atoi(n)
			if err != nil {
				return err
			}
			holds = newHolder(maxHeld)
			pool, err = newTracedPool(ctx, url, os.Getenv(childAppEnv), holds)
			if err != nil {
				return err
			}
		} else if pool, err = faults.NewPool(ctx, url, os.Getenv(childAppEnv)); err != nil {
			return err
		}
		defer pool.Close()
		ledger := faults.NewLedger(pool, schema)
		ledger.Latency = 2 * time.Millisecond
		if latency := os.Getenv(childLatencyEnv); latency != "" {
			if ledger.Latency, err = time.ParseDuration(latency); err != nil {
				return err
			}
		}
		if holds != nil {
			ledger.HoldFunc = holds.hold
		}
		registry, err := ledger.Registry(nil)
		if err != nil {
			return err
		}
		config := clientConfig(schema, registry)
		config.WorkerID = os.Getenv(childWorkerEnv)
		client, err := outbox.NewPgx(pool, config)
		if err != nil {
			return err
		}
		if runID := os.Getenv(childSubmitEnv); runID != "" {
			history := faults.NewHistory()
			load := &faults.Workload{
				Client: faults.PgxSubmitter(client, pool), History: history,
				RunID: runID, RollbackEvery: 7, RetryTimeout: 10 * time.Second,
			}
			load.Run(ctx, 2, 0, 10*time.Millisecond)
			encoder := json.NewEncoder(os.Stdout)
			for _, e := range history.Entries() {
				if err := encoder.Encode(e); err != nil {
					return err
				}
			}
			return nil
		}
		d, err := dispatcher.New(client, dispatcherConfig())
		if err != nil {
			return err
		}
		return d.Run(ctx)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// TestSIGKILLLoop kills dispatcher processes with SIGKILL at random moments,
// again and again, while calls are submitted all the time; a reconciler and
// a last dispatcher then finish the work, and the history must hold.
func TestSIGKILLLoop(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	kills := faults.Scale(8, 60)
	childApp := "faults_child_" + b.schema

	stopSubmit := b.submit(t, 2, 5*time.Millisecond)
	stopReconcile := b.runReconciler(t)
	for i := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(),
			childSchemaEnv+"="+b.schema,
			childURLEnv+"="+pgoncetest.DatabaseURL(t),
			childAppEnv+"="+childApp)
		stderr := &bytes.Buffer{}
		cmd.Stderr = stderr
		stdin, err := cmd.StdinPipe() // closed by Wait: the child then exits
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		// A child's start-up takes a while under the race detector; the kill
		// lands anywhere in its work after it.
		time.Sleep(time.Duration(200+mathrand.IntN(800)) * time.Millisecond)
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		_ = stdin.Close()
		require.NotContains(t, stderr.String(), "DATA RACE", "child %d", i)
		tally.Fault("sigkill")
	}
	stopSubmit()
	stopReconcile()
	// A killed child's statements run on in the server until it notices the
	// closed connection: wait for them to end before counting.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		var backends int
		require.NoError(t, b.direct.QueryRow(ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, childApp).Scan(&backends))
		if backends == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the killed children's backends did not end")
		case <-time.After(10 * time.Millisecond):
		}
	}
	b.finish(t, faults.CheckOpts{Crashed: true})
}
