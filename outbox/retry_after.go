package outbox

import (
	"fmt"
	"time"
)

// RetryAfterError is a retryable provider failure that says how long to wait
// before the next attempt, such as an HTTP 429 or 503 with a Retry-After
// header. The dispatcher waits at least Delay, or its own backoff when that
// is longer. A RetryAfterError wrapping an [AmbiguousError] stays ambiguous.
type RetryAfterError struct {
	// Err is the failure's cause.
	Err error
	// Delay is the shortest wait before the next attempt.
	Delay time.Duration
}

// RetryAfter wraps err as a failure to retry no sooner than delay from now.
// It returns nil for a nil err, and err itself for a delay that is not
// positive. A [Permanent] err stays permanent: nothing is retried.
func RetryAfter(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	if delay <= 0 {
		return err
	}
	return &RetryAfterError{Err: err, Delay: delay}
}

// Error returns the wrapped error's text and the delay.
func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.Delay)
}

// Unwrap returns the wrapped error.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryDelay returns Delay. The attempt machinery finds it by this method,
// without importing this package.
func (e *RetryAfterError) RetryDelay() time.Duration { return e.Delay }

// SlowDownError is a provider's "slow down" (an HTTP 429, or a 503 with
// Retry-After): not a failure of the key, but of the tool's pace. The
// dispatcher that gets one pauses the whole tool, for every dispatcher of
// the schema, until Delay from now (the tool's not-before time, see
// [Client.Tools]), and puts the key back to pending without spending its
// attempt: nothing fails for being throttled. A SlowDownError wrapping an
// [AmbiguousError] stays ambiguous (the key's next attempt settles it by
// the tool's delivery); one wrapping a [Permanent] error stays permanent.
// Outside a dispatcher ([Client.Do], the reconciler) it is a
// [RetryAfterError]: the key waits at least Delay, and the attempt counts.
type SlowDownError struct {
	// Err is the provider's answer.
	Err error
	// Delay is how long the provider asked the tool to wait.
	Delay time.Duration
}

// SlowDown wraps err as a provider's "slow down": no call of the tool, from
// any dispatcher, for delay (see [SlowDownError]). It returns nil for a nil
// err, and err itself for a delay that is not positive.
func SlowDown(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	if delay <= 0 {
		return err
	}
	return &SlowDownError{Err: err, Delay: delay}
}

// Error returns the wrapped error's text and the delay.
func (e *SlowDownError) Error() string {
	return fmt.Sprintf("%v (slow down for %s)", e.Err, e.Delay)
}

// Unwrap returns the wrapped error.
func (e *SlowDownError) Unwrap() error { return e.Err }

// RetryDelay returns Delay: the key is not tried again sooner.
func (e *SlowDownError) RetryDelay() time.Duration { return e.Delay }

// SlowDownDelay returns Delay. The attempt machinery finds it by this
// method, without importing this package.
func (e *SlowDownError) SlowDownDelay() time.Duration { return e.Delay }
