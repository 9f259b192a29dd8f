package console

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pgonce/pgonce/outbox"
)

// body is stored bytes made safe to show: never interpreted, valid UTF-8,
// truncated, and pretty-printed when they are JSON.
type body struct {
	Key       outbox.Key
	Part      string
	Size      int
	Shown     string
	Pretty    string
	Truncated bool
	Invalid   bool // not valid UTF-8: shown with U+FFFD
}

func newBody(key outbox.Key, part string, raw []byte) *body {
	if raw == nil {
		return nil
	}
	b := &body{Key: key, Part: part, Size: len(raw), Invalid: !utf8.Valid(raw)}
	shown := raw
	if len(shown) > displayMax {
		shown, b.Truncated = shown[:displayMax], true
	}
	b.Shown = strings.ToValidUTF8(string(shown), "\uFFFD")
	if len(raw) <= prettyMax && json.Valid(raw) {
		var out bytes.Buffer
		if json.Indent(&out, raw, "", "  ") == nil && out.Len() <= displayMax {
			b.Pretty = strings.ToValidUTF8(out.String(), "\uFFFD")
		}
	}
	return b
}

type metaEntry struct{ Name, Value string }

func (h *Handler) inspect(w http.ResponseWriter, r *http.Request) (outbox.Inspection, bool) {
	key, err := outbox.ParseKey(r.PathValue("key"))
	if err == nil {
		var in outbox.Inspection
		in, err = h.ops.Inspect(r.Context(), key)
		if err == nil {
			return in, true
		}
	}
	h.fail(w, r, err)
	return outbox.Inspection{}, false
}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) {
	in, ok := h.inspect(w, r)
	if !ok {
		return
	}
	meta := make([]metaEntry, 0, len(in.Metadata))
	for name, value := range in.Metadata {
		meta = append(meta, metaEntry{name, value})
	}
	slices.SortFunc(meta, func(a, b metaEntry) int { return strings.Compare(a.Name, b.Name) })
	h.render(w, r, http.StatusOK, "key", "Key "+string(in.Key), struct {
		In          outbox.Inspection
		Args        *body
		Response    *body
		Failure     *body
		Metadata    []metaEntry
		Observation *body
		Actions     []string
	}{
		In: in, Args: newBody(in.Key, "args", in.Args), Response: newBody(in.Key, "response", in.Response),
		Failure: newBody(in.Key, "failure", in.Failure), Metadata: meta,
		Observation: newBody(in.Key, "observation", in.Observation().JSON()), Actions: actionsFor(in.State),
	})
}

// raw serves stored bytes as a download, never as a page.
func (h *Handler) raw(w http.ResponseWriter, r *http.Request) {
	in, ok := h.inspect(w, r)
	if !ok {
		return
	}
	var data []byte
	switch r.PathValue("part") {
	case "args":
		data = in.Args
	case "response":
		data = in.Response
	case "failure":
		data = in.Failure
	case "observation":
		data = in.Observation().JSON()
	default:
		h.refuse(w, r, http.StatusNotFound, "no such part: want args, response, failure or observation")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+r.PathValue("part")+`.bin"`)
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
	_, _ = w.Write(data)
}

// actionsFor lists the actions a key's state allows.
func actionsFor(state outbox.State) []string {
	switch state {
	case outbox.StateNeedsReview:
		return []string{"resolve"}
	case outbox.StatePending:
		return []string{"cancel"}
	case outbox.StateFailed, outbox.StateCancelled:
		return []string{"retry"}
	}
	return nil
}

func knownAction(action string) bool {
	return action == "resolve" || action == "cancel" || action == "retry"
}

type confirmData struct {
	In      outbox.Inspection
	Action  string
	Allowed bool
	// Args are the call's arguments, shown beside a resolution.
	Args *body
	// Template says where a resolution's pre-filled body came from.
	Template string
	// Form values, kept when the form is shown again after an error.
	By, Reason, Outcome, Body string
	Problem                   string
}

func (h *Handler) confirm(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if !knownAction(action) {
		h.refuse(w, r, http.StatusNotFound, "no such action: want resolve, cancel or retry")
		return
	}
	if h.config.ReadOnly {
		h.refuse(w, r, http.StatusForbidden, "This console is read-only (--read-only): actions are off.")
		return
	}
	in, ok := h.inspect(w, r)
	if !ok {
		return
	}
	data := confirmData{
		In: in, Action: action, Allowed: slices.Contains(actionsFor(in.State), action), Outcome: "succeeded",
		Args: newBody(in.Key, "args", in.Args),
	}
	if action == "resolve" {
		data.Body, data.Template = h.responseTemplate(r, in)
	}
	h.render(w, r, http.StatusOK, "confirm", action+" "+string(in.Key), data)
}

func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if !knownAction(action) {
		h.refuse(w, r, http.StatusNotFound, "no such action: want resolve, cancel or retry")
		return
	}
	if h.config.ReadOnly {
		h.refuse(w, r, http.StatusForbidden, "This console is read-only (--read-only): nothing was changed.")
		return
	}
	if err := r.ParseForm(); err != nil {
		h.refuse(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	if !validCSRF(r) {
		h.refuse(w, r, http.StatusForbidden, "The form's CSRF token does not match this browser's: reload the key's page and try again. Nothing was changed.")
		return
	}
	key, err := outbox.ParseKey(r.PathValue("key"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	form := confirmData{
		Action: action, Allowed: true, By: strings.TrimSpace(formText(r, "by")), Reason: strings.TrimSpace(formText(r, "reason")),
		Outcome: r.PostFormValue("outcome"), Body: formText(r, "body"),
	}
	again := func(problem string) {
		in, err := h.ops.Inspect(r.Context(), key)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		form.In, form.Problem, form.Args = in, problem, newBody(in.Key, "args", in.Args)
		h.render(w, r, http.StatusBadRequest, "confirm", action+" "+string(key), form)
	}
	if form.By == "" || form.Reason == "" {
		again("Say who you are and why: both are recorded with the key. Nothing was changed.")
		return
	}
	var res outbox.Result
	switch action {
	case "resolve":
		resolution := outbox.Resolution{By: form.By, Reason: form.Reason}
		switch form.Outcome {
		case "succeeded":
			resolution.Action, resolution.Response = outbox.ResolveSucceeded, json.RawMessage(form.Body)
		case "failed":
			resolution.Action, resolution.Failure = outbox.ResolveFailed, json.RawMessage(form.Body)
		case "retry":
			resolution.Action = outbox.ResolveRetry
		default:
			again("Choose an outcome: succeeded, failed or retry. Nothing was changed.")
			return
		}
		if resolution.Action != outbox.ResolveRetry && !json.Valid([]byte(form.Body)) {
			again("The response or failure must be valid JSON; it is replayed verbatim to every duplicate. Nothing was changed.")
			return
		}
		res, err = h.ops.Resolve(r.Context(), key, resolution)
	case "cancel":
		res, err = h.ops.Cancel(r.Context(), key, outbox.CancelParams{By: form.By, Reason: form.Reason})
	case "retry":
		res, err = h.ops.Retry(r.Context(), key, outbox.RetryParams{By: form.By, Reason: form.Reason})
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "result", action+" "+string(key), struct {
		Action string
		Result outbox.Result
		By     string
		Reason string
	}{action, res, form.By, form.Reason})
}
