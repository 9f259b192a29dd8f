package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgonce/pgonce/internal/store"
)

// Polling bounds of [Client.Wait]: it re-reads the key at least this often
// when no notification arrives, backing off from waitPollMin to waitPollMax.
const (
	waitPollMin = 50 * time.Millisecond
	waitPollMax = 2 * time.Second
	// waitPollMaxUnheard caps the backoff of a wait that no notification
	// can wake: its client's waits do not listen (a pool too small, or
	// [Config.NotifyDisabled]), so its reads are all it has. Backing off to
	// waitPollMax, a wait over a pool of two saw results up to 2s late,
	// after its caller had given up.
	waitPollMaxUnheard = 250 * time.Millisecond
)

// Wait returns key's result as soon as the key leaves pending and in flight:
// succeeded, failed, needs review or expired. Completing transactions notify
// their keys; all the waits of one client share one listening connection,
// held while any wait is running. Wait also re-reads the key with a backoff
// up to 2s, in case a notification is missed or the connection drops.
//
// The listening connection is taken from the client's pool only when the
// pool keeps another one for the reads: over a pool of one connection
// (pgxpool MaxConns 1, database/sql SetMaxOpenConns(1)), or of two while the
// client's dispatcher listens, waits do not listen and see a result by
// re-reading alone, backing off to 250ms instead of 2s, so at most 250ms
// after it is recorded; so does every wait under [Config.NotifyDisabled].
//
// Each read runs under [Config.StatementTimeout]. A read that fails
// transiently (a lost connection, a half-open one that reached that
// deadline, a restarting server, too many connections; see docs/concepts.md,
// "Waiting for a result") is retried with
// the same backoff: Wait keeps waiting through it. A definitive answer
// returns at once: [ErrNotFound] for a key the database does not hold (its
// submit has not committed yet, rolled back, or was lost by a failover to
// an asynchronous standby; the error names all three), [ErrExpired] for
// a pruned one, [ErrInvalidKey] for a malformed key, and any other error that
// retrying cannot cure, such as a schema that is not migrated.
//
// When ctx is done first, Wait returns the last state it saw (the zero
// Result if it never read one) and an error wrapping ctx's error, which also
// names the last transient error, if any. When that state is pending or in
// flight, the error also matches [ErrInProgress] (an [*InProgressError] with
// the retry-after hint), as [Client.Do]'s does for a key another attempt
// holds.
//
// Wait knows the key alone, so its Result has Created false, and a
// finished key reads as a replay ([Result.Replayed]): right for a request
// that found the key already there, wrong for the one that created it. A
// caller that submitted the key passes its submit's Result to
// [Client.WaitResult] instead.
func (c *Client[TTx]) Wait(ctx context.Context, key Key) (Result, error) {
	// Each read has a deadline of its own: one stuck on a connection whose
	// server vanished without a word would stall the wait for good.
	read := func() (Result, error) {
		readCtx, cancel := c.statementContext(ctx)
		defer cancel()
		return c.Get(readCtx, key)
	}
	res, err := read()
	var lastErr error // the transient error of the last read, if it failed
	switch {
	case err == nil && !res.State.InProgress():
		return res, nil
	case err != nil && ctx.Err() != nil:
		return res, ctx.Err()
	case err != nil && !store.IsTransient(err):
		return res, waitNotFound(err)
	case err != nil:
		lastErr = err
	}

	woken := make(chan struct{}, 1)
	pollMax := waitPollMaxUnheard
	if !c.config.NotifyDisabled {
		unsubscribe, listening := c.waiters.subscribe(c.store, c.config, key, woken)
		defer unsubscribe()
		if listening {
			pollMax = waitPollMax
		}
	}

	poll := waitPollMin
	c.waitPolled(key, poll)
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return res, waitDone(ctx, res, key, lastErr)
		case <-woken:
		case <-timer.C:
			poll = min(2*poll, pollMax)
		}
		next, err := read()
		switch {
		case err == nil:
			res, lastErr = next, nil
			if !res.State.InProgress() {
				return res, nil
			}
		case ctx.Err() != nil:
			// The read failed because ctx is done, not the other way round.
			return res, waitDone(ctx, res, key, lastErr)
		case !store.IsTransient(err):
			return next, waitNotFound(err)
		default:
			lastErr = err
			c.config.Logger.DebugContext(ctx, "pgonce: wait could not read its key; retrying",
				"key", key, "error", err, "retry_in", poll)
		}
		c.waitPolled(key, poll)
		timer.Reset(poll)
	}
}

// waitPolled tells c.waitPolledFunc, if set, that a wait re-reads
// key in next.
func (c *Client[TTx]) waitPolled(key Key, next time.Duration) {
	if c.waitPolledFunc != nil {
		c.waitPolledFunc(key, next)
	}
}

// waitNotFound adds to err, when it is [ErrNotFound], the ways a key that
// its caller submitted can be missing: its transaction has not committed
// yet, it rolled back, or it committed on a primary that then failed over
// to a standby that never received the commit. The caller knows which of
// the first two it did; the third is the one it cannot see.
func waitNotFound(err error) error {
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w: the database holds no committed submit of it: the transaction that submitted it "+
		"has not committed yet (wait after the commit, not inside the transaction), or it rolled back, "+
		"or it committed on a primary that failed over to a standby that never received the commit "+
		"(asynchronous replication; see docs/high-availability.md, \"After a failover\")", err)
}

// waitDone is the error of a [Client.Wait] whose ctx is done: ctx's error,
// and the last transient error the wait met, if any; with an
// [*InProgressError] when res, the last state seen, is in progress.
func waitDone(ctx context.Context, res Result, key Key, lastErr error) error {
	err := ctx.Err()
	if lastErr != nil && !errors.Is(lastErr, ctx.Err()) {
		err = fmt.Errorf("wait for key %s: %w (last read failed: %v)", key, ctx.Err(), lastErr) //nolint:errorlint // lastErr is named, not wrapped: it is a driver's
	}
	if res.State.InProgress() {
		return fmt.Errorf("%w: %w", &InProgressError{Key: res.Key, RetryAfter: res.RetryAfter}, err)
	}
	return err
}

// WaitResult is [Client.Wait] for the key of res, the Result of a
// [Client.SubmitTx], [Client.Submit] or [Client.Do] (in this process or,
// passed along, in another one), and keeps what res knows and a key does
// not: whether that request created the key. So the submitter that waits
// for its own key gets its outcome with Created true, and its observation
// without replayed; a duplicate, whose submit found the key already there,
// gets replayed. Call it after the transaction of SubmitTx commits: before
// that, no other connection sees the key, and WaitResult returns
// [ErrNotFound].
//
// The key's creation time identifies the claim: when the row found has
// another one than res.CreatedAt (res's transaction rolled back and another
// request created the key since), Created is false. (Under a
// [Config.NowFunc] that stands still, two claims can share a creation
// time.) The errors are Wait's;
// a res without a key returns [ErrInvalidKey].
func (c *Client[TTx]) WaitResult(ctx context.Context, res Result) (Result, error) {
	got, err := c.Wait(ctx, res.Key)
	// Only a key read can be the one res created.
	got.Created = res.Created && got.State != "" && got.Key == res.Key && got.CreatedAt.Equal(res.CreatedAt)
	return got, err
}

// waiters fans the notifications of one listening connection out to the
// waits of a client. The listener runs while at least one wait does.
type waiters struct {
	mu     sync.Mutex
	byKey  map[Key]map[chan struct{}]struct{}
	count  int
	cancel context.CancelFunc
	done   chan struct{}
}

// subscribe registers woken for key, starting the listener if it is the
// first wait. woken receives a value when key may have changed, and after
// every (re)connection of the listener. The returned function unregisters,
// and stops the listener after the last wait; listening reports whether a
// listener runs, which a pool too small to spare a connection for it
// prevents.
func (w *waiters) subscribe(s *store.Store, config Config, key Key, woken chan struct{}) (unsubscribe func(), listening bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey == nil {
		w.byKey = make(map[Key]map[chan struct{}]struct{})
	}
	if w.byKey[key] == nil {
		w.byKey[key] = make(map[chan struct{}]struct{})
	}
	w.byKey[key][woken] = struct{}{}
	w.count++
	if w.count == 1 {
		w.start(s, config)
	}
	listening = w.cancel != nil
	return func() {
		w.mu.Lock()
		delete(w.byKey[key], woken)
		if len(w.byKey[key]) == 0 {
			delete(w.byKey, key)
		}
		w.count--
		var cancel context.CancelFunc
		var done chan struct{}
		if w.count == 0 {
			cancel, done = w.cancel, w.done
			w.cancel, w.done = nil, nil
		}
		w.mu.Unlock()
		if cancel != nil {
			cancel()
			<-done
		}
	}, listening
}

// start starts the listener, unless the pool is too small to listen and
// read at once (see [store.Store.ReserveListener]): the listener holds a
// connection while it runs, and with a pool of one the waits could not read
// their keys. The waits then poll. w.mu is held.
func (w *waiters) start(s *store.Store, config Config) {
	release, maxConns, ok := s.ReserveListener()
	if !ok && s.ListenDisabled() {
		config.Logger.Debug("pgonce: behind a transaction pooler without ListenConnectFunc; waits poll")
		return
	}
	if !ok {
		config.Logger.Debug("pgonce: the connection pool is too small to listen and read at once; waits poll",
			"max_conns", maxConns)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w.cancel, w.done = cancel, done
	go func() {
		defer close(done)
		defer release()
		w.listen(ctx, s, config)
	}()
}

func (w *waiters) listen(ctx context.Context, s *store.Store, config Config) {
	s.ListenLoop(ctx, []string{s.DoneChannel}, config.StatementTimeout,
		w.wakeAll, // re-check whatever finished while not listening
		func(n *pgconn.Notification) { w.wake(n.Payload) },
		func(err error, retryIn time.Duration) {
			config.Logger.DebugContext(ctx, "pgonce: wait listener lost its connection; polling until it reconnects",
				"error", err, "retry_in", retryIn)
		})
}

// wake wakes the waits of the keys in payload, a comma-separated list.
func (w *waiters) wake(payload string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for key := range strings.SplitSeq(payload, ",") {
		for woken := range w.byKey[Key(key)] {
			signal(woken)
		}
	}
}

func (w *waiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, chans := range w.byKey {
		for woken := range chans {
			signal(woken)
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
