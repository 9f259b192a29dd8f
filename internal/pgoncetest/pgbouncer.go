package pgoncetest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// PgBouncer is a PgBouncer (Debian package pgbouncer), in transaction
// pooling mode on a free loopback port, in front of a PostgreSQL server.
// A test may send it admin commands, kill it and start it again on the
// same port.
type PgBouncer struct {
	// Port is the loopback port it listens on.
	Port int

	tb       testing.TB // fails Start; nil for the shared PgBouncer
	dir      string
	user     string
	database string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// PgBouncerPath is where Debian installs PgBouncer.
const PgBouncerPath = "/usr/sbin/pgbouncer"

// PooledServerConns is how many server connections the shared PgBouncer
// of [PooledPool] opens to PostgreSQL at most: few, because many tests,
// and other test processes, share the server's max_connections.
const PooledServerConns = 10

// NewPgBouncer starts a PgBouncer of tb's own in transaction pooling mode
// in front of host:port (user postgres, trust), with poolSize server
// connections per database, and stops it, removing its files, when tb
// ends. Without the pgbouncer binary tb fails and says how to install it:
// a test that cannot run fails, it never skips.
func NewPgBouncer(tb testing.TB, host string, port, poolSize int) *PgBouncer {
	tb.Helper()
	b, err := startPgBouncer(upstream{host: host, port: port, user: "postgres", database: "postgres"}, poolSize)
	if err != nil {
		tb.Fatal(err)
	}
	b.tb = tb
	tb.Cleanup(b.close)
	return b
}

// upstream is the server a PgBouncer pools connections to.
type upstream struct {
	host     string
	port     int
	user     string
	password string
	database string
}

func startPgBouncer(up upstream, poolSize int) (*PgBouncer, error) {
	if _, err := os.Stat(PgBouncerPath); err != nil {
		return nil, fmt.Errorf("pgbouncer: %s not found: install PgBouncer (apt-get install pgbouncer; make setup does)", PgBouncerPath)
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	dir, err := os.MkdirTemp("", "pgonce-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer directory: %w", err)
	}
	// PgBouncer refuses to run as root; it runs as postgres, which must
	// write its log there.
	if err := os.Chmod(dir, 0o777); err != nil { //nolint:gosec // a test's scratch directory
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgbouncer directory: %w", err)
	}
	b := &PgBouncer{Port: port, dir: dir, user: up.user, database: up.database}
	server := fmt.Sprintf("host=%s port=%d user=%s pool_size=%d", up.host, up.port, up.user, poolSize)
	if up.password != "" {
		server += " password=" + up.password
	}
	// search_path is a startup parameter of the tests' pools that PgBouncer
	// does not track: it is ignored, and pgonce names its schema in every
	// statement anyway.
	config := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
ignore_startup_parameters = search_path,extra_float_digits
admin_users = %s
logfile = %s
pidfile = %s
server_login_retry = 1
`, server, b.Port, up.user, filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(b.configPath(), []byte(config), 0o644); err != nil { //nolint:gosec // read by the postgres user
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("write pgbouncer.ini: %w", err)
	}
	if err := b.start(); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *PgBouncer) configPath() string { return filepath.Join(b.dir, "pgbouncer.ini") }

// URL returns a connection URL through the PgBouncer, with pgx's exec mode
// set to the one transaction pooling needs (no prepared statements kept
// across transactions).
func (b *PgBouncer) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=exec",
		url.PathEscape(b.user), b.Port, url.PathEscape(b.database))
}

// Start starts the PgBouncer again, after [PgBouncer.Kill], on its port
// and waits until it accepts connections.
func (b *PgBouncer) Start() {
	b.tb.Helper()
	if err := b.start(); err != nil {
		b.tb.Fatal(err)
	}
}

func (b *PgBouncer) start() error {
	b.mu.Lock()
	args := []string{b.configPath()}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			b.mu.Unlock()
			return fmt.Errorf("pgbouncer refuses root and there is no postgres user: %w", err)
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(PgBouncerPath, args...) //nolint:gosec // the test's own arguments
	// Its log is in its directory; stdout and stderr repeat it.
	if err := cmd.Start(); err != nil {
		b.mu.Unlock()
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	b.cmd = cmd
	b.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.Port), time.Second)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
			return fmt.Errorf("pgbouncer does not listen on %d: %w\n%s", b.Port, err, log)
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

// close kills the PgBouncer and removes its files.
func (b *PgBouncer) close() {
	b.Kill()
	_ = os.RemoveAll(b.dir)
}

// Admin runs command (RECONNECT, PAUSE, RESUME, SHOW POOLS, …) on the
// PgBouncer's admin console.
func (b *PgBouncer) Admin(ctx context.Context, command string) error {
	config, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s@127.0.0.1:%d/pgbouncer?sslmode=disable", url.PathEscape(b.user), b.Port))
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

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil //nolint:forcetypeassert // a TCP listener
}

var pooled struct {
	once    sync.Once
	err     error
	bouncer *PgBouncer
	pool    *pgxpool.Pool
	db      *sql.DB
}

// PooledPool returns a pgx pool shared by the tests of this binary that
// reaches the test database through a PgBouncer in transaction pooling
// mode, which the first call starts on a free loopback port (with
// [PooledServerConns] server connections) and [Main] stops. Its
// connections prepare no statements (default_query_exec_mode=exec), as
// pgonce needs behind such a pooler. Migrate, LISTEN and hold session
// state over [Pool] instead.
func PooledPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	setupPooled(tb)
	return pooled.pool
}

// PooledDB returns a *sql.DB shared by the tests of this binary, through
// the PgBouncer of [PooledPool], for the database/sql paths: its
// connections are database/sql's own, as sql.Open("pgx", url) makes them,
// and run pgx's simple protocol (default_query_exec_mode=simple_protocol),
// the other exec mode that works behind a transaction pooler.
func PooledDB(tb testing.TB) *sql.DB {
	tb.Helper()
	setupPooled(tb)
	return pooled.db
}

// PooledURL returns the URL of the test database through the shared
// PgBouncer of [PooledPool].
func PooledURL(tb testing.TB) string {
	tb.Helper()
	setupPooled(tb)
	return pooled.bouncer.URL()
}

func setupPooled(tb testing.TB) {
	tb.Helper()
	direct := DatabaseURL(tb)
	pooled.once.Do(func() {
		config, err := pgx.ParseConfig(direct)
		if err != nil {
			pooled.err = fmt.Errorf("parse database url: %w", err)
			return
		}
		up := upstream{
			host: config.Host, port: int(config.Port), user: config.User,
			password: config.Password, database: config.Database,
		}
		bouncer, err := startPgBouncer(up, PooledServerConns)
		if err != nil {
			pooled.err = err
			return
		}
		pool, err := connect(context.Background(), bouncer.URL(), FirstConnectBudget)
		if err != nil {
			bouncer.close()
			pooled.err = fmt.Errorf("connect through pgbouncer: %w", err)
			return
		}
		pooled.bouncer, pooled.pool, pooled.db = bouncer, pool, SimpleProtocolDB(pool)
	})
	if pooled.err != nil {
		tb.Fatal(pooled.err)
	}
}

// SimpleProtocolDB returns a *sql.DB over pgx's stdlib driver that opens
// connections of its own, as sql.Open("pgx", url) does, configured as
// pool's are but in pgx's simple protocol, and at most as many as pool
// may. The caller closes it.
func SimpleProtocolDB(pool *pgxpool.Pool) *sql.DB {
	config := pool.Config().ConnConfig.Copy()
	config.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	db := stdlib.OpenDB(*config)
	db.SetMaxOpenConns(int(pool.Config().MaxConns))
	return db
}

// closePooled closes the shared pool through the PgBouncer and stops it.
func closePooled() {
	if pooled.db != nil {
		_ = pooled.db.Close()
	}
	if pooled.pool != nil {
		pooled.pool.Close()
	}
	if pooled.bouncer != nil {
		pooled.bouncer.close()
	}
}
