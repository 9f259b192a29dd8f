package console

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/outbox"
)

// displayMax is how many bytes of a response, failure or argument list a
// page shows; the rest is behind the raw link.
const displayMax = 64 << 10

// pageSize is how many keys a page of the keys list shows, unless the
// query's limit says otherwise.
const pageSize = 50

// prettyMax is the largest body pretty-printed beside the verbatim one.
const prettyMax = 256 << 10

var (
	overviewStates = []outbox.State{
		outbox.StatePending, outbox.StateInFlight, outbox.StateNeedsReview,
		outbox.StateSucceeded, outbox.StateFailed, outbox.StateCancelled, outbox.StateExpired,
	}
	listStates = []outbox.State{
		outbox.StatePending, outbox.StateInFlight, outbox.StateNeedsReview,
		outbox.StateFailed, outbox.StateCancelled, outbox.StateSucceeded, outbox.StateExpired,
	}
)

// page is what every template gets.
type page struct {
	Title    string
	Schema   string
	ReadOnly bool
	Refresh  int
	CSRF     string
	// Query is the header's search box's text.
	Query string
	Data  any
}

// parseTemplates parses every page. Templates print text through show, the
// console's one rule for shown text (see visible), or through line, args
// or join, which apply it too.
func (h *Handler) parseTemplates() error {
	funcs := template.FuncMap{
		"ago":      ago,
		"time":     func(t time.Time) string { return formatTime(t) },
		"stamp":    stamp,
		"precise":  precise,
		"join":     func(ss []string) string { return visible(strings.Join(ss, ", ")) },
		"delivery": deliveryName,
		"show":     visible,
		"short":    shortKey,
		"line":     oneLine,
		"args":     argsText,
		"outcome":  outcomeName,
	}
	h.pages = make(map[string]*template.Template)
	for _, name := range []string{"overview", "keys", "search", "run", "key", "confirm", "bulk", "result", "error", "toolconfirm", "toolresult"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return err
		}
		h.pages[name] = t
	}
	return nil
}

func deliveryName(d outbox.Delivery) string {
	switch d {
	case outbox.IdempotentByKey:
		return "idempotent by key"
	case outbox.LookupByNaturalID:
		return "lookup by natural id"
	case outbox.AtMostOnce:
		return "at most once"
	case outbox.Transactional:
		return "transactional"
	}
	return strconv.Itoa(int(d))
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	h.renderPage(w, r, status, name, page{Title: title, Schema: h.config.Schema, ReadOnly: h.config.ReadOnly, Data: data, Query: queryText(r.URL.Query(), "q")})
}

func (h *Handler) renderPage(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	if name == "overview" && h.config.RefreshSeconds > 0 {
		p.Refresh = h.config.RefreshSeconds
	}
	p.CSRF = csrfToken(r)
	var buf bytes.Buffer
	if err := h.pages[name].Execute(&buf, p); err != nil {
		h.config.Logger.Error("console: render", "page", name, "err", err)
		http.Error(w, "The page could not be rendered; the error is in the console's log.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// refuse renders an error page with status.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.render(w, r, status, "error", http.StatusText(status), errorPage(status, msg))
}

// refuseAnonymous is refuse for a client that has not passed the token or
// Host checks: the page names no schema.
func (h *Handler) refuseAnonymous(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.renderPage(w, r, status, "error", page{Title: http.StatusText(status), Data: errorPage(status, msg)})
}

func errorPage(status int, msg string) any {
	return struct{ Status, Message string }{Status: strconv.Itoa(status) + " " + http.StatusText(status), Message: msg}
}

// fail renders err in words, with the status it calls for. An error the
// request did not cause is logged, and the page says only that: its text
// may be the database's.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, outbox.ErrInvalidKey), errors.Is(err, outbox.ErrInvalidParams),
		errors.Is(err, outbox.ErrInvalidResolution):
		status = http.StatusBadRequest
	case errors.Is(err, outbox.ErrNotNeedsReview), errors.Is(err, outbox.ErrNotCancellable),
		errors.Is(err, outbox.ErrNotRetryable), errors.Is(err, outbox.ErrExpired):
		status = http.StatusConflict
	default:
		h.config.Logger.Error("console", "path", r.URL.Path, "err", err)
		h.refuse(w, r, status, "The console could not do this; the error is in its log.")
		return
	}
	h.refuse(w, r, status, err.Error())
}

type toolRow struct {
	Tool      string
	Counts    []countCell
	PerMinute string
	// OldestPending is how long the tool's oldest due pending key has
	// waited, or empty when the tool has no pending key.
	OldestPending string
}

// countCell is one count of the overview, with the list of its keys;
// Estimated marks an estimate from the planner's statistics, AtLeast a
// lower bound (a window with more keys than a count reads).
type countCell struct {
	N         int64
	Estimated bool
	AtLeast   bool
	Link      string
	// Hint, when set, says what the link lists.
	Hint string
}

// overviewWindow is one of the overview's windows of creation time.
type overviewWindow struct {
	Name  string
	Label string
	Span  time.Duration // zero: all time
}

var overviewWindows = []overviewWindow{
	{"1h", "Last hour", time.Hour},
	{"24h", "Last day", 24 * time.Hour},
	{"all", "All", 0},
}

// keysLink is the keys list of tool's keys in state created since since
// (zero: any time); succeeded keys and tombstones, listed within a window
// only, are listed from the last day then.
func keysLink(tool string, state outbox.State, since time.Time, now time.Time) (link, hint string) {
	v := url.Values{"state": {string(state)}}
	if tool != "" && state != outbox.StateExpired {
		v.Set("tool", tool)
	}
	if since.IsZero() && (state == outbox.StateSucceeded || state == outbox.StateExpired) {
		since, hint = now.Add(-outbox.ListWindowMax), "listed from the last day: these keys are listed within a window"
	}
	if !since.IsZero() {
		v.Set("after", since.UTC().Format(time.RFC3339))
	}
	return "/keys?" + v.Encode(), hint
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("window")
	if name == "" {
		name = "all"
	}
	i := slices.IndexFunc(overviewWindows, func(o overviewWindow) bool { return o.Name == name })
	if i < 0 {
		h.refuse(w, r, http.StatusBadRequest, "window: want 1h, 24h or all")
		return
	}
	window := overviewWindows[i]
	snap, err := h.readStats(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	stats := snap.Stats
	keys, estimated, partial, at := stats.Keys, stats.IsEstimated, false, snap.At
	var since time.Time
	if window.Span > 0 {
		counts, err := h.readCounts(r.Context(), window.Span)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		keys, estimated, partial, at, since = counts.Counts.Keys, func(outbox.State) bool { return false }, counts.Counts.Partial, counts.At, counts.Since
	}
	tools := make([]string, 0, len(keys))
	for tool := range keys {
		tools = append(tools, tool)
	}
	sort.Strings(tools)
	rows := make([]toolRow, 0, len(tools))
	for _, tool := range tools {
		row := toolRow{Tool: tool, PerMinute: "—", OldestPending: "—"}
		if rate, ok := snap.PerMinute[tool]; ok {
			row.PerMinute = strconv.FormatFloat(rate, 'f', 1, 64)
		}
		if oldest, ok := stats.OldestPendingByTool[tool]; ok {
			row.OldestPending = ago(oldest)
		}
		for _, state := range overviewStates {
			cell := countCell{N: keys[tool][state], Estimated: estimated(state), AtLeast: partial}
			cell.Link, cell.Hint = keysLink(tool, state, since, h.config.NowFunc())
			row.Counts = append(row.Counts, cell)
		}
		rows = append(rows, row)
	}
	link := func(state outbox.State) string {
		l, _ := keysLink("", state, time.Time{}, h.config.NowFunc())
		return l
	}
	statuses, err := h.ops.Tools(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	flow := flowRows(statuses, tools, h.config.NowFunc())
	h.render(w, r, http.StatusOK, "overview", "Overview", struct {
		Windows []overviewWindow
		Window  overviewWindow
		States  []outbox.State
		Rows    []toolRow
		Stats   outbox.Stats
		At      time.Time
		Since   time.Time
		Partial bool
		Links   map[string]string
		Max     int
		Flow    []flowRow
	}{overviewWindows, window, overviewStates, rows, stats, at, since, partial, map[string]string{
		"pending": link(outbox.StatePending), "in_flight": link(outbox.StateInFlight),
		"needs_review": link(outbox.StateNeedsReview), "expired": link(outbox.StateExpired),
	}, outbox.CountCreatedMax, flow})
}

type keysFilter struct {
	States        []outbox.State
	Tool          string
	Tenant        string
	RunID         string
	CreatedAfter  string
	CreatedBefore string
	Limit         string
}

// query returns the filter as a URL query, for the next page's link.
func (f keysFilter) query(cursor string) string {
	v := url.Values{}
	for _, s := range f.States {
		v.Add("state", string(s))
	}
	for name, value := range map[string]string{
		"tool": f.Tool, "tenant": f.Tenant, "run": f.RunID,
		"after": f.CreatedAfter, "before": f.CreatedBefore, "cursor": cursor, "limit": f.Limit,
	} {
		if value != "" {
			v.Set(name, value)
		}
	}
	return v.Encode()
}

// parseTime accepts RFC 3339 and the browser's datetime-local form, in UTC.
func parseTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New(field + ": want a time such as 2026-01-02T15:04 (UTC) or RFC 3339")
}

func (h *Handler) keys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	filter := keysFilter{
		Tool: queryText(q, "tool"), Tenant: queryText(q, "tenant"), RunID: queryText(q, "run"),
		CreatedAfter: q.Get("after"), CreatedBefore: q.Get("before"),
	}
	for _, s := range q["state"] {
		if s != "" {
			filter.States = append(filter.States, outbox.State(s))
		}
	}
	for _, field := range [...]struct{ name, value string }{{"tool", filter.Tool}, {"tenant", filter.Tenant}, {"run", filter.RunID}} {
		if problem := filterProblem(field.value); problem != "" {
			h.refuse(w, r, http.StatusBadRequest, field.name+": "+problem)
			return
		}
	}
	windowed := slices.Contains(filter.States, outbox.StateSucceeded) || slices.Contains(filter.States, outbox.StateExpired)
	params := outbox.ListParams{
		States: filter.States, Tool: filter.Tool, Tenant: filter.Tenant, RunID: filter.RunID,
		Cursor: q.Get("cursor"), Limit: pageSize,
	}
	var err error
	if l := q.Get("limit"); l != "" {
		if params.Limit, err = strconv.Atoi(l); err != nil {
			h.refuse(w, r, http.StatusBadRequest, "limit: want a number of keys per page")
			return
		}
		filter.Limit = l
	}
	if params.CreatedAfter, err = parseTime("after", filter.CreatedAfter); err != nil {
		h.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if params.CreatedBefore, err = parseTime("before", filter.CreatedBefore); err != nil {
		h.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	window := ""
	if windowed {
		// Succeeded keys and tombstones are listed within a window of at
		// most a day: the last day unless the filter says otherwise, and a
		// window that began earlier is cut to the day before its end. The
		// window's ends go into the filter, so that its pages are those of
		// one window.
		if params.CreatedBefore.IsZero() {
			params.CreatedBefore = h.config.NowFunc().Truncate(time.Second).Add(time.Second)
			filter.CreatedBefore = params.CreatedBefore.UTC().Format(time.RFC3339)
		}
		if earliest := params.CreatedBefore.Add(-outbox.ListWindowMax); params.CreatedAfter.Before(earliest) {
			params.CreatedAfter = earliest
			filter.CreatedAfter = earliest.UTC().Format(time.RFC3339)
			window = filter.CreatedAfter + " to " + filter.CreatedBefore
		}
	}
	res, err := h.ops.List(r.Context(), params)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if filter.RunID != "" {
		// A run's page shows its steps in the order the model issued them.
		slices.SortStableFunc(res.Keys, func(a, b outbox.ListedKey) int {
			return int(a.Step - b.Step)
		})
	}
	next := ""
	if res.Cursor != "" {
		next = "/keys?" + filter.query(res.Cursor)
	}
	type stateBox struct {
		State   outbox.State
		Checked bool
	}
	boxes := make([]stateBox, 0, len(listStates))
	for _, s := range listStates {
		boxes = append(boxes, stateBox{s, slices.Contains(filter.States, s)})
	}
	// The run's page: under the filter's tenant, or, without one, the
	// page that finds the tenants that have the run.
	runPage := ""
	if filter.RunID != "" {
		v := url.Values{"run": {filter.RunID}}
		if filter.Tenant != "" {
			v.Set("tenant", filter.Tenant)
		}
		runPage = "/run?" + v.Encode()
	}
	h.render(w, r, http.StatusOK, "keys", "Keys", struct {
		Filter        keysFilter
		Boxes         []stateBox
		Keys          []outbox.ListedKey
		Next          string
		RunPage       string
		DefaultWindow string
		Bulk          bool
	}{filter, boxes, res.Keys, next, runPage, window, !h.config.ReadOnly && len(res.Keys) > 0})
}

// filterProblem says what is wrong with a list filter's value, as
// [outbox.Client.RunSteps] says it of a run's tenant and id, or returns "": no
// stored tenant, run id or tool is longer than [outbox.CallStringMaxBytes],
// invalid UTF-8 or holds a NUL, so no such filter matches anything, and
// PostgreSQL would refuse the last two.
func filterProblem(value string) string {
	switch {
	case len(value) > outbox.CallStringMaxBytes:
		return fmt.Sprintf("must be at most %d bytes, got %d", outbox.CallStringMaxBytes, len(value))
	case !utf8.ValidString(value):
		return "must be valid UTF-8"
	case strings.IndexByte(value, 0) >= 0:
		return "must not contain NUL bytes"
	}
	return ""
}

// runPageSize is how many steps the run page shows at once.
const runPageSize = 100

// run shows a run's steps in step order, every state included: the tool
// calls of an agent's run as the model issued them.
func (h *Handler) run(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	params := outbox.RunParams{Tenant: queryText(q, "tenant"), RunID: queryText(q, "run"), Limit: runPageSize}
	if from := q.Get("from"); from != "" {
		var err error
		if params.FromStep, err = strconv.ParseInt(from, 10, 64); err != nil {
			h.refuse(w, r, http.StatusBadRequest, "from: want a step number")
			return
		}
	}
	res, err := h.ops.RunSteps(r.Context(), params)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	next := ""
	if res.NextStep != 0 {
		v := url.Values{"run": {params.RunID}, "from": {strconv.FormatInt(res.NextStep, 10)}}
		if params.Tenant != "" {
			v.Set("tenant", params.Tenant)
		}
		next = "/run?" + v.Encode()
	}
	// A run asked for without its tenant, or not found under the one
	// given: the tenants that have a run of this id.
	var others []outbox.FoundRun
	if !q.Has("tenant") || len(res.Steps) == 0 {
		found, err := h.ops.Search(r.Context(), outbox.SearchParams{Text: params.RunID, Fields: []outbox.SearchField{outbox.SearchRunID}})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		for _, run := range found.Runs {
			if run.Tenant != params.Tenant {
				others = append(others, run)
			}
		}
	}
	h.render(w, r, http.StatusOK, "run", "Run "+params.RunID, struct {
		Params     outbox.RunParams
		Steps      []outbox.RunStep
		Next       string
		GapMax     int
		Others     []outbox.FoundRun
		NoTenant   bool
		SearchSpan time.Duration
	}{params, res.Steps, next, outbox.RunGapMax, others, !q.Has("tenant"), outbox.SearchWindowDefault})
}
