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
