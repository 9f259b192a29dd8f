package faults_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/outbox"
)

// childHoldEnv, when set, makes a dispatcher child hold the answers of its
// first provider calls (as many as the number this variable gives) after
// they acted, until the test closes the child's file descriptor 3, and
// report on standard output, one JSON [holdEvent] a line, each call it held,
// each held call's answer, and every statement that then records an
// outcome of a held call.
const childHoldEnv = "PGONCE_FAULTS_CHILD_HOLD"

// holdEvent is a line a holding child writes on its standard output.
type holdEvent struct {
	// Event is "held" (a call acted and waits for the release),
	// "answered" (its provider answered after the release) or "record" (a
	// statement recording outcomes of held calls ended).
	Event string `json:"event"`
	// Key (hex of the key, as stored) and Attempt of a held or answered
	// call.
	Key     string `json:"key,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Statement, Keys and Attempts of a record event: the statement's
	// name, and the outcomes of held calls it carried.
	Statement string   `json:"statement,omitempty"`
	Keys      []string `json:"keys,omitempty"`
	Attempts  []int    `json:"attempts,omitempty"`
	// Others counts the statement's outcomes of calls that were not held.
	Others int `json:"others,omitempty"`
	// Rows is how many outcomes the statement wrote; Error its error.
	Rows  int64  `json:"rows"`
	Error string `json:"error,omitempty"`
}

// holder holds a child's first calls until its release closes.
type holder struct {
	max     int
	release chan struct{}

	mu     sync.Mutex
	held   map[string]int // hex key → attempt of the held call
	stdout *json.Encoder
}

// newHolder returns a holder of maxHeld calls, released when fd 3 reaches
// end of file.
func newHolder(maxHeld int) *holder {
	h := &holder{max: maxHeld, release: make(chan struct{}), held: map[string]int{}, stdout: json.NewEncoder(os.Stdout)}
	gate := os.NewFile(3, "release")
	go func() {
		_, _ = io.Copy(io.Discard, gate)
		close(h.release)
	}()
	return h
}

func (h *holder) emit(e holdEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.stdout.Encode(e)
}

// hold is the ledger's HoldFunc: the first max calls wait for the release,
// whatever their context says, as a provider whose answer is delayed on
// the way does.
func (h *holder) hold(_ context.Context, req outbox.Request) {
	key := strings.TrimPrefix(string(req.Key), "k1_")
	h.mu.Lock()
	take := len(h.held) < h.max
	select {
	case <-h.release:
		take = false
	default:
	}
	if take {
		h.held[key] = req.Attempt
	}
	h.mu.Unlock()
	if !take {
		return
	}
	h.emit(holdEvent{Event: "held", Key: key, Attempt: req.Attempt})
	<-h.release
	h.emit(holdEvent{Event: "answered", Key: key, Attempt: req.Attempt})
}

type traceKey struct{}

// TraceQueryStart notes the held calls' outcomes a recording statement
// carries.
func (h *holder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	var name string
	switch {
	case strings.HasPrefix(data.SQL, "-- name: OutboxFinish "):
		name = "OutboxFinish"
	case strings.HasPrefix(data.SQL, "-- name: OutboxRelease "):
		name = "OutboxRelease"
	default:
		return ctx
	}
	// Both statements take the batch's keys, scopes and attempts first.
	if len(data.Args) < 3 {
		return ctx
	}
	keys, _ := data.Args[0].([][]byte)
	attempts, _ := data.Args[2].([]int32)
	e := holdEvent{Event: "record", Statement: name}
	h.mu.Lock()
	for i, k := range keys {
		key := hex.EncodeToString(k)
		if _, ok := h.held[key]; ok && i < len(attempts) {
			e.Keys = append(e.Keys, key)
			e.Attempts = append(e.Attempts, int(attempts[i]))
		} else {
			e.Others++
		}
	}
	h.mu.Unlock()
	if len(e.Keys) == 0 {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, &e)
}

// TraceQueryEnd reports how a statement noted by TraceQueryStart ended.
func (h *holder) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	e, ok := ctx.Value(traceKey{}).(*holdEvent)
	if !ok {
		return
	}
	e.Rows = data.CommandTag.RowsAffected()
	if data.Err != nil {
		e.Error = data.Err.Error()
	}
	h.emit(*e)
}

// newTracedPool is [faults.NewPool] with h tracing its statements.
func newTracedPool(ctx context.Context, url, applicationName string, h *holder) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.ConnConfig.RuntimeParams["application_name"] = applicationName
	config.ConnConfig.ConnectTimeout = 5 * time.Second
	config.ConnConfig.Tracer = h
	return pgxpool.NewWithConfig(ctx, config)
}

// syncBuffer is a buffer a child writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// holdEvents decodes the complete lines of a holding child's output.
func holdEvents(out string) []holdEvent {
	var events []holdEvent
	for _, line := range strings.Split(out, "\n") {
		var e holdEvent
		if json.Unmarshal([]byte(line), &e) == nil && e.Event != "" {
			events = append(events, e)
		}
	}
	return events
}
