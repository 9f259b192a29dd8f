package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/outbox"
)

// Tools of a [Ledger]'s registry, one per delivery mode.
const (
	ToolKeyed   = "ledger_keyed"
	ToolNatural = "ledger_natural"
	ToolOnce    = "ledger_once"
)

// Tools lists the ledger's tools, in a fixed order.
var Tools = []string{ToolKeyed, ToolNatural, ToolOnce}

// DeliveryOf returns the delivery mode a [Ledger] registers tool with.
func DeliveryOf(tool string) outbox.Delivery {
	switch tool {
	case ToolNatural:
		return outbox.LookupByNaturalID
	case ToolOnce:
		return outbox.AtMostOnce
	}
	return outbox.IdempotentByKey
}

// Mode is how one provider call of a [Ledger] behaves.
type Mode int

// Modes of a provider call. The Act modes make the effect first and then
// misbehave; the Fail modes fail without acting.
const (
	// ModeReturn acts and returns the effect's response.
	ModeReturn Mode = iota
	// ModeActThenTimeout acts, then blocks until the call's deadline and
	// returns the context's error: the caller cannot know it acted.
	ModeActThenTimeout
	// ModeActThenPanic acts, then panics.
	ModeActThenPanic
	// ModeInvalidBody acts and returns bytes that are not JSON.
	ModeInvalidBody
	// ModeHugeBody acts and returns a response of several megabytes.
	ModeHugeBody
	// ModeInvalidUTF8Body acts and returns JSON whose string holds bytes
	// that are not UTF-8.
	ModeInvalidUTF8Body
	// ModeFailBadText fails without acting, with error text holding a NUL
	// byte and invalid UTF-8.
	ModeFailBadText
	// ModeFailTransient fails without acting, with a plain error.
	ModeFailTransient
)

// modeNames name the modes in the attempts table and in summaries.
var modeNames = map[Mode]string{
	ModeReturn:          "return",
	ModeActThenTimeout:  "act_then_timeout",
	ModeActThenPanic:    "act_then_panic",
	ModeInvalidBody:     "invalid_body",
	ModeHugeBody:        "huge_body",
	ModeInvalidUTF8Body: "invalid_utf8_body",
	ModeFailBadText:     "fail_bad_text",
	ModeFailTransient:   "fail_transient",
}

// String returns the mode's name.
func (m Mode) String() string { return modeNames[m] }

// HugeBodySize is the size of a [ModeHugeBody] response.
const HugeBodySize = 2 << 20

// Ledger models downstream systems whose effects are rows of tables in the
// test's schema, so that every process of a test sees the same effects.
// Every provider call is a row of faults_attempt; every effect a row of
// faults_effect (with the exact bytes the provider answered); the keyed
// provider's own deduplication store is faults_idem, apart from the effects,
// so that a duplicate that slipped past it still shows as a second effect.
type Ledger struct {
	pool   *pgxpool.Pool
	schema string // quoted

	// ModeFunc, when set, chooses how each provider call behaves. nil means
	// [ModeReturn] for every call.
	ModeFunc func(req outbox.Request) Mode
	// Latency is spent before every provider call (the request in transit),
	// so that faults land while calls are running. Zero means none.
	Latency time.Duration
	// HoldFunc, when set, is called after a call acted and before it
	// answers, so that a test can inject a fault while the answer is on its
	// way.
	HoldFunc func(ctx context.Context, req outbox.Request)
}

// NewLedger returns a ledger over the tables that [CreateLedger] made in
// schema, reached through pool.
func NewLedger(pool *pgxpool.Pool, schema string) *Ledger {
	return &Ledger{pool: pool, schema: ident.Quote(schema)}
}

// CreateLedger creates the ledger's tables in schema.
func CreateLedger(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s := ident.Quote(schema)
	_, err := pool.Exec(ctx, `
		CREATE TABLE `+s+`.faults_attempt (
			id bigserial PRIMARY KEY,
			key text NOT NULL,
			tool text NOT NULL,
			natural_id text NOT NULL,
			attempt integer NOT NULL,
			mode text NOT NULL,
			pid integer NOT NULL,
			returned boolean NOT NULL DEFAULT false,
			at timestamptz NOT NULL DEFAULT clock_timestamp()
		);
		CREATE TABLE `+s+`.faults_effect (
			id bigserial PRIMARY KEY,
			key text NOT NULL,
			tool text NOT NULL,
			natural_id text NOT NULL,
			response bytea NOT NULL
		);
		CREATE INDEX ON `+s+`.faults_effect (natural_id, tool);
		CREATE TABLE `+s+`.faults_idem (
			key text PRIMARY KEY,
			response bytea NOT NULL
		);`)
	if err != nil {
		return fmt.Errorf("create ledger: %w", err)
	}
	return nil
}

// Registry returns a registry of the ledger's three tools: [ToolKeyed]
// (deduplicated by key), [ToolNatural] (looked up by natural id) and
// [ToolOnce] (at most once). opts, when not nil, apply to every tool.
func (l *Ledger) Registry(opts *outbox.ToolOpts) (*outbox.Registry, error) {
	registry := outbox.NewRegistry()
	return registry, errors.Join(
		registry.RegisterWithOpts(ToolKeyed, keyedProvider{l}, outbox.IdempotentByKey, opts),
		registry.RegisterWithOpts(ToolNatural, lookupProvider{l}, outbox.LookupByNaturalID, opts),
		registry.RegisterWithOpts(ToolOnce, plainProvider{l}, outbox.AtMostOnce, opts),
	)
}

// ErrTransient is what [ModeFailTransient] calls return.
var ErrTransient = errors.New("faults: downstream unavailable, nothing done")

func (l *Ledger) mode(req outbox.Request) Mode {
	if l.ModeFunc == nil {
		return ModeReturn
	}
	return l.ModeFunc(req)
}

// newResponse returns the bytes a provider answers for a new effect: unique
// to the effect, so that a replay of another effect's bytes shows.
func newResponse(req outbox.Request, mode Mode) []byte {
	var id [8]byte
	_, _ = rand.Read(id[:])
	switch mode {
	case ModeInvalidBody:
		return []byte("effect " + hex.EncodeToString(id[:]) + " <not json> \xff\xfe")
	case ModeInvalidUTF8Body:
		return fmt.Appendf(nil, `{"effect":"%x","key":%q,"note":"caf\xe9 \xff"}`, id, req.Key)
	case ModeHugeBody:
		pad := strings.Repeat("x", HugeBodySize)
		return fmt.Appendf(nil, `{"effect":"%x","key":%q,"pad":"%s"}`, id, req.Key, pad)
	}
	return fmt.Appendf(nil, `{"effect":"%x","key":%q,"attempt":%d,"pid":%d}`, id, req.Key, req.Attempt, os.Getpid())
}

// call runs one provider call: the statement records the attempt and, for
// modes that act, the effect (act is the effect's part of the statement), and
// then the mode decides what the caller sees.
func (l *Ledger) call(ctx context.Context, req outbox.Request, act func(ctx context.Context, mode Mode) ([]byte, error)) (json.RawMessage, error) {
	mode := l.mode(req)
	if l.Latency > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(l.Latency):
		}
	}
	var attemptID int64
	if err := l.pool.QueryRow(ctx, `INSERT INTO `+l.schema+`.faults_attempt (key, tool, natural_id, attempt, mode, pid)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		string(req.Key), req.Tool, req.NaturalID, req.Attempt, mode.String(), os.Getpid()).Scan(&attemptID); err != nil {
		return nil, err
	}
	switch mode {
	case ModeFailBadText:
		return nil, errors.New("downstream said \x00 no \xff\xfe (nothing done)")
	case ModeFailTransient:
		return nil, ErrTransient
	}
	resp, err := act(ctx, mode)
	if err != nil {
		// The effect's statement may have committed before its answer was
		// lost: an honest provider cannot tell.
		return nil, outbox.Ambiguous(err)
	}
	if l.HoldFunc != nil {
		l.HoldFunc(ctx, req)
	}
	switch mode {
	case ModeActThenTimeout:
		<-ctx.Done()
		return nil, ctx.Err()
	case ModeActThenPanic:
		panic("faults: provider panics after acting")
	}
	// The caller is about to know the outcome: mark it, so that the checker
	// can tell a known outcome that was later dropped. A failure here only
	// leaves the outcome counted as unknown.
	markCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = l.pool.Exec(markCtx, `UPDATE `+l.schema+`.faults_attempt SET returned = true WHERE id = $1`, attemptID)
	return resp, nil
}

// insertEffect writes one effect and returns its bytes.
func (l *Ledger) insertEffect(ctx context.Context, req outbox.Request, mode Mode) ([]byte, error) {
	resp := newResponse(req, mode)
	_, err := l.pool.Exec(ctx, `INSERT INTO `+l.schema+`.faults_effect (key, tool, natural_id, response)
		VALUES ($1, $2, $3, $4)`, string(req.Key), req.Tool, req.NaturalID, resp)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// keyedProvider deduplicates on the key it is given, as an API taking an
// Idempotency-Key header does: a key presented again causes no second effect
// and gets the first effect's response, byte for byte.
type keyedProvider struct{ *Ledger }

func (p keyedProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	return p.call(ctx, req, func(ctx context.Context, mode Mode) ([]byte, error) {
		resp := newResponse(req, mode)
		// Insert-or-return in one transaction: the dedup row and the effect
		// commit together, and a repeat finds the first response.
		var stored []byte
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO `+p.schema+`.faults_idem (key, response) VALUES ($1, $2)
				ON CONFLICT (key) DO NOTHING`, string(req.Key), resp)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 1 {
				stored = resp
				_, err = tx.Exec(ctx, `INSERT INTO `+p.schema+`.faults_effect (key, tool, natural_id, response)
					VALUES ($1, $2, $3, $4)`, string(req.Key), req.Tool, req.NaturalID, resp)
				return err
			}
			// A new statement sees the row a concurrent first insert
			// committed while this one waited on it.
			return tx.QueryRow(ctx, `SELECT response FROM `+p.schema+`.faults_idem WHERE key = $1`,
				string(req.Key)).Scan(&stored)
		})
		return stored, err
	})
}

// lookupProvider can be asked whether the action with a natural id happened,
// but does not deduplicate: a second call is a second effect.
type lookupProvider struct{ *Ledger }

func (p lookupProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	return p.call(ctx, req, func(ctx context.Context, mode Mode) ([]byte, error) {
		return p.insertEffect(ctx, req, mode)
	})
}

func (p lookupProvider) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	var resp []byte
	err := p.pool.QueryRow(ctx, `SELECT response FROM `+p.schema+`.faults_effect
		WHERE natural_id = $1 AND tool = $2 ORDER BY id LIMIT 1`, req.NaturalID, req.Tool).Scan(&resp)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return resp, true, nil
}

// plainProvider can neither deduplicate nor be asked: every call acts.
type plainProvider struct{ *Ledger }

func (p plainProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	return p.call(ctx, req, func(ctx context.Context, mode Mode) ([]byte, error) {
		return p.insertEffect(ctx, req, mode)
	})
}
