package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsTransient reports whether err is a failure that the same statement may
// survive when it runs again on another connection: the connection was lost
// or could not be had (a killed backend, a restarting or unreachable server,
// a network cut, a statement deadline), or PostgreSQL refused for the
// moment (too many connections, a serialization failure, a deadlock, a
// server-side statement_timeout, lock_timeout or cancel request). The
// caller's own context being done is not transient: nothing retries for a
// caller who left. Errors in the statement or its data (a missing table, a
// bad value) are not transient either.
//
// database/sql reports a lost connection in words of its own:
// [driver.ErrBadConn] ("driver: bad connection") when the connection it
// took from its pool was found dead, even after its own retries, and
// [sql.ErrConnDone] for a connection that was returned to the pool after it
// broke. Both, wrapped or not, are transient.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // admin/crash shutdown, cannot connect now
			return true
		case pgErr.Code == "53300": // too many connections
			return true
		case pgErr.Code == "40001", pgErr.Code == "40P01":
			return true
		case pgErr.Code == "57014": // query canceled: statement_timeout or a cancel request
			return true
		case pgErr.Code == "55P03": // lock not available: lock_timeout
			return true
		}
		return false
	}
	if errors.Is(err, ErrSerialization) || errors.Is(err, ErrTimeout) {
		// InterpretError's translations of 40001/40P01 and 57014/55P03.
		return true
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, &connectErr), errors.As(err, &netErr),
		pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	// pgx reports a connection it had to close, or one that closed under
	// it, without a typed error.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "conn busy") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "unexpected EOF")
}

// MayHaveRun reports whether a statement that failed with err may still have
// run, and committed, on the server: the connection was lost after the
// statement was sent, so its reply went missing. It is false when the
// statement surely never reached the server.
func MayHaveRun(err error) bool {
	return err != nil && !pgconn.SafeToRetry(err)
}

// IsDataError reports whether err is PostgreSQL rejecting the data of a
// statement (SQLSTATE classes 22, data exception, and 23, integrity
// constraint violation, and 54, a value past a program limit): in a
// statement over a batch of rows, one bad row fails them all, and the rows
// written one by one would fail only alone.
func IsDataError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}
