package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// Environment variables of private clusters.
const (
	// ClusterVersionEnv selects the PostgreSQL major version of private
	// clusters. Defaults to the newest installed.
	ClusterVersionEnv = "PGONCE_FAULTS_PG_VERSION"
)

// ClusterPrefix starts the name of every private cluster, so that leftovers
// can be found and dropped.
const ClusterPrefix = "pgonce_faults_"

// ClusterOwnerFile is the file, in a private cluster's configuration
// directory, that holds the process id of the test binary that made it: the
// sweep of leftovers (.ci/setup) spares a cluster whose test binary still
// runs, so that one run's set-up does not drop another's clusters.
const ClusterOwnerFile = "pgonce_owner_pid"

// FaketimeLibrary returns the path of libfaketime's preload library
// (Debian package faketime), and fails tb when it is not installed.
func FaketimeLibrary(tb testing.TB) string {
	tb.Helper()
	paths, _ := filepath.Glob("/usr/lib/*/faketime/libfaketime.so.1")
	if len(paths) == 0 {
		tb.Fatalf("faults: libfaketime not found under /usr/lib/*/faketime: install it (apt-get install faketime)")
	}
	return paths[0]
}

// Cluster is a PostgreSQL cluster of a test's own, made with Debian's
// postgresql-common tools on a free port, that the test may stop, restart
// and crash. It is dropped when the test ends.
type Cluster struct {
	tb      testing.TB
	Version string
	Name    string
	Port    int
}

// NewCluster creates and starts a private cluster with trust
// authentication on loopback. env, when not empty, is the postmaster's
// environment (for example libfaketime's LD_PRELOAD and FAKETIME). The
// cluster is dropped in tb's cleanup. Without pg_createcluster, or without
// the rights to use it, tb fails and says how to provide them: a test that
// cannot run fails, it never skips.
func NewCluster(tb testing.TB, env map[string]string) *Cluster {
	tb.Helper()
	for _, tool := range []string{"pg_createcluster", "pg_ctlcluster", "pg_dropcluster"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("faults: %s not found: this test makes a private PostgreSQL cluster with Debian's "+
				"postgresql-common (apt-get install postgresql-common postgresql-15), as root", tool)
		}
	}
	if os.Geteuid() != 0 {
		tb.Fatalf("faults: private clusters are made with pg_createcluster as root (it runs PostgreSQL as " +
			"the postgres user); run the fault suite as root")
	}
	version := os.Getenv(ClusterVersionEnv)
	if version == "" {
		version = newestVersion()
	}
	if version == "" {
		tb.Fatalf("faults: no PostgreSQL server under /usr/lib/postgresql; install one (apt-get install postgresql) or set %s", ClusterVersionEnv)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	c := &Cluster{tb: tb, Version: version, Name: ClusterPrefix + hex.EncodeToString(suffix[:]), Port: pgoncetest.FreePort(tb)}
	tb.Cleanup(func() {
		if out, err := exec.Command("pg_dropcluster", "--stop", c.Version, c.Name).CombinedOutput(); err != nil { //nolint:gosec // our own cluster name
			tb.Errorf("faults: drop cluster %s: %v\n%s", c.Name, err, out)
		}
	})
	c.run("pg_createcluster", c.Version, c.Name, "--port", fmt.Sprint(c.Port), "--", "--auth=trust", "--no-sync")
	c.write(ClusterOwnerFile, fmt.Sprintln(os.Getpid()))
	conf := "listen_addresses = '127.0.0.1'\nfsync = off\nmax_connections = 200\nlog_min_messages = warning\n"
	c.write(filepath.Join("conf.d", "faults.conf"), conf)
	c.SetEnv(env)
	c.run("pg_ctlcluster", c.Version, c.Name, "start")
	c.AwaitReady()
	return c
}

// URL returns the cluster's connection URL.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// SetEnv replaces the postmaster's environment; it applies from the next
// start.
func (c *Cluster) SetEnv(env map[string]string) {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(env[k], "'", "''"))
	}
	c.write("environment", b.String())
}

// Restart restarts the cluster with pg_ctlcluster's shutdown mode (fast,
// immediate, smart) and waits until it accepts connections again.
func (c *Cluster) Restart(mode string) {
	c.tb.Helper()
	c.run("pg_ctlcluster", "-m", mode, c.Version, c.Name, "restart")
	c.AwaitReady()
}

// AwaitReady waits until the cluster answers a query, for up to a minute.
func (c *Cluster) AwaitReady() {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		var conn *pgx.Conn
		if conn, err = pgx.Connect(ctx, c.URL()); err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
			if err == nil {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.tb.Fatalf("faults: cluster %s does not answer: %v", c.Name, err)
}

func (c *Cluster) run(name string, args ...string) {
	c.tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput() //nolint:gosec // fixed tools, our own arguments
	if err != nil {
		c.tb.Fatalf("faults: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (c *Cluster) write(name, content string) {
	c.tb.Helper()
	path := filepath.Join("/etc/postgresql", c.Version, c.Name, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil { //nolint:gosec // read by the postgres user
		c.tb.Fatalf("faults: write %s: %v", path, err)
	}
}

func newestVersion() string {
	entries, _ := os.ReadDir("/usr/lib/postgresql")
	best := ""
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join("/usr/lib/postgresql", e.Name(), "bin", "postgres")); err != nil {
			continue
		}
		if best == "" || len(e.Name()) > len(best) || (len(e.Name()) == len(best) && e.Name() > best) {
			best = e.Name()
		}
	}
	return best
}
