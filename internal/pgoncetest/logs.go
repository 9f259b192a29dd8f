package pgoncetest

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogRecord is one record a [Logs] captured, its attributes as text.
type LogRecord struct {
	Level   slog.Level
	Message string
	Attrs   map[string]string
}

// Logs captures what a logger of [CaptureLogs] logs, at every level, for
// tests that assert what an operator would read. It is safe for concurrent
// use.
type Logs struct {
	mu      sync.Mutex
	records []LogRecord
	// changed is closed, and replaced, whenever a record arrives.
	changed chan struct{}
}

// CaptureLogs returns a logger that logs at every level into the returned
// [Logs].
func CaptureLogs() (*slog.Logger, *Logs) {
	logs := &Logs{changed: make(chan struct{})}
	return slog.New(&logsHandler{logs: logs}), logs
}

// Records returns the records captured so far, oldest first.
func (l *Logs) Records() []LogRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.records)
}

// Matching returns the records captured so far that match.
func (l *Logs) Matching(match func(LogRecord) bool) []LogRecord {
	var out []LogRecord
	for _, record := range l.Records() {
		if match(record) {
			out = append(out, record)
		}
	}
	return out
}

// Await waits up to a minute for a record that matches, returns the first,
// and fails the test if none arrives.
func (l *Logs) Await(tb testing.TB, match func(LogRecord) bool) LogRecord {
	tb.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		changed := l.changed
		for _, record := range l.records {
			if match(record) {
				l.mu.Unlock()
				return record
			}
		}
		l.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("no matching log record arrived; captured: %v", l.Records())
			return LogRecord{}
		}
	}
}

func (l *Logs) add(record LogRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, record)
	close(l.changed)
	l.changed = make(chan struct{})
}

// logsHandler is the slog.Handler of [CaptureLogs]; groups are flattened
// into dotted attribute names.
type logsHandler struct {
	logs   *Logs
	attrs  []slog.Attr
	prefix string
}

func (*logsHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logsHandler) Handle(_ context.Context, r slog.Record) error {
	record := LogRecord{Level: r.Level, Message: r.Message, Attrs: map[string]string{}}
	for _, attr := range h.attrs {
		record.Attrs[attr.Key] = attr.Value.Resolve().String()
	}
	r.Attrs(func(attr slog.Attr) bool {
		record.Attrs[h.prefix+attr.Key] = attr.Value.Resolve().String()
		return true
	})
	h.logs.add(record)
	return nil
}

func (h *logsHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.attrs = slices.Clone(h.attrs)
	for _, attr := range attrs {
		next.attrs = append(next.attrs, slog.Attr{Key: h.prefix + attr.Key, Value: attr.Value})
	}
	return &next
}

func (h *logsHandler) WithGroup(name string) slog.Handler {
	next := *h
	next.prefix = h.prefix + name + "."
	return &next
}

// Logger returns a logger that writes records at info and above to tb.Log,
// so that a test's logs show only when it fails (or under -v), beside its
// failure. Records that arrive once tb's cleanups ran (a goroutine that
// outlived its test) are dropped, as tb.Log would panic.
func Logger(tb testing.TB) *slog.Logger {
	w := &testLogWriter{tb: tb}
	tb.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// testLogWriter writes each record of [Logger] to its test's log.
type testLogWriter struct {
	tb   testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
