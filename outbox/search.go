package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// Bounds of [Client.Search].
const (
	// SearchLimitDefault is how many keys [Client.Search] returns when
	// [SearchParams.Limit] is zero.
	SearchLimitDefault = 50
	// SearchLimitMax is the most keys [Client.Search] returns.
	SearchLimitMax = 1000
	// SearchWindowDefault is how far back [Client.Search] reads recent
	// keys when [SearchParams.CreatedAfter] is zero: a day.
	SearchWindowDefault = 24 * time.Hour
	// SearchKeyPrefixMin is the fewest hex digits of a key prefix
	// [Client.Search] looks for.
	SearchKeyPrefixMin = 6
	// SearchRunsMax is the most tenants [SearchResult.Runs] names.
	SearchRunsMax = 100
)

// SearchField is what [SearchParams.Text] is matched against.
type SearchField string

const (
	// SearchKey matches a whole key (k1_ and 64 hex digits), of any age,
	// tombstones included, or a prefix of at least [SearchKeyPrefixMin]
	// hex digits of a recent or listed key, with or without "k1_".
	SearchKey SearchField = "key"
	// SearchNaturalID matches [Call.NaturalID] exactly, in keys of any
	// age, on an index of the keys that have one.
	SearchNaturalID SearchField = "natural_id"
	// SearchBusinessKey matches [Call.Key] exactly: of any age under
	// [SearchParams.Tenant] ("" for none), through the scope the business
	// key derives, and under any tenant among recent and listed keys.
	SearchBusinessKey SearchField = "business_key"
	// SearchRunID matches [Call.RunID] exactly: it names, in
	// [SearchResult.Runs], the tenants that have a run of that id, whose
	// steps [Client.RunSteps] reads. Its keys are not in [SearchResult.Keys].
	SearchRunID SearchField = "run_id"
	// SearchArgs matches text inside the canonical arguments of recent
	// and listed keys: an order id, a customer, an e-mail address, as
	// JSON spells it (see [SearchParams.Text]).
	SearchArgs SearchField = "args"
	// SearchMetadata matches text inside the [Call.Metadata] of recent and
	// listed keys, its names and values (a ticket, an order number), as
	// JSON spells it, like [SearchArgs].
	SearchMetadata SearchField = "metadata"
)

// searchFields are every [SearchField], in the order their matches are
// reported.
var searchFields = []SearchField{SearchKey, SearchNaturalID, SearchBusinessKey, SearchRunID, SearchArgs, SearchMetadata}

// SearchParams say what [Client.Search] looks for.
type SearchParams struct {
	// Text is what the operator knows: a key or the start of one, a
	// natural id, a business key, a run id, or text the arguments or the
	// metadata hold. In the arguments and the metadata it is matched
	// literally, as it would be written inside a JSON string, so 8842
	// finds {"order":8842} and {"order":"ord_8842"}, and "ord_8842" (with
	// its quotes) only the latter; no character is a wildcard. Required: at most
	// [CallStringMaxBytes] bytes of valid UTF-8, without NUL bytes.
	Text string
	// Fields are what Text is matched against; empty means every
	// [SearchField].
	Fields []SearchField
	// Tenant, when not empty, keeps only that tenant's keys and runs, and
	// is the tenant of a business key looked up by its scope (which is
	// then the call's without a tenant when empty).
	Tenant string
	// CreatedAfter and CreatedBefore bound the window of recent keys the
	// search reads (see [Client.Search]); CreatedAfter defaults to
	// [SearchWindowDefault] before now, CreatedBefore to no end.
	CreatedAfter  time.Time
	CreatedBefore time.Time
	// Limit is the most keys returned: 1 to [SearchLimitMax]. Zero means
	// [SearchLimitDefault].
	Limit int
}

// FoundKey is one key [Client.Search] found.
type FoundKey struct {
	ListedKey
	// NaturalID is the call's natural id.
	NaturalID string
	// Matched are the fields Text matched in this key.
	Matched []SearchField
}

// FoundRun is a run whose id [SearchParams.Text] is, under one tenant.
type FoundRun struct {
	// Tenant is the run's tenant, "" for none.
	Tenant string
	// RunID is the run's id.
	RunID string
	// Keys counts the run's keys the search saw: those created in the
	// window and the older listed ones; zero when the run was found by its
	// steps alone ([Client.RunSteps]).
	Keys int64
}

// SearchResult is what [Client.Search] found.
type SearchResult struct {
	// Keys are the keys found, newest first: exact matches of any age
	// (a whole key, a natural id, a business key under the tenant), then
	// the matches among recent and listed keys.
	Keys []FoundKey
	// Runs are the tenants that have a run whose id is Text, by tenant.
	Runs []FoundRun
	// CreatedAfter is where the window of recent keys began.
	CreatedAfter time.Time
	// More reports that more keys matched than Limit.
	More bool
}

// Search finds keys by what an operator knows of a call: its key or the
// start of one, its natural id, its business key, its run id, or a value
// in its arguments or its metadata such as an order id or a ticket. Whole
// keys, natural ids and business keys under [SearchParams.Tenant] are found
// at any age on indexes; prefixes of keys, business keys under any tenant,
// run ids and text in the arguments or the metadata are looked for among
// the keys created in a window
// of recent time (the last [SearchWindowDefault] unless set), read through
// the BRIN index on creation time, and among older keys an operator lists
// (pending, in flight, failed, needs review, cancelled), read on their
// index. The window's cost is what it holds: every key created in it is
// read once per statement (two statements when Text may be a run id), at
// about a microsecond a key; see docs/operating.md for the figures at a
// million keys. Each statement is a snapshot of its own; the result is not
// one.
//
// It returns [ErrInvalidParams] for an empty or malformed Text or Tenant,
// an unknown field, a window that ends before it begins or a limit out of
// range; nothing runs then.
func (c *Client[TTx]) Search(ctx context.Context, params SearchParams) (SearchResult, error) {
	limit := params.Limit
	if limit == 0 {
		limit = SearchLimitDefault
	}
	fields := params.Fields
	if len(fields) == 0 {
		fields = searchFields
	}
	switch {
	case strings.TrimSpace(params.Text) == "":
		return SearchResult{}, fmt.Errorf("%w: Text is required", ErrInvalidParams)
	case limit < 1 || limit > SearchLimitMax:
		return SearchResult{}, fmt.Errorf("%w: Limit must be between 1 and %d, got %d", ErrInvalidParams, SearchLimitMax, params.Limit)
	case !params.CreatedBefore.IsZero() && !params.CreatedBefore.After(params.CreatedAfter):
		return SearchResult{}, fmt.Errorf("%w: CreatedBefore must be after CreatedAfter", ErrInvalidParams)
	}
	for _, field := range [...]struct{ name, value string }{{"Text", params.Text}, {"Tenant", params.Tenant}} {
		if reason := callStringProblem(field.value); reason != "" {
			return SearchResult{}, fmt.Errorf("%w: %s %s", ErrInvalidParams, field.name, reason)
		}
	}
	for _, field := range fields {
		if !slices.Contains(searchFields, field) {
			return SearchResult{}, fmt.Errorf("%w: field %q cannot be searched; search one of %v", ErrInvalidParams, field, searchFields)
		}
	}
	text := params.Text
	result := SearchResult{CreatedAfter: params.CreatedAfter}
	if result.CreatedAfter.IsZero() {
		result.CreatedAfter = c.now().Add(-SearchWindowDefault)
	}
	var before *time.Time
	if !params.CreatedBefore.IsZero() {
		before = ptr(params.CreatedBefore)
	}
	var tenant *string
	if params.Tenant != "" {
		tenant = ptr(params.Tenant)
	}
	found := newFoundKeys(limit)

	// Exact matches of any age, on indexes.
	if slices.Contains(fields, SearchKey) {
		if key, err := ParseKey(text); err == nil {
			if err := c.searchKeys(ctx, found, SearchKey, func() ([]*store.KeyRow, error) {
				row, err := c.store.Executor().KeyGet(ctx, string(key), c.nowParam())
				return []*store.KeyRow{row}, err
			}); err != nil {
				return SearchResult{}, err
			}
		}
	}
	if slices.Contains(fields, SearchNaturalID) {
		rows, err := c.store.SearchByNaturalID(ctx, text, tenant, ListArgsBytes, limit+1, c.nowParam())
		if err != nil {
			return SearchResult{}, fmt.Errorf("search keys: %w", err)
		}
		for _, row := range rows {
			found.add(c.foundKey(row), SearchNaturalID)
		}
	}
	if slices.Contains(fields, SearchBusinessKey) {
		if err := c.searchKeys(ctx, found, SearchBusinessKey, func() ([]*store.KeyRow, error) {
			return c.store.KeysByScope(ctx, []string{businessScope(params.Tenant, text)}, c.nowParam())
		}); err != nil {
			return SearchResult{}, err
		}
	}

	// Matches among recent and listed keys.
	scan := &store.SearchParams{
		Tenant: tenant, Since: result.CreatedAfter, Before: before,
		ArgsBytes: ListArgsBytes, Max: limit + 1, Now: c.nowParam(),
	}
	if slices.Contains(fields, SearchKey) {
		if prefix, ok := keyPrefix(text); ok {
			scan.KeyPrefix = prefix
		}
	}
	if slices.Contains(fields, SearchBusinessKey) {
		scan.BusinessKey = text
	}
	if slices.Contains(fields, SearchArgs) {
		scan.ArgsNeedle = argsNeedle(text)
	}
	if slices.Contains(fields, SearchMetadata) {
		scan.MetadataNeedle = metadataNeedle(text)
	}
	if scan.KeyPrefix != "" || scan.BusinessKey != "" || scan.ArgsNeedle != nil || scan.MetadataNeedle != nil {
		rows, err := c.store.Search(ctx, scan)
		if err != nil {
			return SearchResult{}, fmt.Errorf("search keys: %w", err)
		}
		for _, row := range rows {
			key := c.foundKey(row)
			if scan.KeyPrefix != "" && strings.HasPrefix(string(key.Key)[len(KeyPrefix):], scan.KeyPrefix) {
				found.add(key, SearchKey)
			}
			if scan.BusinessKey != "" && row.BusinessKey == scan.BusinessKey {
				found.add(key, SearchBusinessKey)
			}
			if row.ArgsMatched {
				found.add(key, SearchArgs)
			}
			if row.MetadataMatched {
				found.add(key, SearchMetadata)
			}
		}
	}

	if slices.Contains(fields, SearchRunID) {
		runs, err := c.searchRuns(ctx, text, params.Tenant, result.CreatedAfter, before)
		if err != nil {
			return SearchResult{}, err
		}
		result.Runs = runs
	}
	result.Keys, result.More = found.result()
	return result, nil
}

// searchKeys adds the keys read to found as matches of field; an unknown
// key is no match.
func (c *Client[TTx]) searchKeys(ctx context.Context, found *foundKeys, field SearchField, read func() ([]*store.KeyRow, error)) error {
	rows, err := read()
	if errors.Is(err, store.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("search keys: %w", err)
	}
	for _, row := range rows {
		key := FoundKey{ListedKey: ListedKey{
			Result: c.resultFromRow(row, false), Tenant: row.Tenant, RunID: row.RunID, Step: row.Step,
			BusinessKey: row.BusinessKey,
		}, NaturalID: row.NaturalID}
		// The read returned the stored outcome, which a listing leaves out.
		key.Response, key.Failure = nil, nil
		found.add(key, field)
	}
	return nil
}

// searchRuns returns the tenants that have a run of runID: the one given
// ("" for none) when the run's steps are found by their scopes, and
// every tenant with keys of the run among recent and listed keys.
func (c *Client[TTx]) searchRuns(ctx context.Context, runID, tenant string, since time.Time, before *time.Time) ([]FoundRun, error) {
	tenants, err := c.store.RunTenants(ctx, runID, since, before, SearchRunsMax)
	if err != nil {
		return nil, fmt.Errorf("search runs: %w", err)
	}
	var runs []FoundRun
	for _, t := range tenants {
		if tenant == "" || t.Tenant == tenant {
			runs = append(runs, FoundRun{Tenant: t.Tenant, RunID: runID, Keys: t.Keys})
		}
	}
	if !slices.ContainsFunc(runs, func(r FoundRun) bool { return r.Tenant == tenant }) {
		steps, err := c.RunSteps(ctx, RunParams{Tenant: tenant, RunID: runID, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(steps.Steps) > 0 {
			runs = append(runs, FoundRun{Tenant: tenant, RunID: runID})
			slices.SortFunc(runs, func(a, b FoundRun) int { return strings.Compare(a.Tenant, b.Tenant) })
		}
	}
	return runs, nil
}

func (c *Client[TTx]) foundKey(row *store.ListedKey) FoundKey {
	return FoundKey{ListedKey: c.listedKey(row), NaturalID: row.NaturalID}
}

// foundKeys gathers the keys of a search, each once with every field it
// matched, in the order found.
type foundKeys struct {
	keys  []FoundKey
	index map[Key]int
	limit int
}

func newFoundKeys(limit int) *foundKeys {
	return &foundKeys{index: map[Key]int{}, limit: limit}
}

func (f *foundKeys) add(key FoundKey, field SearchField) {
	if i, ok := f.index[key.Key]; ok {
		if !slices.Contains(f.keys[i].Matched, field) {
			f.keys[i].Matched = append(f.keys[i].Matched, field)
		}
		return
	}
	key.Matched = []SearchField{field}
	f.index[key.Key] = len(f.keys)
	f.keys = append(f.keys, key)
}

// result returns the keys found, exact matches first and each part newest
// first, at most limit, and whether more were found.
func (f *foundKeys) result() ([]FoundKey, bool) {
	if len(f.keys) > f.limit {
		return f.keys[:f.limit], true
	}
	return f.keys, false
}

// keyPrefix returns the hex digits text begins a key with: at least
// [SearchKeyPrefixMin] lower- or upper-case hex digits, with or without
// "k1_", and no whole key (which is looked up by itself).
func keyPrefix(text string) (string, bool) {
	digits := strings.ToLower(strings.TrimPrefix(text, KeyPrefix))
	if len(digits) < SearchKeyPrefixMin || len(digits) >= KeyLength-len(KeyPrefix) {
		return "", false
	}
	if _, err := hex.DecodeString(digits + strings.Repeat("0", len(digits)%2)); err != nil {
		return "", false
	}
	return digits, true
}

// argsNeedle returns the bytes text is looked for as in canonical
// arguments: text as JSON writes it inside a string (RFC 8785 escapes
// quotes, backslashes and control characters, and nothing else), or, for
// text that is itself a JSON string in quotes, that string with its quotes.
func argsNeedle(text string) []byte {
	var quoted string
	if len(text) >= 2 && text[0] == '"' && json.Unmarshal([]byte(text), &quoted) == nil {
		if canonical, err := Canonicalize(quoted); err == nil {
			return canonical
		}
	}
	canonical, err := Canonicalize(text)
	if err != nil || len(canonical) < 2 {
		return []byte(text)
	}
	return canonical[1 : len(canonical)-1]
}

// metadataNeedle returns the bytes text is looked for as in stored
// metadata, which encodeMetadata writes with encoding/json (which escapes
// <, >, &, U+2028 and U+2029 too, unlike RFC 8785): text as it writes it
// inside a string, or, for text that is itself a JSON string in quotes,
// that string with its quotes.
func metadataNeedle(text string) []byte {
	var quoted string
	if len(text) >= 2 && text[0] == '"' && json.Unmarshal([]byte(text), &quoted) == nil {
		if encoded, err := json.Marshal(quoted); err == nil {
			return encoded
		}
	}
	encoded, err := json.Marshal(text)
	if err != nil || len(encoded) < 2 {
		return []byte(text)
	}
	return encoded[1 : len(encoded)-1]
}

// businessScope returns the scope of a business-key call with tenant and
// key, in its hex form: its frame names no tool (KEYSPEC.md).
func businessScope(tenant, key string) string {
	var f []byte
	f = appendField(f, tagScope)
	f = appendField(f, kindBusiness)
	f = appendField(f, tenant)
	f = appendField(f, key)
	sum := sha256.Sum256(f)
	return hex.EncodeToString(sum[:])
}
