package store_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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

func TestReserveListener(t *testing.T) {
	t.Parallel()

	pgxStore := func(t *testing.T, maxConns int32) *store.Store {
		t.Helper()
		config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
		require.NoError(t, err)
		config.MaxConns = maxConns
		pool, err := pgxpool.NewWithConfig(t.Context(), config)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		driver, err := store.NewPgxDriver(pool, pgoncetest.NewSchemaName(t))
		require.NoError(t, err)
		return driver.Store()
	}
	stdStore := func(t *testing.T, maxOpen int) (*store.Store, *sql.DB) {
		t.Helper()
		db, err := sql.Open("pgx", pgoncetest.DatabaseURL(t))
		require.NoError(t, err)
		db.SetMaxOpenConns(maxOpen)
		t.Cleanup(func() { _ = db.Close() })
		driver, err := store.NewStdDriver(db, pgoncetest.NewSchemaName(t))
		require.NoError(t, err)
		return driver.Store(), db
	}

	t.Run("RefusedByAPoolOfOne", func(t *testing.T) {
		t.Parallel()
		_, maxConns, ok := pgxStore(t, 1).ReserveListener()
		require.False(t, ok)
		require.Equal(t, 1, maxConns)

		s, _ := stdStore(t, 1)
		_, maxConns, ok = s.ReserveListener()
		require.False(t, ok)
		require.Equal(t, 1, maxConns)
	})

	t.Run("LeavesOneConnectionForStatements", func(t *testing.T) {
		t.Parallel()
		s := pgxStore(t, 2)
		release, _, ok := s.ReserveListener()
		require.True(t, ok)
		_, _, ok = s.ReserveListener()
		require.False(t, ok, "a second listener would leave no connection")
		release()
		release() // a second release gives nothing back twice
		again, _, ok := s.ReserveListener()
		require.True(t, ok)
		again()
	})

	t.Run("UnlimitedDatabaseSQL", func(t *testing.T) {
		t.Parallel()
		s, _ := stdStore(t, 0)
		for range 3 {
			release, maxConns, ok := s.ReserveListener()
			require.True(t, ok)
			require.Zero(t, maxConns)
			t.Cleanup(release)
		}
	})

	t.Run("ReadsSetMaxOpenConnsAfterNew", func(t *testing.T) {
		t.Parallel()
		s, db := stdStore(t, 0)
		db.SetMaxOpenConns(1)
		_, _, ok := s.ReserveListener()
		require.False(t, ok)
	})
}
