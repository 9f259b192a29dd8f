// Package observe carries the observation hooks of the work a client's
// dispatchers, reconcilers and operators do (claim and record batches,
// reconcile and prune runs, resolve, cancel and retry) from the packages
// that do it to package telemetry, which implements [Observer]; none of it
// is part of the API. A client observes through the first of its middleware
// that [Of] turns into an Observer.
package observe

import (
	"context"
	"reflect"
	"time"
)

// Observer is told of a client's batch, maintenance and operator work. Its
// methods may be called concurrently; they must not keep the slices they
// are given.
type Observer interface {
	// Claimed is told of a claim batch once it returned.
	Claimed(ctx context.Context, claim *Claim)
	// Recorded is told of a record batch once it returned.
	Recorded(ctx context.Context, rec *Record)
	// StartReconcile is told a reconcile run starts, and returns the
	// context the run works under and the function its end is told to.
	StartReconcile(ctx context.Context) (context.Context, func(*Reconciled))
	// StartPrune is told a prune starts, and returns the context the prune
	// works under and the function its end is told to.
	StartPrune(ctx context.Context, dryRun bool) (context.Context, func(keys, tombstones int64, err error))
	// Operated is told of an operator's resolve, cancel or retry once it
	// returned.
	Operated(ctx context.Context, op *Operation)
	// Gauged is told, by the dispatcher elected to run maintenance while it
	// leads, the state of its schema's keys; nil once it no longer leads.
	Gauged(ctx context.Context, schema string, gauges *Gauges)
}

// Gauges is the state of a schema's keys, per tool, as [Observer.Gauged]
// is told it.
type Gauges struct {
	// Until is when the reading goes stale: a leader that stops without
	// saying so (a crash) is not reported for ever.
	Until time.Time
	// Tools holds the reading of each tool with keys.
	Tools []ToolGauges
}

// ToolGauges is the state of one tool's keys.
type ToolGauges struct {
	Tool        string
	Pending     int64
	InFlight    int64
	NeedsReview int64
	// OldestPending is how long the tool's oldest due pending key has
	// waited; zero when none waits.
	OldestPending time.Duration
	// Paused reports that an operator paused the tool.
	Paused bool
}

// Claim is one claim batch.
type Claim struct {
	// Began is when the claim was sent, and Ended when it returned.
	Began, Ended time.Time
	// Limit is the most keys the claim could take.
	Limit int
	// Keys are the keys it claimed.
	Keys []Key
	// Held are the tools whose flow control held keys back from the claim.
	Held []Held
	// Err is the claim's error.
	Err error
}

// Held is a tool whose due keys a claim left waiting for its flow control.
type Held struct {
	Tool string
	// Reason is "paused", "slowed_down" or "limited" (its limit on calls
	// in flight or its rate).
	Reason string
}

// Key is one key of a batch.
type Key struct {
	Key     string
	Tool    string
	Attempt int
	// Metadata is the call's stored metadata (a JSON object of strings),
	// nil when it has none.
	Metadata []byte
	// Waited is how long the key was due before the claim took it, by the
	// database's clock; negative when unknown.
	Waited time.Duration
	// Kind is the outcome recorded for the key in a [Record]: succeeded,
	// failed, needs_review or retry.
	Kind string
}

// Record is one record batch: outcomes of attempts written in one go.
type Record struct {
	// Began is when the batch was sent, and Ended when it returned.
	Began, Ended time.Time
	// Keys are the outcomes recorded, with their kinds.
	Keys []Key
	// Written counts the outcomes written; the others had been recorded
	// by someone else first.
	Written int
	// Err is the batch's error.
	Err error
}

// Reconciled is what a reconcile run did.
type Reconciled struct {
	// Examined counts the expired rows the run took.
	Examined int
	// Resolutions count what it did with them, by tool and kind.
	Resolutions []Resolution
	// Err is the run's error.
	Err error
}

// Resolution counts the rows of one tool a reconcile run resolved one way.
type Resolution struct {
	Tool  string
	Kind  string
	Count int
}

// Operation is an operator's resolve, cancel or retry of a key.
type Operation struct {
	// Began is when it started, and Ended when it returned.
	Began, Ended time.Time
	// Name is "resolve", "cancel" or "retry".
	Name string
	// Key is the key operated on.
	Key string
	// Action is a resolve's action (succeeded, failed, retry); empty for
	// the others.
	Action string
	// State is the key's state after the operation, when it was read.
	State string
	// Err is the operation's error.
	Err error
}

// Source carries an Observer. Package telemetry embeds one in its
// Telemetry, set when it is made, under an unexported alias so that it stays
// out of its documentation; [Of] finds it through its unexported method,
// which only such an embedding can provide.
type Source struct{ observer Observer }

// NewSource returns a source of observer.
func NewSource(observer Observer) Source { return Source{observer: observer} }

func (s Source) pgonceObserver() Observer { return s.observer }

// Of returns the first of middleware that observes, as its Observer, or
// nil when none does. A nil pointer among middleware observes nothing.
func Of[M any](middleware []M) Observer {
	for _, m := range middleware {
		source, ok := any(m).(interface{ pgonceObserver() Observer })
		if !ok {
			continue
		}
		if v := reflect.ValueOf(source); v.Kind() == reflect.Pointer && v.IsNil() {
			continue
		}
		if o := source.pgonceObserver(); o != nil {
			return o
		}
	}
	return nil
}
