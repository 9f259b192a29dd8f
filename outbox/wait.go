package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Polling bounds of [Client.Wait]: it re-reads the key at least this often
// when no notification arrives, backing off from waitPollMin to waitPollMax.
const (
	waitPollMin = 50 * time.Millisecond
	waitPollMax = 2 * time.Second
)

// Wait returns key's result as soon as the key leaves pending and in flight:
// succeeded, failed, needs review or expired. It listens for the completing
// transaction's notification on a connection of its own, and re-reads the key
// with a backoff up to 2s in case a notification is missed or the listening
// connection drops.
//
// When ctx is done first, Wait returns the last state it saw and ctx's error.
// It returns [ErrNotFound] for a key never submitted.
func (c *Client[TTx]) Wait(ctx context.Context, key Key) (Result, error) {
	res, err := c.Get(ctx, key)
	if err != nil || !res.State.InProgress() {
		return res, err
	}

	woken := make(chan struct{}, 1)
	wake := func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	}
	listenCtx, stopListening := context.WithCancel(ctx)
	listenDone := make(chan error, 1)
	if !c.config.NotifyDisabled {
		go func() {
			listenDone <- c.store.Listen(listenCtx, []string{c.store.DoneChannel}, wake,
				func(n *pgconn.Notification) {
					if n.Payload == string(key) {
						wake()
					}
				})
		}()
	} else {
		listenDone <- nil
	}
	defer func() {
		stopListening()
		// The listener ends with ctx's error, or earlier when its connection
		// failed; polling covered for it either way.
		if err := <-listenDone; err != nil && !errors.Is(err, context.Canceled) {
			c.config.Logger.DebugContext(ctx, "pgonce: wait listener ended", "error", err)
		}
	}()

	poll := waitPollMin
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-woken:
		case <-timer.C:
			poll = min(2*poll, waitPollMax)
		}
		next, err := c.Get(ctx, key)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return next, err
		}
		res = next
		if !res.State.InProgress() {
			return res, nil
		}
		timer.Reset(poll)
	}
}
