package pgoncetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// FirstConnectBudget bounds how long the harness retries its first
// connection to the test database before it says no server can be used: a
// server that is up may take seconds to answer on a busy machine.
const FirstConnectBudget = time.Minute

// firstConnectAttempt bounds one attempt of the first connection.
const firstConnectAttempt = 15 * time.Second

// ServerAbsentError says that nothing listened at the test database's
// address for the whole of the first connection's budget: every attempt
// was refused, or the host could not be reached or resolved.
type ServerAbsentError struct {
	Addr     string
	Budget   time.Duration
	Attempts int
	Err      error // the last attempt's
}

func (e *ServerAbsentError) Error() string {
	return fmt.Sprintf("no PostgreSQL server listens at %s: %d attempts over %s were refused or could not reach it (%v)",
		e.Addr, e.Attempts, e.Budget, e.Err)
}

func (e *ServerAbsentError) Unwrap() error { return e.Err }

// ServerSlowError says that something answered at the test database's
// address but no connection was ready within the first connection's
// budget: a server that is up but slow, busy or starting, not an absent one.
type ServerSlowError struct {
	Addr     string
	Budget   time.Duration
	Attempts int
	Err      error // the last attempt's
}

func (e *ServerSlowError) Error() string {
	return fmt.Sprintf("a PostgreSQL server at %s answered, but no connection was ready within %s (%d attempts; "+
		"the server is up but slow, busy or starting, not absent): %v", e.Addr, e.Budget, e.Attempts, e.Err)
}

func (e *ServerSlowError) Unwrap() error { return e.Err }

// ServerRejectedError says that the server at the test database's address
// answered and refused the connection for good (authentication, a missing
// database): retrying would not help.
type ServerRejectedError struct {
	Addr string
	Err  error
}

func (e *ServerRejectedError) Error() string {
	return fmt.Sprintf("the PostgreSQL server at %s rejected the connection: %v", e.Addr, e.Err)
}

func (e *ServerRejectedError) Unwrap() error { return e.Err }

// connect opens the shared pool over url, retrying its first connection
// for up to budget, and says, when it gives up, whether the server was
// absent ([ServerAbsentError]), slow ([ServerSlowError]) or rejected the
// connection ([ServerRejectedError]).
func connect(ctx context.Context, url string, budget time.Duration) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = 32
	network, addr := serverAddr(&config.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, err
	}
	if err := awaitFirstConnection(ctx, pool, network, addr, budget, nil); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// awaitFirstConnection pings pool until a ping succeeds, the server rejects
// the connection for good, or budget has passed. failedFunc, when not nil,
// is called with each failed attempt's error.
func awaitFirstConnection(ctx context.Context, pool *pgxpool.Pool, network, addr string, budget time.Duration,
	failedFunc func(error),
) error {
	budgetCtx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	attempts, answered := 0, false
	var last error
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		attempts++
		attemptCtx, cancelAttempt := context.WithTimeout(budgetCtx, firstConnectAttempt)
		last = pool.Ping(attemptCtx)
		cancelAttempt()
		if last == nil {
			return nil
		}
		if failedFunc != nil {
			failedFunc(last)
		}
		switch classifyConnectError(budgetCtx, network, addr, last) {
		case connectRejected:
			return &ServerRejectedError{Addr: addr, Err: last}
		case connectSlow:
			answered = true
		case connectAbsent:
		}
		select {
		case <-budgetCtx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("connect to %s: %w", addr, ctx.Err())
			}
			if answered {
				return &ServerSlowError{Addr: addr, Budget: budget, Attempts: attempts, Err: last}
			}
			return &ServerAbsentError{Addr: addr, Budget: budget, Attempts: attempts, Err: last}
		case <-time.After(delay):
		}
	}
}

// connectOutcome is what a failed first connection says of the server.
type connectOutcome int

const (
	// connectAbsent: nothing listened (refused, unreachable, unresolved).
	connectAbsent connectOutcome = iota
	// connectSlow: something listened but no connection was ready in
	// time, or the server said it could not take one now.
	connectSlow
	// connectRejected: the server refused the connection for good.
	connectRejected
)

// classifyConnectError says what err, a failed ping's, says of the server
// at network and addr. An error that is not the server's own answer is
// told apart by dialling addr: something that accepts a connection is
// there.
func classifyConnectError(ctx context.Context, network, addr string, err error) connectOutcome {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "57P03", // cannot_connect_now: starting up, shutting down, recovering
			len(pgErr.Code) == 5 && pgErr.Code[:2] == "53": // insufficient resources: too many connections
			return connectSlow
		default:
			return connectRejected
		}
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return connectAbsent
	}
	// Not under the budget, which may have just passed.
	dialCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	conn, dialErr := (&net.Dialer{}).DialContext(dialCtx, network, addr)
	if dialErr != nil {
		return connectAbsent
	}
	_ = conn.Close()
	return connectSlow
}

// serverAddr returns the network and address config connects to: a TCP
// host and port, or a Unix socket when the host is a directory.
func serverAddr(config *pgconn.Config) (network, addr string) {
	if strings.HasPrefix(config.Host, "/") {
		return "unix", filepath.Join(config.Host, fmt.Sprintf(".s.PGSQL.%d", config.Port))
	}
	return "tcp", net.JoinHostPort(config.Host, strconv.Itoa(int(config.Port)))
}
