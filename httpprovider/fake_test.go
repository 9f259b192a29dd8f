package httpprovider_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Faults the fake provider plays on the first request of a key, named by
// the "fault" member of the request body.
const (
	faultNone     = ""         // act and answer 201
	faultDrop     = "drop"     // act, then drop the connection unanswered
	fault500      = "500"      // act, then answer 500 (a retry replays the 201)
	fault429      = "429"      // do not act; answer 429 with Retry-After: 1
	faultDeclined = "declined" // answer 402, stored and replayed like a success
	faultSlow     = "slow"     // act, then hold the answer until released
	// faultHold acts, then holds the answer until released, and holds every
	// later request with the key (answered 409 in the end) until released or
	// its caller goes away: the key has a call in flight at the API for as
	// long as any caller keeps asking.
	faultHold = "hold"
)

// fakeProvider behaves like a payment API that honours Idempotency-Key: it
// acts once per key, stores its answer and replays it, answers 409 while a
// request with the key is being processed and 422 to the key reused with
// another body.
type fakeProvider struct {
	mu       sync.Mutex
	byKey    map[string]*fakeEntry
	effects  map[string]int // actions taken, by key
	requests map[string][]time.Time
	release  chan struct{}              // closed to let faultSlow and faultHold answers go
	held     map[*http.Request]struct{} // faultHold requests being held

	server *httptest.Server
}

type fakeEntry struct {
	body    []byte // the request body first seen with the key
	running bool
	hold    bool // the key's first request had faultHold
	status  int  // the stored answer; 0 while none
	answer  []byte
	reqID   string
}

func newFakeProvider(t *testing.T) *fakeProvider {
	t.Helper()
	f := &fakeProvider{
		byKey:    map[string]*fakeEntry{},
		effects:  map[string]int{},
		requests: map[string][]time.Time{},
		release:  make(chan struct{}),
		held:     map[*http.Request]struct{}{},
	}
	f.server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.releaseSlow()
		f.server.CloseClientConnections()
		f.server.Close()
	})
	return f
}

func (f *fakeProvider) releaseSlow() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.release:
	default:
		close(f.release)
	}
}

func (f *fakeProvider) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if err != nil || key == "" {
		http.Error(w, `{"error":"missing key"}`, http.StatusBadRequest)
		return
	}
	var args struct {
		Fault string `json:"fault"`
	}
	_ = json.Unmarshal(body, &args)

	f.mu.Lock()
	f.requests[key] = append(f.requests[key], time.Now())
	first := len(f.requests[key]) == 1
	entry := f.byKey[key]
	switch {
	case entry != nil && !bytes.Equal(entry.body, body):
		f.mu.Unlock()
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"error":"key reused with another request"}`))
		return
	case entry != nil && entry.running:
		hold, release := entry.hold, f.release
		f.mu.Unlock()
		if hold {
			f.hold(r, release)
		}
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"error":"in progress"}`))
		return
	case entry != nil:
		status, answer, reqID := entry.status, entry.answer, entry.reqID
		f.mu.Unlock()
		w.Header().Set("Request-Id", reqID)
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(status)
		_, _ = w.Write(answer)
		return
	case first && args.Fault == fault429:
		f.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	entry = &fakeEntry{body: body, running: true, hold: args.Fault == faultHold, reqID: fmt.Sprintf("req_%d", len(f.byKey)+1)}
	f.byKey[key] = entry
	if args.Fault == faultDeclined {
		entry.status, entry.answer = http.StatusPaymentRequired, []byte(`{"error": {"code": "card_declined"}}`+"\n")
	} else {
		f.effects[key]++
		entry.status = http.StatusCreated
		entry.answer = []byte(fmt.Sprintf(`{"id": "re_%d",  "status": "succeeded"}`, len(f.byKey)))
	}
	release := f.release
	f.mu.Unlock()

	if first && args.Fault == faultSlow {
		<-release
	}
	if entry.hold {
		f.hold(r, release)
		<-release // the key stays running even when its caller went away
	}
	f.mu.Lock()
	entry.running = false
	status, answer, reqID := entry.status, entry.answer, entry.reqID
	f.mu.Unlock()

	switch {
	case first && args.Fault == faultDrop:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case first && args.Fault == fault500:
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"internal"}`))
		return
	}
	w.Header().Set("Request-Id", reqID)
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

// hold holds r until release is closed or r's caller goes away, counted
// by liveHeld meanwhile.
func (f *fakeProvider) hold(r *http.Request, release <-chan struct{}) {
	f.mu.Lock()
	f.held[r] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.held, r)
		f.mu.Unlock()
	}()
	select {
	case <-release:
	case <-r.Context().Done():
	}
}

// liveHeld returns how many faultHold keys have a request held whose
// caller is still connected.
func (f *fakeProvider) liveHeld() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := map[string]bool{}
	for r := range f.held {
		if r.Context().Err() == nil {
			keys[r.Header.Get("Idempotency-Key")] = true
		}
	}
	return len(keys)
}

// effectsOf returns how many times the fake acted for key.
func (f *fakeProvider) effectsOf(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.effects[key]
}

// answerOf returns the stored answer for key.
func (f *fakeProvider) answerOf(key string) (int, []byte, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	entry := f.byKey[key]
	if entry == nil {
		return 0, nil, ""
	}
	return entry.status, entry.answer, entry.reqID
}

// requestTimes returns when requests with key arrived.
func (f *fakeProvider) requestTimes(key string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.requests[key]...)
}

// totalEffects returns the number of actions taken over all keys.
func (f *fakeProvider) totalEffects() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, count := range f.effects {
		n += count
	}
	return n
}

// running returns how many keys have a request being processed.
func (f *fakeProvider) running() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, entry := range f.byKey {
		if entry.running {
			n++
		}
	}
	return n
}
