package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// procDir is where Linux shows its processes.
const procDir = "/proc"

// userHz is the unit of the times in /proc/<pid>/stat: USER_HZ, which
// Linux fixes at 100 ticks a second for user space whatever the kernel's
// own tick rate (getconf CLK_TCK says so).
const userHz = 100

// A process's own CPU time is read from /proc/<pid>/schedstat, whose first
// field is the nanoseconds the process has run: the utime + stime of
// /proc/<pid>/stat is the same time, cut to whole ticks of 10 ms per
// process, which loses up to 10 ms for each of a few dozen backends at
// each reading — as much as a short measurement's whole figure. The
// stat's times stand in where schedstat is missing (a kernel without
// CONFIG_SCHED_INFO), and give the reaped children's time, which only
// exists in ticks.

// procStat is what the harness reads of one /proc/<pid>/stat line.
type procStat struct {
	comm string
	ppid int
	// ticks is utime + stime, the process's own CPU time, and
	// childTicks cutime + cstime, that of the children it has reaped, in
	// USER_HZ ticks.
	ticks, childTicks int64
}

// parseProcStat parses one /proc/<pid>/stat line. The command name sits
// in brackets and may itself hold spaces and brackets, so the fields are
// counted from the last closing bracket.
func parseProcStat(line string) (procStat, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("parse process stat %q: no command name", line)
	}
	// After the name: state (field 3), ppid (4), …, utime (14), stime
	// (15), cutime (16), cstime (17), as proc(5) numbers them.
	fields := strings.Fields(line[end+1:])
	const ppidAt, utimeAt, cstimeAt = 1, 11, 14
	if len(fields) <= cstimeAt {
		return procStat{}, fmt.Errorf("parse process stat %q: %d fields after the name, want at least %d", line, len(fields), cstimeAt+1)
	}
	ppid, err := strconv.Atoi(fields[ppidAt])
	if err != nil {
		return procStat{}, fmt.Errorf("parse process stat %q: ppid: %w", line, err)
	}
	var times [4]int64
	for i, field := range fields[utimeAt : cstimeAt+1] {
		if times[i], err = strconv.ParseInt(field, 10, 64); err != nil {
			return procStat{}, fmt.Errorf("parse process stat %q: times: %w", line, err)
		}
	}
	return procStat{comm: line[open+1 : end], ppid: ppid, ticks: times[0] + times[1], childTicks: times[2] + times[3]}, nil
}

// parseSchedstat parses one /proc/<pid>/schedstat line: the time the
// process has run, the time it has waited to run, in nanoseconds, and its
// count of time slices.
func parseSchedstat(line string) (time.Duration, error) {
	fields := strings.Fields(line)
	if len(fields) != 3 {
		return 0, fmt.Errorf("parse schedstat %q: want 3 fields", line)
	}
	ns, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse schedstat %q: %w", line, err)
	}
	return time.Duration(ns), nil
}

// ownCPU returns the CPU time process pid, whose stat is stat, has spent
// itself, from dir/<pid>/schedstat, else from stat.
func ownCPU(dir string, pid int, stat procStat) time.Duration {
	data, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(pid), "schedstat")) //nolint:gosec // a pid under /proc
	if err == nil {
		if ran, err := parseSchedstat(string(data)); err == nil {
			return ran
		}
	}
	return ticksToDuration(stat.ticks)
}

// readProcStat reads and parses dir/<pid>/stat.
func readProcStat(dir string, pid int) (procStat, error) {
	data, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(pid), "stat")) //nolint:gosec // a pid under /proc
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(strings.TrimSpace(string(data)))
}

// gone reports whether err says the process ended since it was listed.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// ticksToDuration converts USER_HZ ticks to a duration.
func ticksToDuration(ticks int64) time.Duration {
	return time.Duration(ticks) * time.Second / userHz
}

// serverCPU returns the CPU time the PostgreSQL server whose postmaster is
// the process postmaster has spent so far: the user and system time of
// the postmaster and of every child of it (backends, parallel workers,
// the checkpointer, the WAL writer, autovacuum and the rest), plus that of
// the children the postmaster has reaped, so that a backend which exits
// between two readings still counts. Other clients' work on the same
// server counts too. dir is /proc but in tests.
func serverCPU(dir string, postmaster int) (time.Duration, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("read server CPU: %w", err)
	}
	var cpu time.Duration
	found := false
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil || !entry.IsDir() {
			continue
		}
		stat, err := readProcStat(dir, pid)
		if err != nil {
			// A process that ended since the listing: its time is its
			// parent's now.
			if gone(err) {
				continue
			}
			return 0, fmt.Errorf("read server CPU: %w", err)
		}
		if pid == postmaster {
			found = true
		} else if stat.ppid != postmaster {
			continue
		}
		cpu += ownCPU(dir, pid, stat) + ticksToDuration(stat.childTicks)
	}
	if !found {
		return 0, fmt.Errorf("read server CPU: postmaster %d is gone", postmaster)
	}
	return cpu, nil
}

// processCPU returns the own CPU time of each of pids that still runs.
// dir is /proc but in tests.
func processCPU(dir string, pids []int) (map[int]time.Duration, error) {
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		stat, err := readProcStat(dir, pid)
		if err != nil {
			if gone(err) {
				continue
			}
			return nil, fmt.Errorf("read process CPU: %w", err)
		}
		out[pid] = ownCPU(dir, pid, stat)
	}
	return out, nil
}

// cpuReading is the server's CPU time at one moment: the whole server's,
// and each of the harness's share of processes' own.
type cpuReading struct {
	all  time.Duration
	pids map[int]time.Duration
}

// since returns the CPU time spent between before and r: the harness's
// share, the sum over the processes of r of what each spent since before
// (all it has, for a process that began meanwhile; a process that ended
// meanwhile is lost with its time), and the whole server's.
func (r cpuReading) since(before cpuReading) (share, all time.Duration) {
	for pid, now := range r.pids {
		then := before.pids[pid]
		if then > now {
			// A pid reused by a new process.
			then = 0
		}
		share += now - then
	}
	return share, r.all - before.all
}

// localPostmaster returns the pid of the postmaster of the server behind
// the harness's pool when it runs on this machine, seen in /proc: the
// parent of the harness's own backend, both named postgres. It returns 0
// when the server is elsewhere (another host, or a container whose pids
// this machine does not see): server CPU is then left unmeasured.
func (env *environment) localPostmaster(ctx context.Context) (int, error) {
	var backend int
	if err := env.pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, fmt.Errorf("backend pid: %w", err)
	}
	stat, err := readProcStat(procDir, backend)
	if err != nil || stat.comm != "postgres" {
		return 0, nil //nolint:nilerr // not on this machine: no figure, no error
	}
	parent, err := readProcStat(procDir, stat.ppid)
	if err != nil || parent.comm != "postgres" {
		return 0, nil //nolint:nilerr // as above
	}
	return stat.ppid, nil
}

// readServerCPU reads the server's CPU time so far, or returns false when
// the server is not on this machine or its processes could not be read
// (the measurement still counts, without the figure). The harness's share
// is the postmaster's own time, and that of every backend of the
// harness's connections (its application_name) and of every process of
// the server that serves no client (the checkpointer, the WAL writer,
// autovacuum, parallel workers): everything but other clients' backends,
// which a shared server has.
func (env *environment) readServerCPU(ctx context.Context) (cpuReading, bool) {
	if env.postmaster == 0 {
		return cpuReading{}, false
	}
	rows, err := env.pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE application_name = $1 OR backend_type <> 'client backend'`, env.applicationName)
	if err != nil {
		return cpuReading{}, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return cpuReading{}, false
	}
	reading := cpuReading{}
	if reading.pids, err = processCPU(procDir, append(pids, env.postmaster)); err != nil {
		return cpuReading{}, false
	}
	if reading.all, err = serverCPU(procDir, env.postmaster); err != nil {
		return cpuReading{}, false
	}
	return reading, true
}
