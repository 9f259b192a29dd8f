package faults_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/outbox"
)

// host is a network namespace of a test's own, joined to the test's
// namespace by a veth pair: the host side's address reaches PostgreSQL
// through a forwarder, so that a process in the namespace talks to the
// database only over the pair's link.
type host struct {
	t        *testing.T
	ns       string // namespace name
	hostSide string // veth on the test's side
	url      string // the database, as the namespace reaches it
}

// ipRun runs ip with args and fails t with its output when it fails.
func ipRun(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput() //nolint:gosec // the test's own arguments
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newHost creates a namespace with a veth pair on 10.250.n.0/30, the test's
// side .1 and the namespace's .2, and a forwarder from the test's side to
// databaseAddr. Everything is removed when t ends. It fails t, never skips,
// when the test cannot create namespaces (not root, no CAP_NET_ADMIN, no
// ip binary).
func newHost(t *testing.T, databaseAddr string) *host {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("netns: the ip binary (iproute2) is needed: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("netns: this test creates network namespaces and must run as root")
	}
	var suffix [3]byte
	_, _ = rand.Read(suffix[:])
	tag := hex.EncodeToString(suffix[:])
	h := &host{t: t, ns: "pgonce-" + tag, hostSide: "pgoh" + tag}
	nsSide := "pgon" + tag
	base := int(suffix[1] &^ 3)
	hostAddr := fmt.Sprintf("10.250.%d.%d", suffix[0], base+1)
	nsAddr := fmt.Sprintf("10.250.%d.%d", suffix[0], base+2)

	ipRun(t, "netns", "add", h.ns)
	t.Cleanup(func() {
		// Deleting the namespace deletes its veth end, and so the pair.
		_ = exec.Command("ip", "netns", "del", h.ns).Run()
		_ = exec.Command("ip", "link", "del", h.hostSide).Run()
	})
	ipRun(t, "link", "add", h.hostSide, "type", "veth", "peer", "name", nsSide)
	ipRun(t, "link", "set", nsSide, "netns", h.ns)
	ipRun(t, "addr", "add", hostAddr+"/30", "dev", h.hostSide)
	ipRun(t, "link", "set", h.hostSide, "up")
	ipRun(t, "netns", "exec", h.ns, "ip", "addr", "add", nsAddr+"/30", "dev", nsSide)
	ipRun(t, "netns", "exec", h.ns, "ip", "link", "set", nsSide, "up")
	ipRun(t, "netns", "exec", h.ns, "ip", "link", "set", "lo", "up")

	listener, err := net.Listen("tcp", hostAddr+":0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		_ = listener.Close()
		conns.Wait()
	})
	go forward(listener, databaseAddr, &conns)
	h.url = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", listener.Addr())
	return h
}

// forward copies every connection accepted on listener to and from
// target, until listener closes.
func forward(listener net.Listener, target string, conns *sync.WaitGroup) {
	var mu sync.Mutex
	var open []net.Conn
	defer func() {
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	for {
		client, err := listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			_ = client.Close()
			continue
		}
		mu.Lock()
		open = append(open, client, server)
		mu.Unlock()
		conns.Add(2)
		pipe := func(dst, src net.Conn) {
			defer conns.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(server, client)
		go pipe(client, server)
	}
}

// partition cuts the namespace's link, as a partitioned host loses its
// network: its processes run on.
func (h *host) partition() { ipRun(h.t, "link", "set", h.hostSide, "down") }

// heal restores the namespace's link.
func (h *host) heal() { ipRun(h.t, "link", "set", h.hostSide, "up") }

// child is a dispatcher process of the test binary running in a host's
// namespace.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *syncBuffer
	stderr *syncBuffer
	// release, for a holding dispatcher, lets its held calls answer.
	release func()
}

// stopSubmitter stops a submitting child and adds the history it wrote to
// history.
func (c *child) stopSubmitter(t *testing.T, history *faults.History) {
	t.Helper()
	c.stop(t)
	decoder := json.NewDecoder(strings.NewReader(c.stdout.String()))
	added := 0
	for decoder.More() {
		var e faults.Entry
		require.NoError(t, decoder.Decode(&e))
		history.Add(e.Call, e.Key, e.Fate)
		added++
	}
	require.Positive(t, added, "the submitting child submitted calls")
	t.Logf("the submitter on the partitioned host submitted %d calls", added)
}

// startDispatcher starts a dispatcher process in h's namespace over
// schema, as worker, whose ledger calls take latency.
func (h *host) startDispatcher(schema, worker string, latency time.Duration) *child {
	h.t.Helper()
	return h.startChild(schema, worker, latency, nil)
}

// startSubmitter starts a submitting process in h's namespace over schema,
// whose calls carry runID; [child.stopSubmitter] collects its history.
func (h *host) startSubmitter(schema, runID string) *child {
	h.t.Helper()
	return h.startChild(schema, "submitter", 0, nil, childSubmitEnv+"="+runID)
}

// startHoldingDispatcher starts a dispatcher as [host.startDispatcher]
// does, whose first n calls, once they acted, wait to answer until
// [child.release]; its standard output reports them (see [holdEvent]).
func (h *host) startHoldingDispatcher(schema, worker string, latency time.Duration, n int) *child {
	h.t.Helper()
	gate, release, err := os.Pipe()
	require.NoError(h.t, err)
	c := h.startChild(schema, worker, latency, []*os.File{gate}, childHoldEnv+"="+strconv.Itoa(n))
	_ = gate.Close() // the child's copy stays open
	var once sync.Once
	c.release = func() { once.Do(func() { _ = release.Close() }) }
	h.t.Cleanup(c.release)
	return c
}

// startChild starts a child of the test binary in h's namespace; extra
// become its file descriptors 3, 4, ….
func (h *host) startChild(schema, worker string, latency time.Duration, extra []*os.File, env ...string) *child {
	h.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", h.ns, os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(),
		childSchemaEnv+"="+schema,
		childURLEnv+"="+h.url,
		childAppEnv+"=faults_"+worker,
		childWorkerEnv+"="+worker,
		childLatencyEnv+"="+latency.String(),
		childMaxConnsEnv+"=4")
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = extra
	c := &child{cmd: cmd, stderr: &syncBuffer{}, stdout: &syncBuffer{}}
	cmd.Stderr, cmd.Stdout = c.stderr, c.stdout
	var err error
	c.stdin, err = cmd.StdinPipe()
	require.NoError(h.t, err)
	require.NoError(h.t, cmd.Start())
	h.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// stop closes the child's standard input, which ends its dispatcher, and
// waits for it.
func (c *child) stop(t *testing.T) {
	t.Helper()
	_ = c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "child: %s", c.stderr)
	case <-time.After(time.Minute):
		t.Fatalf("child did not stop: %s", c.stderr)
	}
	require.NotContains(t, c.stderr.String(), "DATA RACE")
}

// TestPartitionedHost runs two dispatcher processes on hosts of their own
// (network namespaces) while the test's host submits, cuts one host's link
// mid-load for longer than a lease, and restores it. The keys the
// partitioned host held are taken over once their leases expire; the calls
// its process held in flight across the cut answer only after the link is
// back, and what that process then tries to record is refused by the
// attempt fence (or, on a connection the cut broke, fails and is not tried
// again past the lease): it writes nothing, and each such key keeps a later
// attempt's outcome; the outcomes it could send for its old attempts
// change nothing either; and the history holds: no call twice, none lost.
func TestPartitionedHost(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	databaseAddr := hostPort(t, b.direct.Config().ConnString())

	cut := newHost(t, databaseAddr)
	other := newHost(t, databaseAddr)
	// The partitioned host's calls are slow, and its first calls (as many
	// as its dispatcher runs at once) act and then hold their answers until
	// the test lets them go, after the link is back and their leases were
	// taken over: its process has them in flight throughout.
	heldCalls := dispatcherConfig().Concurrency
	partitioned := cut.startHoldingDispatcher(b.schema, "netns-cut", 300*time.Millisecond, heldCalls)
	survivor := other.startDispatcher(b.schema, "netns-other", 2*time.Millisecond)
	// The partitioned host submits too: its transactions in flight at the
	// cut end rolled back, committed or unknown, and its history says which.
	submitter := cut.startSubmitter(b.schema, b.load.RunID+"-cut")
	stopSubmit := b.submit(t, 2, 5*time.Millisecond)

	table := ident.Quote(b.schema) + ".pgonce_key"
	held := func() map[string]int32 {
		rows, err := b.direct.Query(ctx, `SELECT encode(key, 'hex'), attempt FROM `+table+
			` WHERE worker LIKE 'netns-cut:%' AND lease_until IS NOT NULL`)
		require.NoError(t, err)
		defer rows.Close()
		keys := map[string]int32{}
		for rows.Next() {
			var key string
			var attempt int32
			require.NoError(t, rows.Scan(&key, &attempt))
			keys[key] = attempt
		}
		require.NoError(t, rows.Err())
		return keys
	}
	// inFlight is what the partitioned process reports holding: key →
	// the attempt its call runs.
	inFlight := func() map[string]int32 {
		keys := map[string]int32{}
		for _, e := range holdEvents(partitioned.stdout.String()) {
			if e.Event == "held" {
				keys[e.Key] = int32(e.Attempt) //nolint:gosec // a small attempt number
			}
		}
		return keys
	}
	// With more than half its slots held, the dispatcher claims no more
	// (it claims once half its slots are free) until they answer.
	minHeld := heldCalls/2 + 1
	require.Eventually(t, func() bool { return len(inFlight()) >= minHeld && len(held()) > 0 }, time.Minute, 10*time.Millisecond,
		"the host to be partitioned must hold leases, and %d calls in flight: %s\n%s", minHeld, partitioned.stdout, partitioned.stderr)

	cut.partition()
	tally.Fault("netns_partition")
	cutAt := time.Now()
	// What it held is on the server now; a write in flight when the link
	// went may still land when it returns, and must be fenced out.
	stranded := held()
	require.NotEmpty(t, stranded)
	stopReconcile := b.runReconciler(t)

	// Its leases are taken over: every key it held, and every key its
	// held calls run, is attempted again (or finished) by another worker
	// while the link is down.
	takenOver := func(keys map[string]int32) bool {
		rows, err := b.direct.Query(ctx, `SELECT encode(key, 'hex'), attempt, coalesce(worker, '') FROM `+table+
			` WHERE encode(key, 'hex') = ANY($1::text[])`, keysOf(keys))
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var key, worker string
			var attempt int32
			require.NoError(t, rows.Scan(&key, &attempt, &worker))
			if attempt == keys[key] && strings.HasPrefix(worker, "netns-cut:") {
				return false
			}
		}
		require.NoError(t, rows.Err())
		return true
	}
	// The calls it holds are final once the link is down: one that had not
	// acted by then fails at its deadline.
	var heldAtCut map[string]int32
	require.Eventually(t, func() bool {
		heldAtCut = inFlight()
		return takenOver(stranded) && takenOver(heldAtCut)
	}, time.Minute, 20*time.Millisecond, "the partitioned host's leases must be taken over after they expire")
	t.Logf("%d leases of the partitioned host taken over %s after the cut", len(stranded), time.Since(cutAt).Round(time.Millisecond))

	// The link comes back, and only then do the held calls answer: the
	// partitioned process records their outcomes late, over the healed
	// link. Every held call answers, and each one's outcome goes into
	// exactly one recording statement: the attempt is past its lease, so
	// [attempt.Runner.Record] tries once and never again. That statement
	// is fenced by the attempt and writes none of them.
	cut.heal()
	partitioned.release()
	lateRecords := func() (answered map[string]bool, recorded map[string][]holdEvent) {
		answered, recorded = map[string]bool{}, map[string][]holdEvent{}
		for _, e := range holdEvents(partitioned.stdout.String()) {
			switch e.Event {
			case "answered":
				answered[e.Key] = true
			case "record":
				for _, key := range e.Keys {
					recorded[key] = append(recorded[key], e)
				}
			}
		}
		return answered, recorded
	}
	require.Eventually(t, func() bool {
		answered, recorded := lateRecords()
		return len(answered) == len(heldAtCut) && len(recorded) == len(heldAtCut)
	}, time.Minute, 10*time.Millisecond, "the held calls must answer and the partitioned process try to record them")
	answered, recorded := lateRecords()
	refused, failed := 0, 0
	for key, attempt := range heldAtCut {
		require.True(t, answered[key], "held call of key %s must answer", key)
		require.Len(t, recorded[key], 1, "key %s: one late recording statement, never retried past the lease", key)
		e := recorded[key][0]
		for i, k := range e.Keys {
			if k == key {
				require.Equal(t, int(attempt), e.Attempts[i], "key %s: the late record carries the held attempt", key)
			}
		}
		switch {
		case e.Error != "":
			failed++ // the statement failed on a connection the partition broke
		case e.Others == 0:
			require.Zero(t, e.Rows, "late record of %v must write nothing: %+v", e.Keys, e)
			refused++
		default:
			// Other calls' outcomes shared the statement: it wrote at most
			// theirs.
			require.LessOrEqual(t, e.Rows, int64(e.Others), "late record of %v must write nothing: %+v", e.Keys, e)
			refused++
		}
	}
	t.Logf("late records of the %d held calls: %d refused by the attempt fence, %d failed and not retried past the lease",
		len(heldAtCut), refused, failed)
	// What the database holds for each held key is the takeover's: a later
	// attempt, which the fenced late statement could not have written.
	lateState := map[string]int32{}
	rows, err := b.direct.Query(ctx, `SELECT encode(key, 'hex'), attempt FROM `+table+
		` WHERE encode(key, 'hex') = ANY($1::text[])`, keysOf(heldAtCut))
	require.NoError(t, err)
	for rows.Next() {
		var key string
		var attempt int32
		require.NoError(t, rows.Scan(&key, &attempt))
		lateState[key] = attempt
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.Len(t, lateState, len(heldAtCut))
	for key, attempt := range heldAtCut {
		require.Greater(t, lateState[key], attempt, "key %s: the stored outcome must be a later attempt's", key)
	}

	stopSubmit()
	stopReconcile()
	submitter.stopSubmitter(t, b.history)
	partitioned.stop(t)
	survivor.stop(t)

	b.finish(t, faults.CheckOpts{Crashed: true})

	// Each key it held ended at a later attempt than the one it held, and
	// the writes it could still send for the attempts it held (its late
	// outcomes, arriving after the link is back) are fenced out: they
	// write nothing, and every stored outcome stays as it is.
	st, err := store.NewPgxDriver(b.direct, b.schema)
	require.NoError(t, err)
	before := map[string]outbox.Result{}
	var late []store.Outcome
	rows, err = b.direct.Query(ctx, `SELECT encode(key, 'hex'), encode(scope, 'hex'), attempt FROM `+table+
		` WHERE encode(key, 'hex') = ANY($1::text[])`, keysOf(stranded))
	require.NoError(t, err)
	for rows.Next() {
		var key, scope string
		var attempt int32
		require.NoError(t, rows.Scan(&key, &scope, &attempt))
		require.Greater(t, attempt, stranded[key], "key %s must have been taken over", key)
		res, err := b.checker.Get(ctx, outbox.Key("k1_"+key))
		require.NoError(t, err)
		before[key] = res
		late = append(late, store.Outcome{
			Key: "k1_" + key, Scope: scope, Attempt: int(stranded[key]), State: store.StateSucceeded,
			Response: []byte(`{"late":true}`), Retention: time.Hour,
		})
	}
	require.NoError(t, rows.Err())
	rows.Close()
	written, err := st.Store().Finish(ctx, &store.FinishParams{Outcomes: late, TombstoneRetention: 2 * time.Hour})
	require.NoError(t, err)
	require.Empty(t, written, "late outcomes of the partitioned host must be fenced out")
	for key, res := range before {
		after, err := b.checker.Get(ctx, outbox.Key("k1_"+key))
		require.NoError(t, err)
		require.Equal(t, res.State, after.State, "key %s", key)
		require.Equal(t, string(res.Response), string(after.Response), "key %s", key)
	}
}

func keysOf(m map[string]int32) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	return keys
}
