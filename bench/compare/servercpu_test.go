package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseProcStat(t *testing.T) {
	t.Parallel()

	t.Run("Backend", func(t *testing.T) {
		t.Parallel()
		// A PostgreSQL backend's line from Linux 6: utime 8, stime 3,
		// cutime 0, cstime 0.
		stat, err := parseProcStat("2218 (postgres) S 1 2218 2218 0 -1 4194560 1460 53 0 0 8 3 0 0 20 0 1 0 1228 225136640 7357 18446744073709551615 1 1 0 0 0 0 4194304 19935232 84487 0 0 0 17 1 0 0 0 0 0")
		require.NoError(t, err)
		require.Equal(t, procStat{comm: "postgres", ppid: 1, ticks: 11}, stat)
	})

	t.Run("ReapedChildrenCount", func(t *testing.T) {
		t.Parallel()
		stat, err := parseProcStat("7 (postgres) S 1 7 7 0 -1 0 0 0 0 0 100 20 4000 500 20 0 1 0 5 0 0")
		require.NoError(t, err)
		require.Equal(t, int64(120), stat.ticks, "utime + stime")
		require.Equal(t, int64(4500), stat.childTicks, "cutime + cstime")
	})

	t.Run("NameWithSpacesAndBrackets", func(t *testing.T) {
		t.Parallel()
		stat, err := parseProcStat("42 (a (b) c) R 41 0 0 0 0 0 0 0 0 0 1 2 3 4 20 0")
		require.NoError(t, err)
		require.Equal(t, procStat{comm: "a (b) c", ppid: 41, ticks: 3, childTicks: 7}, stat)
	})

	for _, tt := range []struct {
		name, line string
	}{
		{name: "NoName", line: "42 postgres S 1 0"},
		{name: "TooFewFields", line: "42 (postgres) S 1 0 0 0 0 0 0 0 0 0 1 2 3"},
		{name: "BadTime", line: "42 (postgres) S 1 0 0 0 0 0 0 0 0 0 1 x 3 4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseProcStat(tt.line)
			require.Error(t, err)
		})
	}
}

// TestServerCPU checks that the server's CPU is its postmaster's (with
// the children it reaped) and its children's, and no other process's.
func TestServerCPU(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	write := func(pid int, line string) {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, strconv.Itoa(pid)), 0o750))
		require.NoError(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(pid), "stat"), []byte(line+"\n"), 0o600))
	}
	write(1, "1 (init) S 0 1 1 0 -1 0 0 0 0 0 500 500 9000 9000 20 0")
	write(100, "100 (postgres) S 1 100 100 0 -1 0 0 0 0 0 10 5 200 30 20 0") // the postmaster: 245
	write(101, "101 (postgres) S 100 101 101 0 -1 0 0 0 0 0 40 2 0 0 20 0")  // a backend: 42
	write(102, "102 (postgres) S 100 102 102 0 -1 0 0 0 0 0 7 6 0 0 20 0")   // the checkpointer: 13
	// The checkpointer's schedstat says 130 ms, which counts instead of
	// its stat's 13 ticks and rounds nothing off.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "102", "schedstat"), []byte("130000001 5 7\n"), 0o600))
	write(200, "200 (postgres) S 1 200 200 0 -1 0 0 0 0 0 1000 1000 0 0 20 0")   // another cluster's postmaster
	write(201, "201 (postgres) S 200 201 201 0 -1 0 0 0 0 0 1000 1000 0 0 20 0") // and its backend
	require.NoError(t, os.WriteFile(filepath.Join(dir, "uptime"), []byte("1 1\n"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "self"), 0o750))

	cpu, err := serverCPU(dir, 100)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second+time.Nanosecond, cpu, "287 ticks of 10 ms and the checkpointer's 130,000,001 ns")

	_, err = serverCPU(dir, 300)
	require.ErrorContains(t, err, "postmaster 300 is gone")

	own, err := processCPU(dir, []int{100, 101, 102, 999})
	require.NoError(t, err)
	require.Equal(t, map[int]time.Duration{100: 150 * time.Millisecond, 101: 420 * time.Millisecond, 102: 130000001}, own,
		"own time only; a process gone is left out")
}

// TestCPUReadingSince checks the run's share: what each process of the
// second reading spent since the first.
func TestCPUReadingSince(t *testing.T) {
	t.Parallel()

	ms := time.Millisecond
	before := cpuReading{all: 10 * time.Second, pids: map[int]time.Duration{100: 15 * ms, 101: 40 * ms, 102: 7 * ms, 103: 500 * ms}}
	after := cpuReading{all: 12 * time.Second, pids: map[int]time.Duration{
		100: 16 * ms, // the postmaster: 1 ms
		101: 60 * ms, // a backend: 20 ms
		// 102 ended meanwhile: lost.
		104: 30 * ms, // a backend that began meanwhile: all of its 30 ms
		103: 4 * ms,  // pid 103 reused by a new process: all of its 4 ms
	}}
	share, all := after.since(before)
	require.Equal(t, 55*ms, share)
	require.Equal(t, 2*time.Second, all)
}

func TestParseSchedstat(t *testing.T) {
	t.Parallel()

	ran, err := parseSchedstat("2385200946 5044089152 8365\n")
	require.NoError(t, err)
	require.Equal(t, 2385200946*time.Nanosecond, ran)

	_, err = parseSchedstat("1 2")
	require.Error(t, err)
}

func TestServerCPUPerCall(t *testing.T) {
	t.Parallel()

	require.InDelta(t, 250.0, result{count: 40, serverCPU: 10 * time.Millisecond}.serverCPUPerCall(), 1e-9)
	require.Zero(t, result{count: 40}.serverCPUPerCall(), "not measured")
	require.Zero(t, result{count: 40, serverCPU: -1}.serverCPUPerCall(), "unreadable")
	require.InDelta(t, 500.0, result{count: 40, serverCPUAll: 20 * time.Millisecond}.serverCPUAllPerCall(), 1e-9)
}
