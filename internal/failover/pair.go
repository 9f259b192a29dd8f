package failover

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// Replication is how a [Pair]'s primary waits for its standby.
type Replication int

// Replication modes of a [Pair].
const (
	// SyncRemoteApply: the standby is synchronous
	// (synchronous_standby_names = '*') and every commit waits until the
	// standby applied it (synchronous_commit = remote_apply).
	SyncRemoteApply Replication = iota
	// SyncOn: the standby is synchronous and every commit waits until the
	// standby flushed it to disk (synchronous_commit = on).
	SyncOn
	// Async: the standby streams asynchronously (no
	// synchronous_standby_names): a commit waits for no standby.
	Async
	// AsyncNamed: the standby is named synchronous, but commits default to
	// waiting for none (synchronous_commit = local); a transaction that
	// raises its own synchronous_commit waits for it, as a claim of a tool
	// registered with [outbox.ToolOpts.ReplicatedClaim] does.
	AsyncNamed
)

// String names the mode, as the figures do.
func (r Replication) String() string {
	switch r {
	case SyncRemoteApply:
		return "sync_remote_apply"
	case SyncOn:
		return "sync_on"
	case Async:
		return "async"
	case AsyncNamed:
		return "async_named"
	}
	return fmt.Sprintf("Replication(%d)", int(r))
}

// Synchronous reports whether every commit waits for the standby.
func (r Replication) Synchronous() bool { return r == SyncRemoteApply || r == SyncOn }

// settings returns the primary's replication settings for the mode.
func (r Replication) settings() string {
	s := "wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n"
	switch r {
	case SyncRemoteApply:
		s += "synchronous_standby_names = '*'\nsynchronous_commit = remote_apply\n"
	case SyncOn:
		s += "synchronous_standby_names = '*'\nsynchronous_commit = on\n"
	case Async:
		s += "synchronous_standby_names = ''\nsynchronous_commit = on\n"
	case AsyncNamed:
		s += "synchronous_standby_names = '*'\nsynchronous_commit = local\n"
	}
	return s
}

// Node is one server of a [Pair]: a cluster of Debian's postgresql-common.
type Node struct {
	Version string
	Name    string
	Port    int
}

// HostPort returns the node's address.
func (n *Node) HostPort() string { return fmt.Sprintf("127.0.0.1:%d", n.Port) }

// URL returns a connection URL of the node alone.
func (n *Node) URL() string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", n.HostPort())
}

// Pair is a primary and a streaming standby made from it with
// pg_basebackup -R, both private clusters on free loopback ports, dropped
// when the test ends. Clients reach whichever is the primary through
// [Pair.URL], a multi-host URL with target_session_attrs=read-write, as
// libpq and pgx understand it.
type Pair struct {
	tb      testing.TB
	Mode    Replication
	Primary *Node
	Standby *Node
}

// NewPair makes a primary with [faults.NewCluster] (so it is named with
// [faults.ClusterPrefix], and dropped by the same sweep), sets its
// replication up for mode, makes the standby from a base backup of it, and
// waits until the standby streams (as the synchronous one, in the modes
// that name it).
func NewPair(tb testing.TB, mode Replication) *Pair {
	tb.Helper()
	primary := faults.NewCluster(tb, nil)
	p := &Pair{tb: tb, Mode: mode, Primary: &Node{Version: primary.Version, Name: primary.Name, Port: primary.Port}}
	p.write(p.Primary, "failover.conf", mode.settings())
	p.run("pg_ctlcluster", p.Primary.Version, p.Primary.Name, "reload")

	standby := &Node{Version: p.Primary.Version, Name: p.Primary.Name + "_standby", Port: pgoncetest.FreePort(tb)}
	dataDir := filepath.Join("/var/lib/postgresql", standby.Version, standby.Name)
	// Cleanups run last first: the directory goes after the cluster was
	// stopped and dropped (which removes it), in case pg_createcluster never
	// took it over.
	tb.Cleanup(func() { _ = os.RemoveAll(dataDir) })
	tb.Cleanup(func() {
		out, err := exec.Command("pg_dropcluster", "--stop", standby.Version, standby.Name).CombinedOutput() //nolint:gosec // our own cluster name
		if err != nil && p.Standby != nil {
			tb.Errorf("failover: drop cluster %s: %v\n%s", standby.Name, err, out)
		}
	})
	// The standby's data directory is a base backup of the primary's; -R
	// writes standby.signal and primary_conninfo. pg_createcluster then
	// integrates the directory instead of running initdb, given the
	// configuration files it moves to /etc (Debian keeps the primary's
	// there, out of the backup). The walreceiver's application_name is the
	// standby's cluster_name, which synchronous_standby_names = '*' matches.
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		tb.Fatalf("failover: %v", err)
	}
	p.run("chown", "postgres:postgres", dataDir)
	p.run("runuser", "-u", "postgres", "--", filepath.Join("/usr/lib/postgresql", standby.Version, "bin", "pg_basebackup"),
		"-h", "127.0.0.1", "-p", fmt.Sprint(p.Primary.Port), "-U", "postgres", "-D", dataDir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	primaryConf := filepath.Join("/etc/postgresql", p.Primary.Version, p.Primary.Name)
	for _, name := range []string{"pg_hba.conf", "pg_ident.conf"} {
		p.run("install", "-o", "postgres", "-g", "postgres", "-m", "0640", filepath.Join(primaryConf, name), filepath.Join(dataDir, name))
	}
	if err := os.WriteFile(filepath.Join(dataDir, "postgresql.conf"), nil, 0o600); err != nil {
		tb.Fatalf("failover: %v", err)
	}
	p.run("chown", "postgres:postgres", filepath.Join(dataDir, "postgresql.conf"))
	p.run("pg_createcluster", standby.Version, standby.Name, "--port", fmt.Sprint(standby.Port))
	p.write(standby, "faults.conf", "listen_addresses = '127.0.0.1'\nfsync = off\nmax_connections = 200\nlog_min_messages = warning\n")
	p.run("pg_ctlcluster", standby.Version, standby.Name, "start")
	p.Standby = standby
	p.awaitReady(standby)
	p.AwaitStreaming()
	return p
}

// URL returns the multi-host URL of the pair: the primary's host first, and
// target_session_attrs=read-write, so that a connection lands on whichever
// server accepts writes, the promoted standby after a failover.
func (p *Pair) URL() string {
	return fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
		p.Primary.HostPort(), p.Standby.HostPort())
}

// AwaitStreaming waits until the primary's walsender streams to the
// standby, as its synchronous standby in the modes that name one.
func (p *Pair) AwaitStreaming() {
	p.tb.Helper()
	state := "async"
	if p.Mode != Async {
		state = "sync"
	}
	p.await(p.Primary, "the standby to stream", `SELECT EXISTS (SELECT FROM pg_stat_replication
		WHERE state = 'streaming' AND sync_state = $1)`, state)
}

// AwaitCaughtUp waits until the standby replayed everything the primary
// had written when it was called.
func (p *Pair) AwaitCaughtUp(ctx context.Context) error {
	var lsn string
	if err := queryRow(ctx, p.Primary, `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		return fmt.Errorf("read the primary's WAL position: %w", err)
	}
	for {
		var caught bool
		err := queryRow(ctx, p.Standby, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, []any{lsn}, &caught)
		if err == nil && caught {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("await the standby's replay of %s: %w (last error: %w)", lsn, ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// CutStreaming stops the standby from receiving WAL: its primary_conninfo
// points at a port nothing listens on, and the reload restarts its
// walreceiver there. It returns once the primary has no walsender left.
// From then on, what the primary commits without waiting for the standby is
// on the primary alone; a commit that waits for it waits until the primary
// goes.
func (p *Pair) CutStreaming() {
	p.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	closed := pgoncetest.FreePort(p.tb)
	if err := execOn(ctx, p.Standby, fmt.Sprintf(`ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=%d user=postgres'`, closed)); err != nil {
		p.tb.Fatalf("failover: cut streaming: %v", err)
	}
	if err := execOn(ctx, p.Standby, `SELECT pg_reload_conf()`); err != nil {
		p.tb.Fatalf("failover: cut streaming: %v", err)
	}
	p.await(p.Primary, "the walsender to go", `SELECT NOT EXISTS (SELECT FROM pg_stat_replication)`)
}

// Failover stops the primary with pg_ctlcluster's immediate mode (as a
// crash does: every connection dropped, nothing flushed) and promotes the
// standby with pg_ctlcluster promote, which waits until it accepts writes.
// It returns when the stop began and when the promotion ended.
func (p *Pair) Failover() (stopped, promoted time.Time) {
	p.tb.Helper()
	stopped = time.Now()
	p.run("pg_ctlcluster", "-m", "immediate", p.Primary.Version, p.Primary.Name, "stop")
	p.run("pg_ctlcluster", p.Standby.Version, p.Standby.Name, "promote")
	promoted = time.Now()
	p.await(p.Standby, "the promoted standby to accept writes", `SELECT NOT pg_is_in_recovery()`)
	return stopped, promoted
}

// StartOldPrimary starts the stopped primary again, alone, for a test to
// read what it had committed: it recovers from its own WAL and comes up as
// a primary of its own timeline. Only for inspection after a campaign: its
// clients would otherwise find it first in [Pair.URL].
func (p *Pair) StartOldPrimary() {
	p.tb.Helper()
	p.run("pg_ctlcluster", p.Primary.Version, p.Primary.Name, "start")
	p.awaitReady(p.Primary)
}

// await polls query on node, with args, until it returns true, for up to a
// minute, and fails the test then.
func (p *Pair) await(node *Node, what, query string, args ...any) {
	p.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		var ok bool
		if err = queryRow(ctx, node, query, args, &ok); err == nil && ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.tb.Fatalf("failover: waited a minute for %s on %s (last error: %v)", what, node.Name, err)
}

func (p *Pair) awaitReady(node *Node) {
	p.tb.Helper()
	p.await(node, "the server to answer", `SELECT true`)
}

func (p *Pair) run(name string, args ...string) {
	p.tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput() //nolint:gosec // fixed tools, our own arguments
	if err != nil {
		p.tb.Fatalf("failover: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (p *Pair) write(node *Node, name, content string) {
	p.tb.Helper()
	path := filepath.Join("/etc/postgresql", node.Version, node.Name, "conf.d", name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil { //nolint:gosec // read by the postgres user
		p.tb.Fatalf("failover: write %s: %v", path, err)
	}
}

// queryRow runs query on a connection of its own to node and scans its one
// row into dest.
func queryRow(ctx context.Context, node *Node, query string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, node.URL())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return conn.QueryRow(ctx, query, args...).Scan(dest...)
}

// execOn runs statement on a connection of its own to node.
func execOn(ctx context.Context, node *Node, statement string) error {
	conn, err := pgx.Connect(ctx, node.URL())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, statement)
	return err
}
