package dispatcher

import (
	"context"
	"sync"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/observe"
)

// pendingOutcome is an outcome on its way to be recorded; recorded is
// closed once the attempt to record it ended. metadata is the call's, for
// the observer.
type pendingOutcome struct {
	outcome  attempt.Outcome
	metadata []byte
	recorded chan struct{}
}

// record persists outcomes as they arrive, several in one statement when
// several finished together. A large outcome ([attempt.Outcome.Large]) is
// recorded alone, beside the batches, so that its bytes hold up no other
// outcome; record returns once every outcome was recorded.
func (d *Dispatcher[TTx]) record(outcomes <-chan pendingOutcome) {
	const maxBatch = 256
	var alone sync.WaitGroup
	defer alone.Wait()
	pending := make([]pendingOutcome, 0, maxBatch)
	for first := range outcomes {
		pending = append(pending[:0], first)
	drain:
		for len(pending) < maxBatch {
			select {
			case next, ok := <-outcomes:
				if !ok {
					break drain
				}
				pending = append(pending, next)
			default:
				break drain
			}
		}
		small := pending[:0:0]
		for _, p := range pending {
			if p.outcome.Large() {
				alone.Go(func() { d.recordBatch([]pendingOutcome{p}) })
			} else {
				small = append(small, p)
			}
		}
		if len(small) > 0 {
			d.recordBatch(small)
		}
	}
}

// recordBatch records the outcomes of pending in one call of
// [attempt.Runner.Record].
func (d *Dispatcher[TTx]) recordBatch(pending []pendingOutcome) {
	batch := make([]attempt.Outcome, 0, len(pending))
	for _, p := range pending {
		batch = append(batch, p.outcome)
	}
	// Record tries again after transient failures, past the leases if need
	// be (each outcome is fenced by its attempt), and logs what an operator
	// must act on (review, failure, an outcome fenced out) to the
	// dispatcher's logger; retries are logged here, at debug.
	began := time.Now()
	written, err := d.attempts.Record(attempt.WithLogger(context.Background(), d.logger), batch)
	if err != nil {
		d.logger.Error("pgonce: recording outcomes failed; their rows stay in flight for the reconciler",
			"error", err, "outcomes", len(batch))
	}
	if obs := d.attempts.Observer(); obs != nil {
		observeRecord(obs, began, pending, written, err)
	}
	for _, p := range pending {
		close(p.recorded)
		if o := p.outcome; o.Kind == attempt.Retry {
			d.logger.Debug("pgonce: attempt failed, will retry",
				"key", o.Key, "tool", o.Tool, "attempt", o.Attempt, "error", o.Err, "delay", o.RetryDelay)
		}
	}
}

// observeRecord tells obs of a record batch of pending sent at began.
func observeRecord(obs observe.Observer, began time.Time, pending []pendingOutcome, written map[string]bool, err error) {
	rec := &observe.Record{Began: began, Ended: time.Now(), Err: err, Keys: make([]observe.Key, len(pending))}
	for i, p := range pending {
		o := p.outcome
		rec.Keys[i] = observe.Key{Key: o.Key, Tool: o.Tool, Attempt: o.Attempt, Metadata: p.metadata, Kind: o.Kind.String(), Waited: -1}
		if written[o.Key] {
			rec.Written++
		}
	}
	obs.Recorded(context.Background(), rec)
}
