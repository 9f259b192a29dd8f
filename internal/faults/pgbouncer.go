package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a PgBouncer of a test's own (Debian package pgbouncer), in
// transaction pooling mode on a free loopback port, in front of the server
// at upstream. The test may send it admin commands, kill it and start it
// again on the same port. It is stopped, and its files removed, when the
// test ends.
type PgBouncer struct {
	tb   testing.TB
	Port int
	dir  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// PgBouncerPath is where Debian installs PgBouncer.
const PgBouncerPath = "/usr/sbin/pgbouncer"

// NewPgBouncer starts a PgBouncer in transaction pooling mode in front of
// host:port (user postgres, trust), with poolSize server connections per
// database. Without the pgbouncer binary tb fails and says how to install
// it: a test that cannot run fails, it never skips.
func NewPgBouncer(tb testing.TB, host string, port, poolSize int) *PgBouncer {
	tb.Helper()
	if _, err := os.Stat(PgBouncerPath); err != nil {
		tb.Fatalf("faults: %s not found: install PgBouncer (apt-get install pgbouncer; .ci/run does)", PgBouncerPath)
	}
	dir, err := os.MkdirTemp("", "pgonce-pgbouncer-")
	if err != nil {
		tb.Fatalf("faults: pgbouncer directory: %v", err)
	}
	// PgBouncer refuses to run as root; it runs as postgres, which must
	// write its log there.
	if err := os.Chmod(dir, 0o777); err != nil { //nolint:gosec // a test's scratch directory
		tb.Fatalf("faults: pgbouncer directory: %v", err)
	}
	b := &PgBouncer{tb: tb, Port: freePort(tb), dir: dir}
	// search_path is a startup parameter of the tests' pools that PgBouncer
	// does not track: it is ignored, and pgonce names its schema in every
	// statement anyway.
	config := fmt.Sprintf(`[databases]
* = host=%s port=%d user=postgres pool_size=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
ignore_startup_parameters = search_path,extra_float_digits
admin_users = postgres
logfile = %s
pidfile = %s
server_login_retry = 1
`, host, port, poolSize, b.Port, filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(b.configPath(), []byte(config), 0o644); err != nil { //nolint:gosec // read by the postgres user
		tb.Fatalf("faults: write pgbouncer.ini: %v", err)
	}
	tb.Cleanup(func() {
		b.Kill()
		_ = os.RemoveAll(dir)
	})
	b.Start()
	return b
}

func (b *PgBouncer) configPath() string { return filepath.Join(b.dir, "pgbouncer.ini") }

// URL returns a connection URL through the PgBouncer, with pgx's exec mode
// set to the one transaction pooling needs (no prepared statements kept
// across transactions).
func (b *PgBouncer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&default_query_exec_mode=exec", b.Port)
}

// Start starts the PgBouncer (again, after [PgBouncer.Kill]) on its port
// and waits until it accepts connections.
func (b *PgBouncer) Start() {
	b.tb.Helper()
	b.mu.Lock()
	args := []string{b.configPath()}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			b.mu.Unlock()
			b.tb.Fatalf("faults: pgbouncer refuses root and there is no postgres user: %v", err)
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(PgBouncerPath, args...) //nolint:gosec // the test's own arguments
	// Its log is in its directory; stdout and stderr repeat it.
	if err := cmd.Start(); err != nil {
		b.mu.Unlock()
		b.tb.Fatalf("faults: start pgbouncer: %v", err)
	}
	b.cmd = cmd
	b.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.Port), time.Second)
		if err == nil {
			_ = conn.Close()
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
			b.tb.Fatalf("faults: pgbouncer does not listen on %d: %v\n%s", b.Port, err, log)
		}
		time.Sleep(10 * time.Millisecond) // polling a port: nothing to await
	}
}

// Kill kills the PgBouncer with SIGKILL, dropping every client and server
// connection at once, and waits for it to exit.
func (b *PgBouncer) Kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	_ = b.cmd.Wait()
	b.cmd = nil
}

// Admin runs command (RECONNECT, PAUSE, RESUME, SHOW POOLS, …) on the
// PgBouncer's admin console.
func (b *PgBouncer) Admin(ctx context.Context, command string) error {
	config, err := pgx.ParseConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pgbouncer?sslmode=disable", b.Port))
	if err != nil {
		return err
	}
	// The console speaks the simple query protocol only.
	config.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return fmt.Errorf("connect to the pgbouncer console: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, command); err != nil {
		return fmt.Errorf("pgbouncer %s: %w", command, err)
	}
	return nil
}
