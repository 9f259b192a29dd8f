package main

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// spanRecorder is a tracer provider over the OpenTelemetry API alone that
// keeps every span it makes, once ended, in memory: what `demo --trace`
// prints. The SDK stays out of pgonce's module.
type spanRecorder struct {
	embedded.TracerProvider

	mu    sync.Mutex
	ended []*recordedSpan
}

var _ trace.TracerProvider = (*spanRecorder)(nil)

// Tracer returns the recorder's tracer; name and options are ignored.
func (r *spanRecorder) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return recordingTracer{recorder: r}
}

// spans returns the ended spans.
func (r *spanRecorder) spans() []*recordedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ended)
}

type recordingTracer struct {
	embedded.Tracer

	recorder *spanRecorder
}

// Start starts a span, a child of the span in ctx when there is one.
func (t recordingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	config := trace.NewSpanStartConfig(opts...)
	parent := trace.SpanContextFromContext(ctx)
	if config.NewRoot() {
		parent = trace.SpanContext{}
	}
	sc := trace.SpanContextConfig{TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		sc.TraceID = parent.TraceID()
	} else {
		_, _ = crand.Read(sc.TraceID[:])
	}
	_, _ = crand.Read(sc.SpanID[:])
	span := &recordedSpan{
		recorder: t.recorder,
		context:  trace.NewSpanContext(sc),
		parent:   parent,
		name:     name,
		kind:     config.SpanKind(),
		start:    cmp.Or(config.Timestamp(), time.Now()),
		links:    config.Links(),
	}
	span.attrs = append(span.attrs, config.Attributes()...)
	return trace.ContextWithSpan(ctx, span), span
}

// recordedSpan is a span of a [spanRecorder].
type recordedSpan struct {
	embedded.Span

	recorder *spanRecorder
	context  trace.SpanContext
	parent   trace.SpanContext

	mu     sync.Mutex
	name   string
	kind   trace.SpanKind
	start  time.Time
	end    time.Time
	attrs  []attribute.KeyValue
	links  []trace.Link
	status codes.Code
	ended  bool
}

var _ trace.Span = (*recordedSpan)(nil)

// End records the span, once.
func (s *recordedSpan) End(opts ...trace.SpanEndOption) {
	config := trace.NewSpanEndConfig(opts...)
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	s.end = cmp.Or(config.Timestamp(), time.Now())
	s.mu.Unlock()
	s.recorder.mu.Lock()
	defer s.recorder.mu.Unlock()
	s.recorder.ended = append(s.recorder.ended, s)
}

// AddEvent does nothing: the tree shows no events.
func (*recordedSpan) AddEvent(string, ...trace.EventOption) {}

// AddLink adds a link.
func (s *recordedSpan) AddLink(link trace.Link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.links = append(s.links, link)
}

// IsRecording reports whether the span has not ended yet.
func (s *recordedSpan) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

// RecordError does nothing beyond the status the caller sets.
func (*recordedSpan) RecordError(error, ...trace.EventOption) {}

// SpanContext returns the span's context.
func (s *recordedSpan) SpanContext() trace.SpanContext { return s.context }

// SetStatus sets the span's status code.
func (s *recordedSpan) SetStatus(code codes.Code, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = code
}

// SetName renames the span.
func (s *recordedSpan) SetName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.name = name
}

// SetAttributes adds attributes; a later value of a key wins.
func (s *recordedSpan) SetAttributes(kv ...attribute.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attrs = append(s.attrs, kv...)
}

// TracerProvider returns the recorder.
func (s *recordedSpan) TracerProvider() trace.TracerProvider { return s.recorder }

// attr returns the last value of key, and whether it was set.
func (s *recordedSpan) attr(key attribute.Key) (attribute.Value, bool) {
	for i := len(s.attrs) - 1; i >= 0; i-- {
		if s.attrs[i].Key == key {
			return s.attrs[i].Value, true
		}
	}
	return attribute.Value{}, false
}

// treeAttributes are the attributes the tree prints, in this order, and
// their labels.
var treeAttributes = []struct {
	key   attribute.Key
	label string
}{
	{"pgonce.attempt", "attempt"},
	{"pgonce.outcome", "outcome"},
	{"messaging.batch.message_count", "keys"},
	{"pgonce.examined", "examined"},
}

// printTrace writes the tree of the trace of root, children under their
// parents in the order they started. A span of another trace that links to
// a span of this one (a dispatcher's claim or record batch) is printed
// under the span it links to, marked as a link.
func printTrace(w io.Writer, spans []*recordedSpan, root *recordedSpan) {
	children := map[trace.SpanID][]*recordedSpan{}
	inTrace := map[trace.SpanID]bool{}
	for _, span := range spans {
		if span.context.TraceID() == root.context.TraceID() {
			inTrace[span.context.SpanID()] = true
		}
	}
	for _, span := range spans {
		switch {
		case span == root:
		case inTrace[span.context.SpanID()]:
			children[span.parent.SpanID()] = append(children[span.parent.SpanID()], span)
		default:
			for _, link := range span.links {
				if inTrace[link.SpanContext.SpanID()] {
					children[link.SpanContext.SpanID()] = append(children[link.SpanContext.SpanID()], span)
					break
				}
			}
		}
	}
	var walk func(span *recordedSpan, prefix string, last bool, depth int)
	walk = func(span *recordedSpan, prefix string, last bool, depth int) {
		branch, indent := "", ""
		if depth > 0 {
			branch, indent = "├─ ", "│  "
			if last {
				branch, indent = "└─ ", "   "
			}
		}
		label := span.name
		if span.context.TraceID() != root.context.TraceID() {
			label += " (linked)"
		}
		var details []string
		for _, attr := range treeAttributes {
			if v, ok := span.attr(attr.key); ok {
				details = append(details, attr.label+"="+v.String())
			}
		}
		if span.status == codes.Error {
			details = append(details, "error")
		}
		line := prefix + branch + label
		if len(details) > 0 {
			line += "  " + strings.Join(details, " ")
		}
		fmt.Fprintln(w, line)
		kids := children[span.context.SpanID()]
		slices.SortStableFunc(kids, func(a, b *recordedSpan) int { return a.start.Compare(b.start) })
		for i, kid := range kids {
			walk(kid, prefix+indent, i == len(kids)-1, depth+1)
		}
	}
	walk(root, "", true, 0)
}
