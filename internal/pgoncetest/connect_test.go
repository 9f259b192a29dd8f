package pgoncetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

// lazyPool returns a pool over the test database's URL with its address
// replaced by addr, which connects only when used.
func lazyPool(t *testing.T, addr, database string) *pgxpool.Pool {
	t.Helper()
	config, err := pgxpool.ParseConfig(DatabaseURL(t))
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	var portNum uint16
	_, err = fmt.Sscan(port, &portNum)
	require.NoError(t, err)
	config.ConnConfig.Host, config.ConnConfig.Port, config.ConnConfig.Fallbacks = host, portNum, nil
	if database != "" {
		config.ConnConfig.Database = database
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// forwarder forwards the TCP connections it accepts on listener to the test
// database, until the test ends.
func forwarder(t *testing.T, listener net.Listener) {
	t.Helper()
	config, err := pgxpool.ParseConfig(DatabaseURL(t))
	require.NoError(t, err)
	target := net.JoinHostPort(config.ConnConfig.Host, fmt.Sprint(config.ConnConfig.Port))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
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
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(server, client); _ = server.Close() })
			wg.Go(func() { _, _ = io.Copy(client, server); _ = client.Close() })
		}
	})
	t.Cleanup(func() {
		_ = listener.Close()
		mu.Lock()
		for _, conn := range conns {
			_ = conn.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

func TestFirstConnection(t *testing.T) {
	t.Parallel()

	t.Run("RefusedThenAcceptedConnects", func(t *testing.T) {
		t.Parallel()
		addr := freeAddr(t)
		pool := lazyPool(t, addr, "")
		failed := make(chan error, 1)
		done := make(chan error, 1)
		go func() {
			done <- awaitFirstConnection(t.Context(), pool, "tcp", addr, FirstConnectBudget, func(err error) {
				select {
				case failed <- err:
				default:
				}
			})
		}()
		// The server comes up once the harness has been refused.
		require.ErrorIs(t, <-failed, syscall.ECONNREFUSED)
		listener, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		forwarder(t, listener)
		require.NoError(t, <-done)
	})

	t.Run("NothingListeningIsAbsent", func(t *testing.T) {
		t.Parallel()
		addr := freeAddr(t)
		err := awaitFirstConnection(t.Context(), lazyPool(t, addr, ""), "tcp", addr, 300*time.Millisecond, nil)
		var absent *ServerAbsentError
		require.ErrorAs(t, err, &absent)
		require.Equal(t, addr, absent.Addr)
		require.Positive(t, absent.Attempts)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.Contains(t, err.Error(), "no PostgreSQL server listens at "+addr)
	})

	t.Run("SilentListenerIsSlowNotAbsent", func(t *testing.T) {
		t.Parallel()
		// Accepts connections and never answers: a server too busy to
		// finish a handshake within the budget.
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		var mu sync.Mutex
		var held []net.Conn
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				conn, err := listener.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, conn)
				mu.Unlock()
			}
		})
		t.Cleanup(func() {
			_ = listener.Close()
			wg.Wait()
			for _, conn := range held {
				_ = conn.Close()
			}
		})
		addr := listener.Addr().String()
		err = awaitFirstConnection(t.Context(), lazyPool(t, addr, ""), "tcp", addr, time.Second, nil)
		var slow *ServerSlowError
		require.ErrorAs(t, err, &slow)
		require.Equal(t, addr, slow.Addr)
		require.Contains(t, err.Error(), "up but slow, busy or starting, not absent")
	})

	t.Run("RejectionEndsAtOnce", func(t *testing.T) {
		t.Parallel()
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		forwarder(t, listener)
		addr := listener.Addr().String()
		attempts := 0
		err = awaitFirstConnection(t.Context(), lazyPool(t, addr, "pgonce_no_such_database"), "tcp", addr,
			FirstConnectBudget, func(error) { attempts++ })
		var rejected *ServerRejectedError
		require.ErrorAs(t, err, &rejected)
		require.Equal(t, 1, attempts, "a rejection is final")
		require.Contains(t, err.Error(), "rejected the connection")
	})

	t.Run("CallersContextEndsTheWait", func(t *testing.T) {
		t.Parallel()
		addr := freeAddr(t)
		ctx, cancel := context.WithCancel(t.Context())
		err := awaitFirstConnection(ctx, lazyPool(t, addr, ""), "tcp", addr, FirstConnectBudget, func(error) { cancel() })
		require.ErrorIs(t, err, context.Canceled)
		var absent *ServerAbsentError
		require.NotErrorAs(t, err, &absent, "a caller who left learns nothing of the server")
	})
}
