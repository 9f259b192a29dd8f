package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// smallPoolPolls is how many times the wait of each request of
// TestSmallPool arms its timer before the provider answers: enough for a
// wait backing off from 50ms (50, 100, 200, 400ms, ...) to reach its cap.
const smallPoolPolls = 6

// TestSmallPool is the service of a report whose requests waited 4s for
// results that their dispatcher, in the same process over a pool of two
// connections, took 8s to deliver: a pool of two connections shared by a
// dispatcher and many requests that each submit a call and wait for its
// result. Such waits cannot listen, so they re-read their keys at most
// 250ms apart rather than backing off to 2s: every request gets its result,
// each wait's timer reaches 250ms and never more while the provider holds
// its call, and the dispatcher warns that the pool is smaller than it needs.
// The provider answers once its key's wait has armed its timer
// smallPoolPolls times, so the test counts re-reads, not how long they take. It runs over
// direct connections only: behind a transaction pooler the dispatcher's
// listener has a direct connection of its own, and never shares the pool.
func TestSmallPool(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testSmallPool[pgx.Tx], testSmallPool[*sql.Tx])
}

func testSmallPool[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	schema := pgoncetest.Schema(t)
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	polls := newPollCounter()
	// A provider as slow as the report's: it answers only once the wait for
	// its key has backed off to its cap.
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("email", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		select {
		case <-polls.reached(req.Key, smallPoolPolls):
			return json.RawMessage(`{"sent":true}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), outbox.IdempotentByKey))
	logs := &logRecorder{}
	client := driver.ClientOver(t, pool, outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(logs)})
	outbox.SetWaitPolledFunc(client, polls.polled)

	d, err := dispatcher.New(client, dispatcher.Config{})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	ran := make(chan error, 1)
	go func() { ran <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-ran:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("Dispatcher.Run over two connections did not return after it was stopped")
		}
	})

	const requests = 16
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	keys := make(chan outbox.Key, requests)
	for i := range requests {
		wg.Go(func() {
			// A deadline for a test gone wrong, not a measure: the requests
			// take a few seconds at most on an idle machine.
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			res, err := client.Submit(ctx, outbox.Call{RunID: "req", Step: int64(i), Tool: "email", Args: map[string]any{"n": i}})
			if err != nil {
				errs <- fmt.Errorf("request %d: submit: %w", i, err)
				return
			}
			res, err = client.Wait(ctx, res.Key)
			if err != nil {
				errs <- fmt.Errorf("request %d: wait: %w (last state %s)", i, err, res.State)
				return
			}
			if res.State != outbox.StateSucceeded {
				errs <- fmt.Errorf("request %d: state %s", i, res.State)
				return
			}
			keys <- res.Key
		})
	}
	wg.Wait()
	close(errs)
	close(keys)
	for err := range errs {
		t.Error(err)
	}
	for key := range keys {
		next := polls.of(key)
		require.GreaterOrEqual(t, len(next), smallPoolPolls, "key %s", key)
		require.Equal(t, 250*time.Millisecond, slices.Max(next),
			"the wait for key %s, which cannot listen, re-reads it at most 250ms apart: %v", key, next)
	}
	require.True(t, logs.contains("pool is smaller than a dispatcher and waits in one process need"),
		"the dispatcher warns that the pool is small: %v", logs.messages)
}

// pollCounter keeps, by key, the intervals the waits of a client armed
// their timers with (see [outbox.SetWaitPolledFunc]).
type pollCounter struct {
	mu      sync.Mutex
	next    map[outbox.Key][]time.Duration
	waiting map[outbox.Key][]pollTarget
}

type pollTarget struct {
	polls int
	ch    chan struct{}
}

func newPollCounter() *pollCounter {
	return &pollCounter{next: map[outbox.Key][]time.Duration{}, waiting: map[outbox.Key][]pollTarget{}}
}

func (pc *pollCounter) polled(key outbox.Key, next time.Duration) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.next[key] = append(pc.next[key], next)
	kept := pc.waiting[key][:0]
	for _, target := range pc.waiting[key] {
		if len(pc.next[key]) >= target.polls {
			close(target.ch)
		} else {
			kept = append(kept, target)
		}
	}
	pc.waiting[key] = kept
}

// reached returns a channel closed once the waits for key have armed their
// timers polls times.
func (pc *pollCounter) reached(key outbox.Key, polls int) <-chan struct{} {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	ch := make(chan struct{})
	if len(pc.next[key]) >= polls {
		close(ch)
	} else {
		pc.waiting[key] = append(pc.waiting[key], pollTarget{polls: polls, ch: ch})
	}
	return ch
}

// of returns the intervals the waits for key armed their timers with.
func (pc *pollCounter) of(key outbox.Key) []time.Duration {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return slices.Clone(pc.next[key])
}
