package idempotency

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/header"
	"github.com/pgonce/pgonce/outbox"
)

// txFuncs begin, commit and roll back a transaction of type TTx.
type txFuncs[TTx any] struct {
	begin    func(ctx context.Context) (TTx, error)
	commit   func(ctx context.Context, tx TTx) error
	rollback func(ctx context.Context, tx TTx) error
}

// Middleware is an Idempotency-Key middleware whose handlers write to the
// same PostgreSQL as the keys: see the package documentation. It is safe
// for concurrent use.
type Middleware[TTx any] struct {
	client *outbox.Client[TTx]
	config Config
	tx     txFuncs[TTx]
	// keyed is set when the tool is delivered [outbox.IdempotentByKey]:
	// the handler passes the key downstream, so running it again is safe.
	keyed bool
}

// NewPgx returns a middleware over pool for a client of the same database.
// [Config.Tool] must be registered in the client's registry by [Register].
// It returns an error matching [ErrInvalidConfig] for an invalid config or a
// client without a registry, and also [ErrToolNotRegistered] when the tool
// is not registered by [Register].
//
// pool may be nil in [ModeLease], which opens no transaction.
func NewPgx(pool *pgxpool.Pool, client *outbox.Client[pgx.Tx], config Config) (*Middleware[pgx.Tx], error) {
	if pool == nil && config.Mode == ModeTx {
		return nil, fmt.Errorf("%w: ModeTx needs a pool", ErrInvalidConfig)
	}
	return newMiddleware(client, config, txFuncs[pgx.Tx]{
		begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
		commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
	})
}

// New is [NewPgx] for database/sql: db must be the database of client, and
// may be nil in [ModeLease].
func New(db *sql.DB, client *outbox.Client[*sql.Tx], config Config) (*Middleware[*sql.Tx], error) {
	if db == nil && config.Mode == ModeTx {
		return nil, fmt.Errorf("%w: ModeTx needs a db", ErrInvalidConfig)
	}
	return newMiddleware(client, config, txFuncs[*sql.Tx]{
		begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
	})
}

func newMiddleware[TTx any](client *outbox.Client[TTx], config Config, tx txFuncs[TTx]) (*Middleware[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client must not be nil", ErrInvalidConfig)
	}
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	registry := client.Config().Registry
	if registry == nil {
		return nil, fmt.Errorf("%w: the client needs a Registry", ErrInvalidConfig)
	}
	if err := checkTool(registry, config.Tool); err != nil {
		return nil, err
	}
	keyed := registry.Lookup(config.Tool).Delivery == outbox.IdempotentByKey
	return &Middleware[TTx]{client: client, config: config, tx: tx, keyed: keyed}, nil
}

type (
	txKey  struct{}
	keyKey struct{}
)

// Tx returns the transaction the middleware opened for the request of ctx:
// the handler's writes in it commit together with the stored response. It
// reports false outside the middleware, and for requests it passed through
// (a method it does not handle, no key).
func Tx[TTx any](ctx context.Context) (TTx, bool) {
	tx, ok := ctx.Value(txKey{}).(TTx)
	return tx, ok
}

// Key returns the key of the request of ctx as the store knows it: derived
// from the request's scope, its Idempotency-Key and the request itself, the
// same for every retry of the request, and never the same for two scopes.
// A handler that calls an API which deduplicates on a key of its own passes
// this one downstream (see [Register] and [outbox.IdempotentByKey]); the
// client's header alone would let two accounts' keys meet there. It reports
// false outside the middleware, and for requests it passed through.
func Key(ctx context.Context) (outbox.Key, bool) {
	key, ok := ctx.Value(keyKey{}).(outbox.Key)
	return key, ok
}

// Handler wraps next.
func (m *Middleware[TTx]) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware[TTx]) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.config.Methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(m.config.Header)
	if len(values) == 0 {
		if m.config.KeyRequired {
			writeProblem(w, http.StatusBadRequest, "missing-key", "Idempotency-Key is missing", "This operation requires an "+m.config.Header+" header.", 0)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	key, err := parseKey(values, m.config.MaxKeyLength)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "malformed-key", "Idempotency-Key is malformed", err.Error(), 0)
		return
	}
	scope, err := m.config.ScopeFunc(r)
	if err != nil {
		writeProblem(w, http.StatusUnauthorized, "unauthorized", "Request is not authorised", "The request's account could not be determined.", 0)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.config.MaxRequestBytes+1))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "unreadable-body", "Request body could not be read", err.Error(), 0)
		return
	}
	if int64(len(body)) > m.config.MaxRequestBytes {
		writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body is too large",
			fmt.Sprintf("The body exceeds %d bytes.", m.config.MaxRequestBytes), 0)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	call := outbox.Call{Tenant: scope, Tool: m.config.Tool, Key: key, Args: fingerprint(r, body)}
	if m.config.Mode == ModeLease {
		m.serveLease(w, r, next, call)
		return
	}

	ctx := r.Context()
	tx, err := m.tx.begin(ctx)
	if err != nil {
		m.writeError(w, err)
		return
	}
	done := false
	defer func() {
		if !done {
			_ = m.tx.rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	// The first request of a key holds it until its transaction ends; a
	// duplicate waits in ClaimTx on the key, then replays. Past
	// WaitTimeout it gives up with a 409.
	claimCtx, cancel := context.WithTimeout(ctx, m.config.WaitTimeout)
	claimed, err := m.client.ClaimTx(claimCtx, tx, call)
	waited := claimCtx.Err() != nil && ctx.Err() == nil
	cancel()
	if waited {
		err = &outbox.InProgressError{Key: claimed.Key, RetryAfter: m.config.RetryAfter}
	}
	if err != nil {
		m.writeError(w, err)
		return
	}
	if !claimed.Created {
		m.replay(w, claimed)
		return
	}

	rec := newRecorder(m.config.MaxResponseBytes)
	next.ServeHTTP(rec, r.WithContext(context.WithValue(context.WithValue(ctx, txKey{}, tx), keyKey{}, claimed.Key)))
	rec.finish()
	switch {
	case rec.tooLarge:
		writeProblem(w, http.StatusInternalServerError, "response-too-large", "Response is too large to store",
			fmt.Sprintf("The handler's response exceeds %d bytes; nothing was stored.", m.config.MaxResponseBytes), 0)
		return
	case rec.status >= 500:
		// A server error is no outcome: the handler's writes roll back
		// and the same key runs again.
		rec.send(w, rec.header)
		return
	}
	kept := m.keep(rec.header)
	stored, err := (&httpprovider.Response{Status: rec.status, Header: kept, Body: rec.body.Bytes()}).Encode()
	if err != nil {
		m.writeError(w, err)
		return
	}
	if _, err := m.client.CompleteTx(ctx, tx, claimed, stored); err != nil {
		m.writeError(w, err)
		return
	}
	done = true
	if err := m.tx.commit(ctx, tx); err != nil {
		m.writeError(w, err)
		return
	}
	rec.send(w, rec.header)
}

// Bounds of a lease-mode duplicate's wait (see [Middleware.serveLease]).
const (
	// leaseWaitSlice bounds one [outbox.Client.Wait] of a duplicate: a key
	// that a keyed route's 5xx put back to pending never leaves pending by
	// itself, so the duplicate looks again at least this often, and runs
	// the handler itself once the key is free.
	leaseWaitSlice = 500 * time.Millisecond
	// leaseRetryMin and leaseRetryMax bound the backoff between two claims
	// that failed transiently (a pool with no free connection within
	// StatementTimeout, too many connections, a dropped one).
	leaseRetryMin = 20 * time.Millisecond
	leaseRetryMax = 500 * time.Millisecond
)

// serveLease runs the request as [outbox.Client.Do] runs a provider. A
// duplicate that finds the key held by a running request waits for its
// outcome up to [Config.WaitTimeout], as in [ModeTx], and replays it; past
// it the answer is 409 with Retry-After. A claim that fails transiently is
// tried again within the same window: under load a pool may have no
// connection to give within the client's StatementTimeout, and that is no
// reason to answer a duplicate with a server error.
func (m *Middleware[TTx]) serveLease(w http.ResponseWriter, r *http.Request, next http.Handler, call outbox.Call) {
	var (
		ran      *recorder
		encoded  json.RawMessage
		unstored *recorder
	)
	handler := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		rec := newRecorder(m.config.MaxResponseBytes)
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, keyKey{}, req.Key)))
		rec.finish()
		if rec.tooLarge {
			// The handler may have acted: its outcome is unknown.
			return nil, outbox.Ambiguous(errResponseTooLarge)
		}
		if m.keyed && rec.status >= 500 {
			// On a route that passes the key downstream, a server error
			// is no outcome, as in ModeTx: the key stays pending and the
			// next request with it runs the handler again.
			unstored = rec
			return nil, outbox.Ambiguous(fmt.Errorf("the handler answered %d", rec.status))
		}
		stored, err := (&httpprovider.Response{Status: rec.status, Header: m.keep(rec.header), Body: rec.body.Bytes()}).Encode()
		ran, encoded = rec, stored
		return stored, err
	})
	ctx := r.Context()
	waitCtx, cancel := context.WithTimeout(ctx, m.config.WaitTimeout)
	defer cancel()
	held := false // another request was seen holding the key
	backoff := leaseRetryMin
	for {
		res, err := m.client.Do(ctx, call, handler)
		if ran != nil || unstored != nil {
			// This request ran the handler: its answer is the one to send.
			m.answerRan(w, res, err, ran, encoded, unstored)
			return
		}
		switch {
		case err == nil:
			m.answer(w, res)
			return
		case errors.Is(err, outbox.ErrInProgress) && res.State == outbox.StateInFlight:
			held = true
			sliceCtx, cancelSlice := context.WithTimeout(waitCtx, leaseWaitSlice)
			res, err = m.client.Wait(sliceCtx, res.Key)
			cancelSlice()
			switch {
			case err == nil:
				m.answer(w, res)
				return
			case ctx.Err() != nil || !errors.Is(err, outbox.ErrInProgress) && !outbox.IsTransient(err):
				m.writeError(w, err)
				return
			}
			// Still held, or the store did not answer in time: look again,
			// at once, as long as the duplicate may wait. A key a keyed
			// route's 5xx put back to pending is claimed by the next Do.
			backoff = leaseRetryMin
		case errors.Is(err, outbox.ErrInProgress):
			held = true // pending, and not claimable right now
			sleep(waitCtx, &backoff)
		case ctx.Err() != nil || !outbox.IsTransient(err):
			m.writeError(w, err)
			return
		default:
			// A transient failure before the handler ran: trying again is
			// safe. (A claim that committed but whose reply was lost is
			// found held by the next Do, and waited on.)
			sleep(waitCtx, &backoff)
		}
		if waitCtx.Err() != nil {
			if held {
				err = &outbox.InProgressError{Key: res.Key, RetryAfter: m.config.RetryAfter}
			}
			m.writeError(w, err)
			return
		}
	}
}

// sleep waits for *backoff or until ctx is done, and doubles *backoff up to
// leaseRetryMax.
func sleep(ctx context.Context, backoff *time.Duration) {
	timer := time.NewTimer(*backoff)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	*backoff = min(2**backoff, leaseRetryMax)
}

// answerRan answers the request whose Do ran the handler.
func (m *Middleware[TTx]) answerRan(w http.ResponseWriter, res outbox.Result, err error, ran *recorder, encoded json.RawMessage, unstored *recorder) {
	switch {
	case err != nil && unstored != nil && errors.Is(err, outbox.ErrProviderFailed):
		unstored.send(w, unstored.header)
	case err != nil && ran != nil:
		// The handler ran, but its response could not be stored: the key
		// stays in flight, and the reconciler resolves it by the route's
		// delivery once its lease expires. The client still gets what
		// happened.
		m.client.Config().Logger.Error("pgonce: idempotency: the handler's response could not be stored; the key is left to the reconciler",
			"key", res.Key, "error", err)
		ran.send(w, ran.header)
	case err != nil:
		m.writeError(w, err)
	case res.State == outbox.StateSucceeded && ran != nil && bytes.Equal(res.Response, encoded):
		// This request ran the handler (the first of its key, or the
		// retry of an abandoned one), and its response is the one stored.
		ran.send(w, ran.header)
	default:
		m.answer(w, res)
	}
}

// answer answers with a key's outcome: its stored response, or why there
// is none to give.
func (m *Middleware[TTx]) answer(w http.ResponseWriter, res outbox.Result) {
	if res.State == outbox.StateNeedsReview {
		writeProblem(w, http.StatusConflict, "needs-review", "The outcome of the request with this Idempotency-Key is unknown",
			"An operator must resolve it; nothing runs again until then.", 0)
		return
	}
	m.replay(w, res)
}

// replay answers with a key's stored outcome: the stored response of a
// succeeded key, the stored failure of a failed one (an operator may
// resolve a key either way), with [ReplayedHeader]. A resolution that is
// not a response envelope is answered as plain JSON: 200 with the JSON for
// a success, a 422 problem for a failure. A duplicate never gets a server
// error for an outcome that is stored.
func (m *Middleware[TTx]) replay(w http.ResponseWriter, res outbox.Result) {
	var stored json.RawMessage
	switch res.State {
	case outbox.StateSucceeded:
		stored = res.Response
	case outbox.StateFailed:
		stored = res.Failure
	case outbox.StateCancelled:
		writeProblem(w, http.StatusUnprocessableEntity, "cancelled", "The request with this Idempotency-Key was cancelled",
			"An operator cancelled it and it never runs; send a new request with a new key.", 0)
		return
	case outbox.StateNeedsReview:
		m.answer(w, res)
		return
	default:
		m.writeError(w, &outbox.InProgressError{Key: res.Key, RetryAfter: m.config.RetryAfter})
		return
	}
	resp, err := decodeStored(stored)
	switch {
	case err == nil:
	case res.State == outbox.StateSucceeded && json.Valid(stored):
		resp = &httpprovider.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: stored}
	default:
		writeProblem(w, http.StatusUnprocessableEntity, "failed", "The request with this Idempotency-Key failed",
			"Its failure was recorded; send a new request with a new key.", 0)
		return
	}
	for name, values := range resp.Header {
		w.Header()[name] = values
	}
	w.Header().Set(ReplayedHeader, "true")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// decodeStored decodes a stored response envelope. Earlier versions stored
// a handler that wrote nothing as {"status":0}; that is the empty 200
// net/http sent, and is replayed as such.
func decodeStored(stored json.RawMessage) (*httpprovider.Response, error) {
	resp, err := httpprovider.Decode(stored)
	if err == nil {
		return resp, nil
	}
	var legacy struct {
		Status  *int        `json:"status"`
		Headers http.Header `json:"headers"`
	}
	dec := json.NewDecoder(bytes.NewReader(stored))
	dec.DisallowUnknownFields()
	if dec.Decode(&legacy) != nil || legacy.Status == nil || *legacy.Status != 0 {
		return nil, err
	}
	if legacy.Headers == nil {
		legacy.Headers = http.Header{}
	}
	return &httpprovider.Response{Status: http.StatusOK, Header: legacy.Headers}, nil
}

// keep returns the headers of h that are stored.
func (m *Middleware[TTx]) keep(h http.Header) http.Header {
	if len(m.config.KeepHeaders) > 0 {
		return header.Keep(h, m.config.KeepHeaders)
	}
	kept := http.Header{}
	for name, values := range h {
		switch name {
		case "Set-Cookie", "Date", "Connection", "Keep-Alive", "Transfer-Encoding", "Trailer", "Upgrade", "Proxy-Connection":
			continue
		}
		kept[name] = slices.Clone(values)
	}
	return kept
}

// writeError answers an error of the store or the client.
func (m *Middleware[TTx]) writeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, outbox.ErrKeyConflict):
		writeProblem(w, http.StatusUnprocessableEntity, "key-reused", "Idempotency-Key reused with another request",
			"This key was used with a different method, path or body.", 0)
	case errors.Is(err, outbox.ErrInProgress):
		writeProblem(w, http.StatusConflict, "in-progress", "A request with this Idempotency-Key is being processed",
			"Retry later with the same key.", m.config.RetryAfter)
	case errors.Is(err, outbox.ErrExpired):
		writeProblem(w, http.StatusUnprocessableEntity, "key-expired", "Idempotency-Key expired",
			"This key was used long ago and its response is no longer kept; use a new key for a new request.", 0)
	case errors.Is(err, outbox.ErrInvalidCall) || errors.Is(err, outbox.ErrNotCanonical):
		writeProblem(w, http.StatusBadRequest, "malformed-key", "Idempotency-Key or scope is invalid", err.Error(), 0)
	case outbox.IsTransient(err):
		// The store did not answer in time (no free connection, too many
		// connections, a dropped one): nothing ran for this request.
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "The request could not be processed now",
			"Retry later with the same key.", m.config.RetryAfter)
	default:
		writeProblem(w, http.StatusInternalServerError, "internal", "The request could not be processed", "Retry later with the same key.", 0)
	}
}
