package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

func TestListenLoopLeavesAHalfOpenConnection(t *testing.T) {
	t.Parallel()

	proxy, pool := pgoncetest.NewBlackHoleProxy(t, 4)
	driver, err := store.NewPgxDriver(pool, pgoncetest.NewSchemaName(t))
	require.NoError(t, err)
	s := driver.Store()

	ready := make(chan struct{}, 8)
	lost := make(chan error, 8)
	notified := make(chan string, 8)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		s.ListenLoop(ctx, []string{s.WorkChannel}, 200*time.Millisecond,
			func() { ready <- struct{}{} },
			func(n *pgconn.Notification) { notified <- n.Payload },
			func(err error, _ time.Duration) { lost <- err })
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})

	await := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s never happened", what)
		}
	}
	await("listening", ready)

	// The server vanishes without closing the connection: the listener
	// must notice by itself, since no notification will ever arrive to
	// fail on.
	proxy.BlackHole()
	select {
	case err := <-lost:
		require.Error(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the listener never noticed its half-open connection")
	}
	await("listening again", ready)

	_, err = pgoncetest.Pool(t).Exec(t.Context(), "SELECT pg_notify($1, 'after')", s.WorkChannel)
	require.NoError(t, err)
	select {
	case payload := <-notified:
		require.Equal(t, "after", payload)
	case <-time.After(20 * time.Second):
		t.Fatal("no notification after reconnecting")
	}
}
