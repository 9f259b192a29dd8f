package faults

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// KillBackends terminates, with pg_terminate_backend, the server backends
// whose application_name is applicationName, and returns how many it ended.
// When running is not empty, only backends running a statement whose text
// contains it are ended. pool must reach the same server; its own backend
// is never ended.
func KillBackends(ctx context.Context, pool *pgxpool.Pool, applicationName, running string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity
		WHERE application_name = $1
			AND pid <> pg_backend_pid()
			AND ($2 = '' OR (state = 'active' AND strpos(query, $2) > 0))`,
		applicationName, running).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("kill backends: %w", err)
	}
	return n, nil
}

// AwaitBlocked waits until a backend of applicationName runs a statement
// whose text contains running and waits on a lock, and returns its pid.
func AwaitBlocked(ctx context.Context, pool *pgxpool.Pool, applicationName, running string) (int, error) {
	for {
		var pid int
		err := pool.QueryRow(ctx, `
			SELECT coalesce(min(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'active'
				AND wait_event_type = 'Lock' AND strpos(query, $2) > 0`,
			applicationName, running).Scan(&pid)
		if err != nil {
			return 0, fmt.Errorf("await blocked backend: %w", err)
		}
		if pid != 0 {
			return pid, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("await blocked backend running %q: %w", running, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TerminateBackend ends the backend pid with pg_terminate_backend.
func TerminateBackend(ctx context.Context, pool *pgxpool.Pool, pid int) error {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil {
		return fmt.Errorf("terminate backend %d: %w", pid, err)
	}
	if !ok {
		return fmt.Errorf("terminate backend %d: no such backend", pid)
	}
	return nil
}

// AwaitGone waits until the backend pid has left pg_stat_activity.
// pg_terminate_backend only signals a backend: until it exits, it still
// shows, blocked where it was, and a second look would find it again.
func AwaitGone(ctx context.Context, pool *pgxpool.Pool, pid int) error {
	for {
		var there bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&there)
		if err != nil {
			return fmt.Errorf("await backend %d gone: %w", pid, err)
		}
		if !there {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("await backend %d gone: %w", pid, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// KillAnyBackend terminates one backend of applicationName, picked at
// random, and returns what it was doing: the name of the pgonce statement it
// ran ("OutboxClaimBatch", "KeyInsert", …), "idle", or another activity. It
// returns "" when applicationName has no backend.
func KillAnyBackend(ctx context.Context, pool *pgxpool.Pool, applicationName string) (string, error) {
	var doing string
	err := pool.QueryRow(ctx, `
		WITH victim AS (
			SELECT pid,
				CASE
					WHEN state = 'active' AND query ~ '-- name: \w+'
						THEN substring(query FROM '-- name: (\w+)')
					WHEN state = 'idle' AND query ILIKE 'LISTEN%' THEN 'listen'
					ELSE coalesce(state, 'unknown')
				END AS doing
			FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()
			ORDER BY random()
			LIMIT 1
		)
		SELECT doing FROM victim WHERE pg_terminate_backend(pid)`, applicationName).Scan(&doing)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("kill a backend: %w", err)
	}
	return doing, nil
}
