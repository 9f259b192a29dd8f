package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/outbox"
)

// searchWindow is a window of recent keys the search page offers.
type searchWindow struct {
	Name  string
	Label string
	Span  time.Duration
}

// searchWindows are the windows of recent keys the search page offers.
var searchWindows = []searchWindow{
	{"1h", "last hour", time.Hour},
	{"24h", "last day", 24 * time.Hour},
	{"7d", "last 7 days", 7 * 24 * time.Hour},
	{"30d", "last 30 days", 30 * 24 * time.Hour},
}

// searchFieldName names one of the search page's fields.
type searchFieldName struct {
	Field outbox.SearchField
	Label string
}

// searchFieldNames name the search page's fields; "" is every one.
var searchFieldNames = []searchFieldName{
	{"", "anything"},
	{outbox.SearchArgs, "text in the arguments"},
	{outbox.SearchMetadata, "text in the metadata"},
	{outbox.SearchNaturalID, "natural id"},
	{outbox.SearchBusinessKey, "business key"},
	{outbox.SearchRunID, "run id"},
	{outbox.SearchKey, "key or its start"},
}

// search finds keys by what the operator knows (outbox.Client.Search):
// the header's box, and this page's form with its field, tenant and
// window.
func (h *Handler) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	text, tenant, field, window := queryText(q, "q"), queryText(q, "tenant"), q.Get("in"), q.Get("window")
	if window == "" {
		window = "24h"
	}
	wi := slices.IndexFunc(searchWindows, func(w searchWindow) bool { return w.Name == window })
	if wi < 0 {
		h.refuse(w, r, http.StatusBadRequest, "window: want 1h, 24h, 7d or 30d")
		return
	}
	if !slices.ContainsFunc(searchFieldNames, func(f searchFieldName) bool { return string(f.Field) == field }) {
		h.refuse(w, r, http.StatusBadRequest, "in: want args, metadata, natural_id, business_key, run_id, key or nothing")
		return
	}
	for _, f := range [...]struct{ name, value string }{{"q", text}, {"tenant", tenant}} {
		if problem := filterProblem(f.value); problem != "" {
			h.refuse(w, r, http.StatusBadRequest, f.name+": "+problem)
			return
		}
	}
	data := struct {
		Text, Tenant, Field, Window string
		Windows                     []searchWindow
		Fields                      []searchFieldName
		Searched                    bool
		Result                      outbox.SearchResult
		Bulk                        bool
	}{Text: text, Tenant: tenant, Field: field, Window: window, Windows: searchWindows, Fields: searchFieldNames}
	if strings.TrimSpace(text) != "" {
		params := outbox.SearchParams{
			Text: strings.TrimSpace(text), Tenant: tenant, CreatedAfter: h.config.NowFunc().Add(-searchWindows[wi].Span),
		}
		if field != "" {
			params.Fields = []outbox.SearchField{outbox.SearchField(field)}
		}
		res, err := h.ops.Search(r.Context(), params)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		data.Searched, data.Result = true, res
		data.Bulk = !h.config.ReadOnly && len(res.Keys) > 0
	}
	title := "Search"
	if text != "" {
		title = "Search " + text
	}
	h.render(w, r, http.StatusOK, "search", title, data)
}

// bulkMax is the most keys one bulk action takes.
const bulkMax = 500

// bulk cancels or retries the keys selected in a list, with one name and
// reason recorded on each: the first POST shows what will be done, the
// second, with confirm set, does it, key by key.
func (h *Handler) bulk(w http.ResponseWriter, r *http.Request) {
	if h.config.ReadOnly {
		h.refuse(w, r, http.StatusForbidden, "This console is read-only (--read-only): nothing was changed.")
		return
	}
	if err := r.ParseForm(); err != nil {
		h.refuse(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	if !validCSRF(r) {
		h.refuse(w, r, http.StatusForbidden, "The form's CSRF token does not match this browser's: reload the list and try again. Nothing was changed.")
		return
	}
	action := r.PostFormValue("action")
	if action != "cancel" && action != "retry" {
		h.refuse(w, r, http.StatusBadRequest, "action: want cancel or retry. Nothing was changed.")
		return
	}
	var keys []outbox.Key
	for _, k := range r.PostForm["key"] {
		key, err := outbox.ParseKey(k)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	switch {
	case len(keys) == 0:
		h.refuse(w, r, http.StatusBadRequest, "Select the keys to "+action+" first. Nothing was changed.")
		return
	case len(keys) > bulkMax:
		h.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("At most %d keys at once, got %d. Nothing was changed.", bulkMax, len(keys)))
		return
	}
	form := struct {
		Action, By, Reason string
		Keys               []outbox.Key
		Problem            string
		Done               []bulkOutcome
		Changed            int
	}{Action: action, By: strings.TrimSpace(formText(r, "by")), Reason: strings.TrimSpace(formText(r, "reason")), Keys: keys}
	if form.By == "" || form.Reason == "" {
		form.Problem = "Say who you are and why: both are recorded with every key. Nothing was changed."
		h.render(w, r, http.StatusBadRequest, "bulk", action+" "+fmt.Sprint(len(keys))+" keys", form)
		return
	}
	if r.PostFormValue("confirm") == "" {
		h.render(w, r, http.StatusOK, "bulk", action+" "+fmt.Sprint(len(keys))+" keys", form)
		return
	}
	for _, key := range keys {
		var (
			res outbox.Result
			err error
		)
		if action == "cancel" {
			res, err = h.ops.Cancel(r.Context(), key, outbox.CancelParams{By: form.By, Reason: form.Reason})
		} else {
			res, err = h.ops.Retry(r.Context(), key, outbox.RetryParams{By: form.By, Reason: form.Reason})
		}
		done := bulkOutcome{Key: key, State: res.State}
		switch {
		case err == nil:
			form.Changed++
		case errors.Is(err, outbox.ErrNotCancellable), errors.Is(err, outbox.ErrNotRetryable),
			errors.Is(err, outbox.ErrNotFound), errors.Is(err, outbox.ErrExpired), errors.Is(err, outbox.ErrInvalidParams):
			done.Refused = err.Error()
		default:
			h.config.Logger.Error("console: bulk "+action, "key", key, "err", err)
			done.Refused = "The console could not do this; the error is in its log."
		}
		form.Done = append(form.Done, done)
	}
	h.render(w, r, http.StatusOK, "bulk", action+" "+fmt.Sprint(len(keys))+" keys", form)
}

// bulkOutcome is what a bulk action did to one key.
type bulkOutcome struct {
	Key     outbox.Key
	State   outbox.State
	Refused string
}

// responseTemplate returns the body a resolution's form starts with, and
// says where it came from: the shape of the response of a recent succeeded
// call of the same tool, its values blanked (strings empty, numbers 0), so
// that the operator fills in what the provider did; {} when there is none.
func (h *Handler) responseTemplate(r *http.Request, in outbox.Inspection) (string, string) {
	const empty = "{}"
	none := "No succeeded " + in.Tool + " call of the last day to take a shape from: write the response the provider gave, or the failure."
	if in.Tool == "" {
		return empty, none
	}
	now := h.config.NowFunc()
	for _, span := range []time.Duration{time.Hour, outbox.ListWindowMax} {
		page, err := h.ops.List(r.Context(), outbox.ListParams{
			States: []outbox.State{outbox.StateSucceeded}, Tool: in.Tool, CreatedAfter: now.Add(-span), Limit: 1,
		})
		if err != nil || len(page.Keys) == 0 {
			continue
		}
		sample, err := h.ops.Inspect(r.Context(), page.Keys[0].Key)
		if err != nil || !json.Valid(sample.Response) {
			continue
		}
		var v any
		decoder := json.NewDecoder(bytes.NewReader(sample.Response))
		decoder.UseNumber()
		if decoder.Decode(&v) != nil {
			continue
		}
		shape, err := json.MarshalIndent(blank(v), "", "  ")
		if err != nil || len(shape) > displayMax {
			continue
		}
		return string(shape), "Pre-filled with the shape of the response of " + string(sample.Key) + ", a succeeded " +
			in.Tool + " call, its values blanked: fill in what the provider did, or write the failure instead."
	}
	return empty, none
}

// blank keeps v's shape and blanks its values: strings empty, numbers 0,
// booleans false, arrays empty.
func blank(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for name, value := range v {
			v[name] = blank(value)
		}
		return v
	case []any:
		return []any{}
	case string:
		return ""
	case json.Number:
		return 0
	case bool:
		return false
	}
	return v
}

// stamp is a time in one short line, month to second, UTC.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("01-02 15:04:05")
}

// precise is a time to the millisecond, UTC: attempts retried at once
// are told apart.
func precise(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// shortKeyDigits is how many hex digits of a key a list shows.
const shortKeyDigits = 10

// shortKey is the start of a key, which a list shows; the whole key is a
// click away.
func shortKey(key outbox.Key) string {
	s := string(key)
	if n := len(outbox.KeyPrefix) + shortKeyDigits; len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// oneLine is s on one line, its bidi controls visible, cut at max runes.
func oneLine(max int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > max {
		runes := []rune(s)
		s = string(runes[:max]) + "…"
	}
	return visible(s)
}

// argsText is the start of stored arguments as text, shown safely.
func argsText(args []byte) string {
	return visible(strings.ToValidUTF8(string(args), "\uFFFD"))
}

// outcomeName is how an attempt's outcome reads.
func outcomeName(o outbox.AttemptOutcome) string {
	switch o {
	case outbox.AttemptRetry:
		return "retry after a backoff"
	case outbox.AttemptUncertain:
		return "uncertain: tried again"
	case outbox.AttemptLeaseExpired:
		return "lease ran out: taken over"
	case outbox.AttemptNeedsReview:
		return "sent to review"
	case outbox.AttemptInFlight:
		return "in flight now"
	}
	return string(o)
}
