package console_test

import (
	"database/sql"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// toolRule is the words of a refusal of a tool name no call can have.
const toolRule = "must match ^[a-z][a-z0-9_.:-]{0,63}$"

func TestToolActions(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testToolActions[pgx.Tx], testToolActions[*sql.Tx])
}

// confirmTool opens a tool action's confirmation page and returns its CSRF
// token.
func (b *testBundle[TTx]) confirmTool(t *testing.T, tool, action string) string {
	t.Helper()
	status, page := b.get(t, "/tools/"+url.PathEscape(tool)+"/"+action)
	require.Equal(t, http.StatusOK, status, page)
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(t, m, page)
	return m[1]
}

// toolUnchanged fails t unless the tools' flow control is as before.
func toolUnchanged[TTx any](t *testing.T, b *testBundle[TTx], before []outbox.ToolStatus) {
	t.Helper()
	after, err := b.client.Tools(t.Context())
	require.NoError(t, err)
	require.Equal(t, before, after)
}

func testToolActions[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("PauseAndResumeFromTheOverview", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		b.pending(t)
		status, page := b.get(t, "/")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, `<table id="flow">`)
		require.Contains(t, page, `<a class="tool-action" href="/tools/refund/pause">pause…</a>`)

		csrf := b.confirmTool(t, "refund", "pause")
		status, page = b.send(t, http.MethodPost, "/tools/refund/pause", url.Values{
			"csrf": {csrf}, "by": {"ana"}, "reason": {"payment provider incident"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "the tool is now <strong>paused</strong>")
		tool, err := b.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.True(t, tool.Paused)
		require.Equal(t, "ana", tool.PausedBy)
		require.Equal(t, "payment provider incident", tool.PausedReason)
		actions, err := b.client.ToolActions(t.Context(), "refund")
		require.NoError(t, err)
		require.Len(t, actions, 1, "the pause is recorded")

		_, page = b.get(t, "/")
		require.Regexp(t, `<tr class="paused"><td>refund</td><td>—</td><td>since [0-9-]+ [0-9:]+Z by <strong>ana</strong>: <span class="reason">payment provider incident</span></td>`, page)
		require.Contains(t, page, `href="/tools/refund/resume">resume…</a>`)

		csrf = b.confirmTool(t, "refund", "resume")
		status, page = b.send(t, http.MethodPost, "/tools/refund/resume", url.Values{
			"csrf": {csrf}, "by": {"ana"}, "reason": {"provider recovered"},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "the tool is now <strong>not paused</strong>")
		tool, err = b.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.False(t, tool.Paused)
		actions, err = b.client.ToolActions(t.Context(), "refund")
		require.NoError(t, err)
		require.Len(t, actions, 2)
		require.Equal(t, "provider recovered", actions[0].Reason)
	})

	t.Run("LimitsAndSlowDownsShown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		_, err := b.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 25, Rate: 20},
			outbox.LimitParams{By: "ana", Reason: "Stripe live-mode limit"})
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `INSERT INTO `+ident.Quote(b.schema)+`.pgonce_tool (tool, not_before)
			VALUES ('email', '2999-01-02 03:04:05Z')`)
		require.NoError(t, err)
		_, page := b.get(t, "/")
		require.Contains(t, page, "<td>refund</td><td>25 in flight; 20/s, burst 20</td><td>—</td><td>—</td>")
		require.Contains(t, page, "<td>email</td><td>—</td><td>—</td><td>2999-01-02 03:04:05Z</td>")
	})

	t.Run("PausingAPausedToolKeepsTheFirstPause", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		_, err := b.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "bo", Reason: "first"})
		require.NoError(t, err)
		before, err := b.client.Tools(t.Context())
		require.NoError(t, err)
		status, page := b.get(t, "/tools/refund/pause")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "paused already: this would change nothing")
		csrf := b.confirmTool(t, "refund", "pause")
		status, page = b.send(t, http.MethodPost, "/tools/refund/pause", url.Values{"csrf": {csrf}, "by": {"ana"}, "reason": {"second"}}, nil)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "by bo: first")
		toolUnchanged(t, b, before)
	})

	t.Run("RefusalsChangeNothing", func(t *testing.T) {
		t.Parallel()
		logger, logs := pgoncetest.CaptureLogs()
		b := setup(t, driver, console.Config{Logger: logger})
		csrf := b.confirmTool(t, "refund", "pause")
		before, err := b.client.Tools(t.Context())
		require.NoError(t, err)
		form := func(edit func(url.Values)) url.Values {
			v := url.Values{"csrf": {csrf}, "by": {"ana"}, "reason": {"incident"}}
			edit(v)
			return v
		}
		for _, tt := range []struct {
			name   string
			path   string
			form   url.Values
			status int
			words  string
		}{
			{"NoCSRF", "/tools/refund/pause", form(func(v url.Values) { v.Del("csrf") }), http.StatusForbidden, "CSRF token does not match"},
			{"WrongCSRF", "/tools/refund/pause", form(func(v url.Values) { v.Set("csrf", strings.Repeat("0", 32)) }), http.StatusForbidden, "CSRF token does not match"},
			{"NoBy", "/tools/refund/pause", form(func(v url.Values) { v.Set("by", " ") }), http.StatusBadRequest, "Say who you are and why"},
			{"NoReason", "/tools/refund/pause", form(func(v url.Values) { v.Del("reason") }), http.StatusBadRequest, "Say who you are and why"},
			{"UnknownAction", "/tools/refund/stop", form(func(url.Values) {}), http.StatusNotFound, "want pause or resume"},
			{"NULInTool", "/tools/re%00fund/pause", form(func(url.Values) {}), http.StatusBadRequest, toolRule},
			{"InvalidUTF8Tool", "/tools/re%FFfund/pause", form(func(url.Values) {}), http.StatusBadRequest, toolRule},
			{"HugeTool", "/tools/" + strings.Repeat("t", 3000) + "/pause", form(func(url.Values) {}), http.StatusBadRequest, toolRule},
			{"ToolNoCallCanHave", "/tools/Bad%20Tool%21/pause", form(func(url.Values) {}), http.StatusBadRequest, toolRule},
			{"UpperCaseTool", "/tools/Refund/resume", form(func(url.Values) {}), http.StatusBadRequest, toolRule},
			{"LongTool", "/tools/" + strings.Repeat("t", 65) + "/pause", form(func(url.Values) {}), http.StatusBadRequest, toolRule},
			{"HugeReason", "/tools/refund/pause", form(func(v url.Values) { v.Set("reason", strings.Repeat("r", 3000)) }), http.StatusBadRequest, "Reason"},
			{"NULInReason", "/tools/refund/pause", form(func(v url.Values) { v.Set("reason", "a\x00b") }), http.StatusBadRequest, "Reason"},
		} {
			status, page := b.send(t, http.MethodPost, tt.path, tt.form, nil)
			require.Equal(t, tt.status, status, "%s: %.400s", tt.name, page)
			require.Contains(t, page, tt.words, tt.name)
			for _, text := range []string{"SQLSTATE", "22021", "invalid byte sequence", "pgonce_tool"} {
				require.NotContains(t, page, text, tt.name)
			}
		}
		// The confirmation page refuses such a name too, before it offers
		// a form.
		for _, path := range []string{"/tools/Bad%20Tool%21/pause", "/tools/Refund/resume", "/tools/a%20b/pause"} {
			status, page := b.get(t, path)
			require.Equal(t, http.StatusBadRequest, status, "%s: %.400s", path, page)
			require.Contains(t, page, toolRule, path)
			require.NotContains(t, page, `name="csrf"`, path)
		}
		toolUnchanged(t, b, before)
		for _, record := range logs.Records() {
			require.Less(t, record.Level, slog.LevelError, "nothing logged at ERROR: %s %v", record.Message, record.Attrs)
		}
	})

	t.Run("ReadOnlyHasNoToolActions", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{ReadOnly: true})
		_, err := b.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "bo", Reason: "incident"})
		require.NoError(t, err)
		before, err := b.client.Tools(t.Context())
		require.NoError(t, err)
		_, page := b.get(t, "/")
		require.Contains(t, page, "by <strong>bo</strong>", "the pause is shown")
		require.NotContains(t, page, "tool-action")
		status, page := b.get(t, "/tools/refund/resume")
		require.Equal(t, http.StatusForbidden, status, page)
		status, page = b.send(t, http.MethodPost, "/tools/refund/resume", url.Values{"csrf": {strings.Repeat("0", 32)}, "by": {"ana"}, "reason": {"r"}}, nil)
		require.Equal(t, http.StatusForbidden, status, page)
		require.Contains(t, page, "read-only")
		toolUnchanged(t, b, before)
	})

	t.Run("BidiControlsInPausesShownVisibly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver, console.Config{})
		csrf := b.confirmTool(t, "refund", "pause")
		status, page := b.send(t, http.MethodPost, "/tools/refund/pause", url.Values{
			"csrf": {csrf}, "by": {"ana\u202e"}, "reason": {"incident\u2067 at the provider" + bidi},
		}, nil)
		require.Equal(t, http.StatusOK, status, page)
		requireNoRawBidi(t, "result", page)
		require.Contains(t, html.UnescapeString(page), "ana⟨U+202E⟩")
		for _, path := range []string{"/", "/tools/refund/resume"} {
			status, page = b.get(t, path)
			require.Equal(t, http.StatusOK, status, path)
			requireNoRawBidi(t, path, page)
			page = html.UnescapeString(page)
			require.Contains(t, page, "incident⟨U+2067⟩ at the provider⟨U+061C⟩", path)
		}
		// A tool named with a bidi control is no tool a call can have: its
		// refusal shows the name without reordering the page.
		path := "/tools/" + url.PathEscape("refund\u202e") + "/pause"
		status, page = b.send(t, http.MethodPost, path, url.Values{"csrf": {csrf}, "by": {"ana"}, "reason": {"r"}}, nil)
		require.Equal(t, http.StatusBadRequest, status, page)
		requireNoRawBidi(t, path, page)
		require.Contains(t, page, toolRule)
	})
}
