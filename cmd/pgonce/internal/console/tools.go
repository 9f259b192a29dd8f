package console

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// flowRow is one tool of the overview's flow control: its limits, pause
// and slow-down, and the path of its pause or resume action.
type flowRow struct {
	Tool   string
	Limits string
	Paused bool
	// PausedAt, PausedBy and PausedReason say when, by whom and why.
	PausedAt     time.Time
	PausedBy     string
	PausedReason string
	// SlowedUntil is set while the tool's provider asked to slow down.
	SlowedUntil time.Time
	// Action is "pause" or "resume", and ActionPath its confirmation page.
	Action     string
	ActionPath string
}

// flowRows returns the flow control of the tools that have any and of the
// tools with keys, by name.
func flowRows(statuses []outbox.ToolStatus, tools []string, now time.Time) []flowRow {
	byTool := make(map[string]outbox.ToolStatus, len(statuses))
	for _, s := range statuses {
		byTool[s.Tool] = s
	}
	for _, tool := range tools {
		if _, ok := byTool[tool]; !ok && tool != "" {
			byTool[tool] = outbox.ToolStatus{Tool: tool}
		}
	}
	rows := make([]flowRow, 0, len(byTool))
	for _, s := range byTool {
		row := flowRow{
			Tool: s.Tool, Limits: limitsText(s.Limits), Paused: s.Paused,
			PausedAt: s.PausedAt, PausedBy: s.PausedBy, PausedReason: s.PausedReason, Action: "pause",
		}
		if s.SlowedDown(now) {
			row.SlowedUntil = s.SlowedUntil
		}
		if s.Paused {
			row.Action = "resume"
		}
		row.ActionPath = toolPath(s.Tool, row.Action)
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b flowRow) int { return strings.Compare(a.Tool, b.Tool) })
	return rows
}

// toolPath is the path of a tool's action page.
func toolPath(tool, action string) string {
	return "/tools/" + url.PathEscape(tool) + "/" + action
}

func limitsText(l outbox.ToolLimits) string {
	var parts []string
	if l.MaxInFlight > 0 {
		parts = append(parts, strconv.Itoa(l.MaxInFlight)+" in flight")
	}
	if l.Rate > 0 {
		parts = append(parts, strconv.FormatFloat(l.Rate, 'f', -1, 64)+"/s, burst "+strconv.Itoa(l.Burst))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, "; ")
}

func knownToolAction(action string) bool { return action == "pause" || action == "resume" }

type toolConfirmData struct {
	Status outbox.ToolStatus
	Action string
	Path   string
	// Allowed is false when the action would change nothing: pausing a
	// paused tool, resuming one that is not.
	Allowed bool
	// Form values, kept when the form is shown again after an error.
	By, Reason string
	Problem    string
}

// toolStatus reads the flow control of the request's tool.
func (h *Handler) toolStatus(w http.ResponseWriter, r *http.Request, tool string) (outbox.ToolStatus, bool) {
	statuses, err := h.ops.Tools(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return outbox.ToolStatus{}, false
	}
	for _, s := range statuses {
		if s.Tool == tool {
			return s, true
		}
	}
	return outbox.ToolStatus{Tool: tool}, true
}

// toolAction returns the request's tool and action, or refuses it.
func (h *Handler) toolAction(w http.ResponseWriter, r *http.Request) (tool, action string, ok bool) {
	action = r.PathValue("action")
	if !knownToolAction(action) {
		h.refuse(w, r, http.StatusNotFound, "no such action: want pause or resume")
		return "", "", false
	}
	if h.config.ReadOnly {
		h.refuse(w, r, http.StatusForbidden, "This console is read-only (--read-only): actions are off; nothing was changed.")
		return "", "", false
	}
	tool = r.PathValue("tool")
	if err := outbox.CheckToolName(tool); err != nil {
		h.refuse(w, r, http.StatusBadRequest, err.Error()+"; nothing was changed.")
		return "", "", false
	}
	return tool, action, true
}

func (h *Handler) toolConfirm(w http.ResponseWriter, r *http.Request) {
	tool, action, ok := h.toolAction(w, r)
	if !ok {
		return
	}
	status, ok := h.toolStatus(w, r, tool)
	if !ok {
		return
	}
	h.render(w, r, http.StatusOK, "toolconfirm", action+" "+tool, toolConfirmData{
		Status: status, Action: action, Path: toolPath(tool, action), Allowed: status.Paused == (action == "resume"),
	})
}

func (h *Handler) toolAct(w http.ResponseWriter, r *http.Request) {
	tool, action, ok := h.toolAction(w, r)
	if !ok {
		return
	}
	if err := r.ParseForm(); err != nil {
		h.refuse(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	if !validCSRF(r) {
		h.refuse(w, r, http.StatusForbidden, "The form's CSRF token does not match this browser's: reload the overview and try again. Nothing was changed.")
		return
	}
	form := toolConfirmData{
		Action: action, Path: toolPath(tool, action), Allowed: true,
		By: strings.TrimSpace(formText(r, "by")), Reason: strings.TrimSpace(formText(r, "reason")),
	}
	if form.By == "" || form.Reason == "" {
		status, ok := h.toolStatus(w, r, tool)
		if !ok {
			return
		}
		form.Status = status
		form.Problem = "Say who you are and why: both are recorded with the tool. Nothing was changed."
		h.render(w, r, http.StatusBadRequest, "toolconfirm", action+" "+tool, form)
		return
	}
	var (
		status outbox.ToolStatus
		err    error
	)
	switch action {
	case "pause":
		status, err = h.ops.Pause(r.Context(), tool, outbox.PauseParams{By: form.By, Reason: form.Reason})
	case "resume":
		status, err = h.ops.Resume(r.Context(), tool, outbox.ResumeParams{By: form.By, Reason: form.Reason})
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "toolresult", action+" "+tool, struct {
		Action string
		Status outbox.ToolStatus
		By     string
		Reason string
	}{action, status, form.By, form.Reason})
}
