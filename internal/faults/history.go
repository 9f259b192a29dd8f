package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/outbox"
)

// Fate is what became of the transaction that submitted a call.
type Fate int

// Fates of a submitting transaction.
const (
	// FateCommitted: the transaction committed; the call must run.
	FateCommitted Fate = iota
	// FateRolledBack: the transaction rolled back (or never committed); the
	// call must not exist and must never act.
	FateRolledBack
	// FateUnknown: COMMIT was sent and no answer came back. Either the call
	// exists and obeys the rules of a committed one, or it acted never.
	FateUnknown
)

// Entry is one submitted call in a [History].
type Entry struct {
	// Call is what was submitted.
	Call outbox.Call
	// Key is the call's key.
	Key outbox.Key
	// Fate is what became of its transaction.
	Fate Fate
	// MayFail allows the call to end failed (a provider that failed it
	// permanently, or gave up).
	MayFail bool
	// Observed are the responses callers were given as the call's success
	// (by [outbox.Client.Do]), each of which must be the stored one.
	Observed [][]byte
}

// History records every call a campaign submitted and what became of its
// transaction. It is safe for concurrent use.
type History struct {
	mu      sync.Mutex
	entries map[outbox.Key]*Entry
	order   []outbox.Key
	pending []observation // observations of keys not yet added
}

type observation struct {
	key      outbox.Key
	response []byte
}

// NewHistory returns an empty history.
func NewHistory() *History {
	return &History{entries: make(map[outbox.Key]*Entry)}
}

// Add records that call, with key, was submitted and its transaction met
// fate. A key added again keeps its strongest fate: committed beats unknown
// beats rolled back.
func (h *History) Add(call outbox.Call, key outbox.Key, fate Fate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.entries[key]
	if !ok {
		e = &Entry{Call: call, Key: key, Fate: fate}
		h.entries[key] = e
		h.order = append(h.order, key)
		kept := h.pending[:0]
		for _, o := range h.pending {
			if o.key == key {
				e.Observed = append(e.Observed, o.response)
			} else {
				kept = append(kept, o)
			}
		}
		h.pending = kept
		return
	}
	if fate == FateCommitted || (fate == FateUnknown && e.Fate == FateRolledBack) {
		e.Fate = fate
	}
}

// AllowFailure marks key as one that may end failed.
func (h *History) AllowFailure(key outbox.Key) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.entries[key]; ok {
		e.MayFail = true
	}
}

// Observe records that a caller was told key succeeded with response.
func (h *History) Observe(key outbox.Key, response []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.entries[key]; ok {
		e.Observed = append(e.Observed, response)
		return
	}
	// Asked before its entry is added (DoOne adds it once all asks end).
	h.pending = append(h.pending, observation{key: key, response: response})
}

// Entries returns the recorded entries in the order they were first added.
func (h *History) Entries() []Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Entry, 0, len(h.order))
	for _, key := range h.order {
		out = append(out, *h.entries[key])
	}
	return out
}

// Committed counts the entries whose transaction committed.
func (h *History) Committed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.entries {
		if e.Fate == FateCommitted {
			n++
		}
	}
	return n
}

// Keys returns the keys of the entries whose transaction committed or may
// have.
func (h *History) Keys() []outbox.Key {
	var keys []outbox.Key
	for _, e := range h.Entries() {
		if e.Fate != FateRolledBack {
			keys = append(keys, e.Key)
		}
	}
	return keys
}

// CheckOpts tune [Check].
type CheckOpts struct {
	// Crashed says that workers died in the campaign, or were cut off from
	// the database for longer than their lease: an outcome such a worker
	// knew but could not store in time may then rightly end in review, and
	// is not counted as dropped.
	Crashed bool
}

// Report is what [Check] found. Every count but Calls, Committed,
// RolledBack, Unknown, Succeeded, Failed and Reviewed is a violation.
type Report struct {
	Calls      int
	Committed  int
	RolledBack int
	Unknown    int
	Succeeded  int
	Failed     int
	Reviewed   int

	// Duplicates counts effects beyond the first of any call.
	Duplicates int
	// Lost counts committed calls whose key is gone, and succeeded keys
	// whose effect is missing.
	Lost int
	// Dropped counts outcomes a live worker knew that were not stored: a
	// key in review or failed although its provider acted and answered.
	Dropped int
	// Mismatched counts succeeded keys whose stored or replayed response
	// differs from what the provider answered, observations that are not
	// valid JSON in UTF-8, and success answers a caller was given that the
	// store does not hold byte for byte.
	Mismatched int
	// Unfinished counts committed calls not in a terminal state.
	Unfinished int
	// NeedlessReview counts keys in review whose delivery mode could have
	// made the outcome certain.
	NeedlessReview int
	// Phantom counts effects and keys of calls that were rolled back, and
	// effects of no submitted call.
	Phantom int

	// Violations says, one line each, what broke (at most 50 lines).
	Violations []string
}

// OK reports whether the report holds no violation.
func (r *Report) OK() bool {
	return r.Duplicates+r.Lost+r.Dropped+r.Mismatched+r.Unfinished+r.NeedlessReview+r.Phantom == 0
}

// Err returns an error listing the violations, or nil.
func (r *Report) Err() error {
	if r.OK() {
		return nil
	}
	return fmt.Errorf("history check: %s\n%s", r.Summary(), strings.Join(r.Violations, "\n"))
}

// Summary returns the report's counts on one line.
func (r *Report) Summary() string {
	return fmt.Sprintf("calls=%d committed=%d rolled_back=%d unknown=%d succeeded=%d failed=%d review=%d "+
		"duplicates=%d lost=%d dropped=%d mismatched=%d unfinished=%d needless_review=%d phantom=%d",
		r.Calls, r.Committed, r.RolledBack, r.Unknown, r.Succeeded, r.Failed, r.Reviewed,
		r.Duplicates, r.Lost, r.Dropped, r.Mismatched, r.Unfinished, r.NeedlessReview, r.Phantom)
}

func (r *Report) violate(counter *int, format string, args ...any) {
	*counter++
	if len(r.Violations) < 50 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// keyRow is a pgonce_key row as the checker reads it.
type keyRow struct {
	state     string
	response  []byte
	lastError string
	attempt   int
}

// ledgerFacts are the ledger's rows of one key.
type ledgerFacts struct {
	effects  [][]byte // responses, in effect order
	idem     []byte   // the keyed provider's stored response
	returned []string // the attempts that answered their caller, and when
}

// Check compares the history with what the store and the ledger hold, and
// replays every succeeded key through client: every committed call
// terminal; exactly one effect for keyed and natural-id calls that
// succeeded, at most one for at-most-once calls; none for rolled-back ones;
// every succeeded key's stored and replayed response byte-identical to what
// the provider answered. Run it once all work is done. pool reads the
// tables of schema directly.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string, client *outbox.Client[pgx.Tx], h *History, opts CheckOpts) (*Report, error) {
	s := ident.Quote(schema)
	keys := map[string]keyRow{}
	rows, err := pool.Query(ctx, `SELECT 'k1_' || encode(key, 'hex'), state::text, response, coalesce(last_error, ''), attempt FROM `+s+`.pgonce_key`)
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	for rows.Next() {
		var key string
		var row keyRow
		if err := rows.Scan(&key, &row.state, &row.response, &row.lastError, &row.attempt); err != nil {
			return nil, fmt.Errorf("read keys: %w", err)
		}
		keys[key] = row
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	facts := map[string]*ledgerFacts{}
	fact := func(key string) *ledgerFacts {
		if facts[key] == nil {
			facts[key] = &ledgerFacts{}
		}
		return facts[key]
	}
	if err := scanAll(ctx, pool, `SELECT key, response FROM `+s+`.faults_effect ORDER BY id`, func(key string, resp []byte) {
		fact(key).effects = append(fact(key).effects, resp)
	}); err != nil {
		return nil, err
	}
	if err := scanAll(ctx, pool, `SELECT key, response FROM `+s+`.faults_idem`, func(key string, resp []byte) {
		fact(key).idem = resp
	}); err != nil {
		return nil, err
	}
	if err := scanAll(ctx, pool, `SELECT key, convert_to(attempt || ' at ' || at::text, 'UTF8')
		FROM `+s+`.faults_attempt WHERE returned ORDER BY id`, func(key string, at []byte) {
		fact(key).returned = append(fact(key).returned, string(at))
	}); err != nil {
		return nil, err
	}

	r := &Report{}
	submitted := map[string]bool{}
	for _, e := range h.Entries() {
		key := string(e.Key)
		submitted[key] = true
		r.Calls++
		f := fact(key)
		row, exists := keys[key]
		delivery := DeliveryOf(e.Call.Tool)
		fate := e.Fate
		switch fate {
		case FateRolledBack:
			r.RolledBack++
		case FateUnknown:
			r.Unknown++
		default:
			r.Committed++
		}
		if fate == FateRolledBack || (fate == FateUnknown && !exists) {
			if exists {
				r.violate(&r.Phantom, "%s %s: rolled back, but its key exists (%s)", e.Call.Tool, key, row.state)
			}
			if len(f.effects) > 0 {
				r.violate(&r.Phantom, "%s %s: rolled back, but it acted %d times", e.Call.Tool, key, len(f.effects))
			}
			continue
		}
		if !exists {
			r.violate(&r.Lost, "%s %s: committed, but its key is gone", e.Call.Tool, key)
			continue
		}
		if n := len(f.effects); n > 1 {
			r.Duplicates += n - 1
			r.violate(new(int), "%s %s: %d effects (%s)", e.Call.Tool, key, n, row.state)
		}
		for _, got := range e.Observed {
			if row.state != "succeeded" || !bytes.Equal(got, row.response) {
				r.violate(&r.Mismatched, "%s %s: a caller was told it succeeded with %s, but the key is %s with %s",
					e.Call.Tool, key, clip(got), row.state, clip(row.response))
				break
			}
		}
		switch row.state {
		case "succeeded":
			r.Succeeded++
			if len(f.effects) == 0 {
				r.violate(&r.Lost, "%s %s: succeeded, but no effect happened", e.Call.Tool, key)
				continue
			}
			want := f.effects[0]
			if delivery == outbox.IdempotentByKey && f.idem != nil {
				want = f.idem
			}
			if !bytes.Equal(row.response, want) {
				r.violate(&r.Mismatched, "%s %s: stored response %s differs from the provider's %s",
					e.Call.Tool, key, clip(row.response), clip(want))
				continue
			}
			if err := checkReplay(ctx, client, e, want); err != nil {
				r.violate(&r.Mismatched, "%s %s: %v", e.Call.Tool, key, err)
			}
		case "failed":
			r.Failed++
			switch {
			case len(f.effects) > 0 && !opts.Crashed:
				r.violate(&r.Dropped, "%s %s: failed, but the provider acted (last error: %q)", e.Call.Tool, key, row.lastError)
			case !e.MayFail:
				r.violate(&r.Dropped, "%s %s: failed, and no failure was expected (last error: %q)", e.Call.Tool, key, row.lastError)
			}
		case "needs_review":
			r.Reviewed++
			switch {
			case delivery != outbox.AtMostOnce:
				r.violate(&r.NeedlessReview, "%s %s: in review, but %s can settle it (last error: %q)",
					e.Call.Tool, key, delivery, row.lastError)
			case len(f.returned) > 0 && !opts.Crashed:
				r.violate(&r.Dropped, "%s %s: in review at attempt %d, but the provider's answer reached a live "+
					"worker (attempt %s; last error: %q)", e.Call.Tool, key, row.attempt, strings.Join(f.returned, ", "), row.lastError)
			}
		default:
			r.violate(&r.Unfinished, "%s %s: still %s (last error: %q)", e.Call.Tool, key, row.state, row.lastError)
		}
	}
	for key, f := range facts {
		if !submitted[key] && len(f.effects) > 0 {
			r.violate(&r.Phantom, "%s: %d effects of a call never submitted", key, len(f.effects))
		}
	}
	sort.Strings(r.Violations)
	return r, nil
}

// checkReplay asks e's call again and requires its stored response back,
// byte for byte, and a valid observation.
func checkReplay(ctx context.Context, client *outbox.Client[pgx.Tx], e Entry, want []byte) error {
	res, err := client.Submit(ctx, e.Call)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if res.Created || res.State != outbox.StateSucceeded {
		return fmt.Errorf("replay: created %v, state %s", res.Created, res.State)
	}
	if !bytes.Equal(res.Response, want) {
		return fmt.Errorf("replay %s differs from the provider's %s", clip(res.Response), clip(want))
	}
	got, err := client.Get(ctx, e.Key)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if !bytes.Equal(got.Response, want) {
		return fmt.Errorf("get %s differs from the provider's %s", clip(got.Response), clip(want))
	}
	if obs := res.Observation().JSON(); !utf8.Valid(obs) || !json.Valid(obs) {
		return fmt.Errorf("observation is not valid JSON in UTF-8: %s", clip(obs))
	}
	return nil
}

func scanAll(ctx context.Context, pool *pgxpool.Pool, query string, f func(key string, resp []byte)) error {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		return fmt.Errorf("read ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var resp []byte
		if err := rows.Scan(&key, &resp); err != nil {
			return fmt.Errorf("read ledger: %w", err)
		}
		f(key, resp)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read ledger: %w", err)
	}
	return nil
}

// clip shortens b for a message.
func clip(b []byte) string {
	if len(b) > 80 {
		return fmt.Sprintf("%q… (%d bytes)", b[:80], len(b))
	}
	return fmt.Sprintf("%q", b)
}
