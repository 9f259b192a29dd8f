package console_test

import (
	"bufio"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// chromiumEnv names the variable that points the browser test at a
// Chromium binary; else chromium, chromium-browser or google-chrome on
// the PATH. .ci/run installs Debian's chromium when none is there.
const chromiumEnv = "PGONCE_CHROMIUM"

// screenshotsEnv names a directory that receives a copy of the browser
// test's screenshots (those in docs/console are made so).
const screenshotsEnv = "PGONCE_CONSOLE_SCREENSHOTS"

// browser drives a headless Chromium over the DevTools protocol on the
// pipe Chromium opens with --remote-debugging-pipe (file descriptors 3 and
// 4, NUL-terminated JSON messages): no WebSocket and no library.
type browser struct {
	in      io.Writer
	mu      sync.Mutex
	nextID  int
	waiting map[int]chan cdpMessage
	events  chan cdpMessage
	session string
}

type cdpMessage struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    any             `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
	EventParams json.RawMessage `json:"-"`
}

func findChromium(t *testing.T) string {
	t.Helper()
	if path := os.Getenv(chromiumEnv); path != "" {
		return path
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	require.FailNow(t, "no Chromium for the browser test",
		"install Debian's chromium (apt-get install chromium; .ci/run does) or set %s to a Chromium binary", chromiumEnv)
	return ""
}

// startBrowser starts a headless Chromium with one page attached.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	toChrome, chromeIn, err := os.Pipe()
	require.NoError(t, err)
	chromeOut, fromChrome, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command(findChromium(t), //nolint:gosec // the test's own browser
		"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--hide-scrollbars", "--force-device-scale-factor=1", "--window-size=1200,900",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{toChrome, fromChrome}
	stderr, err := os.Create(filepath.Join(t.TempDir(), "chromium.log"))
	require.NoError(t, err)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start(), "start Chromium")
	_ = toChrome.Close()
	_ = fromChrome.Close()
	b := &browser{in: chromeIn, waiting: make(map[int]chan cdpMessage), events: make(chan cdpMessage, 256)}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		b.read(chromeOut)
	}()
	t.Cleanup(func() {
		_ = chromeIn.Close() // Chromium exits when its pipe closes
		// Its exit status says nothing the test checks.
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = chromeOut.Close()
		<-readDone
		_ = stderr.Close()
	})

	var target struct {
		TargetID string `json:"targetId"`
	}
	b.call(t, "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	b.call(t, "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	b.session = attached.SessionID
	b.call(t, "Page.enable", nil, nil)
	return b
}

func (b *browser) read(r io.Reader) {
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 1<<20), 64<<20)
	scanner.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		for i, c := range data {
			if c == 0 {
				return i + 1, data[:i], nil
			}
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	for scanner.Scan() {
		var raw struct {
			cdpMessage
			Params json.RawMessage `json:"params"`
		}
		if json.Unmarshal(scanner.Bytes(), &raw) != nil {
			continue
		}
		msg := raw.cdpMessage
		msg.EventParams = raw.Params
		if msg.ID == 0 {
			select {
			case b.events <- msg:
			default: // nobody waits for this event
			}
			continue
		}
		b.mu.Lock()
		ch := b.waiting[msg.ID]
		delete(b.waiting, msg.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- msg
		}
	}
}

// call sends a command (on the page's session once attached) and decodes
// its result into out.
func (b *browser) call(t *testing.T, method string, params any, out any) {
	t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpMessage, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	data, err := json.Marshal(cdpMessage{ID: id, Method: method, Params: params, SessionID: b.session})
	require.NoError(t, err)
	_, err = b.in.Write(append(data, 0))
	require.NoError(t, err, "write to Chromium")
	select {
	case msg := <-ch:
		if msg.Error != nil {
			require.FailNow(t, method, msg.Error.Message)
		}
		if out != nil {
			require.NoError(t, json.Unmarshal(msg.Result, out), method)
		}
	case <-time.After(20 * time.Second):
		require.FailNow(t, "Chromium did not answer", method)
	}
}

// drain forgets events that arrived so far.
func (b *browser) drain() {
	for {
		select {
		case <-b.events:
		default:
			return
		}
	}
}

// awaitLoad waits for the page's load event.
func (b *browser) awaitLoad(t *testing.T) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-b.events:
			if ev.Method == "Page.loadEventFired" {
				return
			}
		case <-timeout:
			require.FailNow(t, "the page did not load")
		}
	}
}

// navigate loads url and waits for it.
func (b *browser) navigate(t *testing.T, url string) {
	t.Helper()
	b.drain()
	b.call(t, "Page.navigate", map[string]any{"url": url}, nil)
	b.awaitLoad(t)
}

// eval evaluates a JavaScript expression in the page (the DevTools
// protocol is not bound by the page's Content-Security-Policy) and
// decodes its value into out.
func (b *browser) eval(t *testing.T, expression string, out any) {
	t.Helper()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	b.call(t, "Runtime.evaluate", map[string]any{"expression": expression, "returnByValue": true}, &res)
	require.Nil(t, res.ExceptionDetails, expression)
	if out != nil {
		require.NoError(t, json.Unmarshal(res.Result.Value, out), expression)
	}
}

// clickAndLoad clicks the element selector names and waits for the page
// it leads to.
func (b *browser) clickAndLoad(t *testing.T, selector string) {
	t.Helper()
	b.drain()
	var found bool
	b.eval(t, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true })()`, selector), &found)
	require.True(t, found, "no element %s", selector)
	b.awaitLoad(t)
}

// mouseClick clicks the middle of the element selector names with the
// mouse, as a person would (a selection follows a real click, not
// element.click()), and does not wait for a page.
func (b *browser) mouseClick(t *testing.T, selector string) {
	t.Helper()
	var box struct{ X, Y float64 }
	b.eval(t, fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.scrollIntoView({block: "center"});
		const r = e.getBoundingClientRect(); return {X: r.left + r.width / 2, Y: r.top + r.height / 2} })()`, selector), &box)
	for _, event := range []string{"mousePressed", "mouseReleased"} {
		b.call(t, "Input.dispatchMouseEvent", map[string]any{"type": event, "x": box.X, "y": box.Y, "button": "left", "clickCount": 1}, nil)
	}
}

// typeInto sets the value of the input selector names.
func (b *browser) typeInto(t *testing.T, selector, value string) {
	t.Helper()
	b.eval(t, fmt.Sprintf(`(() => { document.querySelector(%q).value = %q; return true })()`, selector, value), nil)
}

func (b *browser) text(t *testing.T, selector string) string {
	t.Helper()
	var s string
	b.eval(t, fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText`, selector), &s)
	return s
}

// screenshot saves the page as a PNG in the test's artifact directory
// (kept with go test -artifacts) and returns its path.
func (b *browser) screenshot(t *testing.T, name string) string {
	t.Helper()
	var shot struct {
		Data string `json:"data"`
	}
	b.call(t, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &shot)
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	require.NoError(t, err)
	path := filepath.Join(t.ArtifactDir(), name)
	require.NoError(t, os.WriteFile(path, png, 0o600))
	if dir := os.Getenv(screenshotsEnv); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o600))
	}
	return path
}

// TestBrowser drives the console in a real headless Chromium: the
// overview, the keys that need review, one key, and its resolution,
// then checks the database; then a console with a token at its edges
// (see browserEdges).
func TestBrowser(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testBrowser[pgx.Tx], testBrowser[*sql.Tx])
}

func testBrowser[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	b := setup(t, driver, console.Config{RefreshSeconds: -1})
	review := b.needsReview(t)
	failed := b.failed(t)
	pending := b.pending(t)
	refunded := b.do(t, "refund", json.RawMessage(`{"id":"re_3NkU","amount":"42.00","status":"succeeded"}`), nil)
	browser := startBrowser(t)

	browser.navigate(t, b.server.URL+"/")
	require.Contains(t, browser.text(t, "#tools"), "email")
	browser.screenshot(t, "overview.png")

	browser.clickAndLoad(t, `nav a[href="/keys"]`)
	browser.eval(t, `(() => { document.querySelector('input[name=state][value=needs_review]').checked = true; return true })()`, nil)
	browser.clickAndLoad(t, "#apply")
	var location string
	browser.eval(t, `location.pathname + location.search`, &location)
	require.Equal(t, "/keys?state=needs_review&tool=&tenant=&run=&after=&before=", location)
	list := browser.text(t, "#keys")
	require.Contains(t, list, string(review))
	require.Contains(t, list, "needs_review")
	require.NotContains(t, list, "failed\t")

	browser.clickAndLoad(t, `a.key[href="/keys/`+string(review)+`"]`)
	require.Equal(t, "needs_review", browser.text(t, "#state"))

	browser.clickAndLoad(t, "#action-resolve")
	browser.eval(t, `(() => {
		document.querySelector('input[name=outcome][value=succeeded]').checked = true;
		document.querySelector('#body').value = '{"sent":true,"provider_id":"em_8842"}';
		document.querySelector('#by').value = 'ana';
		document.querySelector('#reason').value = 'the provider log shows the e-mail was delivered';
		return true })()`, nil)
	browser.screenshot(t, "resolve.png")
	browser.clickAndLoad(t, "#confirm")
	require.Contains(t, browser.text(t, "#outcome"), "the key is now succeeded")

	in := b.inspect(t, review)
	require.Equal(t, outbox.StateSucceeded, in.State)
	require.JSONEq(t, `{"sent":true,"provider_id":"em_8842"}`, string(in.Response))
	require.Len(t, in.Resolutions, 1)
	require.Equal(t, "ana", in.Resolutions[0].By)
	require.Equal(t, "the provider log shows the e-mail was delivered", in.Resolutions[0].Reason)
	require.Equal(t, outbox.ResolveSucceeded, in.Resolutions[0].Action)

	browser.navigate(t, b.server.URL+"/keys/"+string(review))
	require.Equal(t, "succeeded", browser.text(t, "#state"))

	// The key's run: every step in order, the succeeded ones included.
	browser.clickAndLoad(t, `a[href^="/run?"]`)
	browser.eval(t, `location.pathname + location.search`, &location)
	require.Equal(t, "/run?run=run-1&tenant=", location)
	steps := browser.text(t, "#steps")
	positions := []int{}
	for _, key := range []outbox.Key{review, failed, pending, refunded.Key} {
		i := strings.Index(steps, string(key))
		require.Positive(t, i, "step %s shown", key)
		positions = append(positions, i)
	}
	require.IsIncreasing(t, positions, "steps in step order")
	require.Equal(t, 2, strings.Count(steps, "succeeded"), "the resolved step and the refund")
	browser.screenshot(t, "run.png")

	browserFind(t, b, browser)
	browserEdges(t, driver, browser)
}

// browserFind drives what an operator who knows only an order id does:
// the refund of order 7731 gave up after three attempts; the order id
// typed in the header's box (one), the key found clicked (two), and its
// page shows every attempt. Then the denser list, a copy of a whole key,
// several keys cancelled at once, the overview's windows, a run found
// without its tenant, a tool paused and resumed from the overview, and a
// tombstone.
func browserFind[TTx any](t *testing.T, b *testBundle[TTx], browser *browser) {
	t.Helper()
	refund := b.gaveUp(t)
	for range 3 {
		b.pending(t)
	}

	// Two steps from the order id to the key's page.
	browser.navigate(t, b.server.URL+"/")
	browser.typeInto(t, "#find-q", "7731")
	browser.clickAndLoad(t, "#find")
	var location string
	browser.eval(t, `location.pathname + location.search`, &location)
	require.Equal(t, "/search?q=7731", location)
	found := browser.text(t, "#found")
	require.Contains(t, found, shortKeyOf(refund))
	require.Contains(t, found, "args")
	browser.screenshot(t, "search.png")
	browser.clickAndLoad(t, `a.key[href="/keys/`+string(refund)+`"]`)
	require.Equal(t, "failed", browser.text(t, "#state"))
	var attempts []string
	browser.eval(t, `[...document.querySelectorAll('#attempts tbody tr')].map(r => r.innerText)`, &attempts)
	require.Len(t, attempts, 3, "every attempt, each with its time, worker, outcome and error")
	for i, outcome := range []string{"retry after a backoff", "retry after a backoff", "failed"} {
		require.Contains(t, attempts[i], outcome)
		require.Contains(t, attempts[i], fmt.Sprintf("attempt %d: 503 Service Unavailable from the payment provider", i+1))
		require.Regexp(t, `\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z`, attempts[i])
	}
	browser.screenshot(t, "key.png")

	// The list: one line a key, the arguments' first bytes, a short key
	// whose whole is one click from the clipboard, errors in full on hover.
	browser.navigate(t, b.server.URL+"/keys?tenant=globex&state=failed&state=pending&state=needs_review")
	var rows []struct {
		Height float64
		Line   float64
		Args   string
		Title  string
	}
	browser.eval(t, `[...document.querySelectorAll('#keys tbody tr')].map(r => ({
		Height: r.getBoundingClientRect().height,
		Line: parseFloat(getComputedStyle(r.querySelector('td.err')).lineHeight),
		Args: r.querySelector('td.args').innerText,
		Title: r.querySelector('td.err').title}))`, &rows)
	require.NotEmpty(t, rows)
	for _, row := range rows {
		require.Less(t, row.Height, 2*row.Line, "a key takes one line: %+v", row)
	}
	browser.navigate(t, b.server.URL+"/keys?state=failed&tenant=globex")
	browser.eval(t, `[...document.querySelectorAll('#keys tbody tr')].map(r => ({
		Height: r.getBoundingClientRect().height,
		Line: parseFloat(getComputedStyle(r.querySelector('td.err')).lineHeight),
		Args: r.querySelector('td.args').innerText,
		Title: r.querySelector('td.err').title}))`, &rows)
	require.Len(t, rows, 1)
	require.Contains(t, rows[0].Args, `"customer":"cus_5521"`)
	require.Equal(t, "attempt 3: 503 Service Unavailable from the payment provider", rows[0].Title, "the whole error on hover")
	browser.mouseClick(t, "#keys tbody tr .copy")
	var selected string
	browser.eval(t, `window.getSelection().toString()`, &selected)
	require.Equal(t, string(refund), selected, "one click selects the whole key")

	// Several pending keys cancelled at once, with one reason.
	browser.navigate(t, b.server.URL+"/keys")
	var pending []string
	browser.eval(t, `[...document.querySelectorAll('#keys tbody tr')].filter(r => r.querySelector('.state.pending')).map(r => r.querySelector('input[name=key]').value)`, &pending)
	require.Len(t, pending, 3)
	for _, key := range pending[:2] {
		browser.mouseClick(t, `#keys input[name=key][value="`+key+`"]`)
	}
	browser.eval(t, `(() => { document.querySelector('#bulk-action').value = 'cancel'; return true })()`, nil)
	browser.typeInto(t, "#bulk-by", "ana")
	browser.typeInto(t, "#bulk-reason", "duplicate orders, the customer asked once")
	browser.screenshot(t, "keys.png")
	browser.clickAndLoad(t, "#bulk-submit")
	require.Contains(t, browser.text(t, "#bulk-keys"), pending[0])
	browser.clickAndLoad(t, "#confirm")
	require.Contains(t, browser.text(t, "#outcome"), "2 of 2 keys changed")
	for i, key := range pending {
		in := b.inspect(t, outbox.Key(key))
		if i < 2 {
			require.Equal(t, outbox.StateCancelled, in.State)
			require.Len(t, in.Resolutions, 1)
			require.Equal(t, "duplicate orders, the customer asked once", in.Resolutions[0].Reason)
		} else {
			require.Equal(t, outbox.StatePending, in.State, "not selected")
		}
	}

	// The overview's windows, each count a link to its keys.
	browser.navigate(t, b.server.URL+"/")
	browser.clickAndLoad(t, `#windows a[href="/?window=1h"]`)
	browser.screenshot(t, "overview-hour.png")
	browser.clickAndLoad(t, `#tools a[href*="state=cancelled&tool=refund"]`)
	browser.eval(t, `location.search`, &location)
	require.Contains(t, location, "after=", "the hour's keys")
	require.Equal(t, 2, strings.Count(browser.text(t, "#keys"), "cancelled"))

	// A run followed without its tenant.
	browser.navigate(t, b.server.URL+"/keys?run=run-g")
	browser.clickAndLoad(t, "#run-page")
	require.Contains(t, browser.text(t, "#tenants"), "run run-g of tenant globex")
	browser.clickAndLoad(t, `#tenants a[href="/run?run=run-g&tenant=globex"]`)
	require.Contains(t, browser.text(t, "#steps"), shortKeyOf(refund))

	// A resolution's form: filled in, each label bound to its control.
	review := b.needsReview(t)
	browser.navigate(t, b.server.URL+"/keys/"+string(review)+"/resolve")
	var filled string
	browser.eval(t, `document.querySelector('#body').value`, &filled)
	require.NotEmpty(t, filled)
	require.True(t, json.Valid([]byte(filled)), filled)
	browser.mouseClick(t, `label[for="outcome-failed"]`)
	var checked string
	browser.eval(t, `document.querySelector('input[name=outcome]:checked').value`, &checked)
	require.Equal(t, "failed", checked, "a click on the label chooses its outcome")

	// A tool paused from the overview's flow control, then resumed.
	browser.navigate(t, b.server.URL+"/")
	browser.clickAndLoad(t, `#flow a.tool-action[href="/tools/refund/pause"]`)
	browser.typeInto(t, "#by", "ana")
	browser.typeInto(t, "#reason", "the payment provider's incident")
	browser.clickAndLoad(t, "#confirm")
	require.Contains(t, browser.text(t, "#outcome"), "the tool is now paused")
	tool, err := b.client.Tool(t.Context(), "refund")
	require.NoError(t, err)
	require.True(t, tool.Paused)
	require.Equal(t, "ana", tool.PausedBy)
	browser.navigate(t, b.server.URL+"/")
	require.Contains(t, browser.text(t, "#flow"), "by ana: the payment provider's incident")
	browser.screenshot(t, "overview-paused.png")
	browser.clickAndLoad(t, `#flow a.tool-action[href="/tools/refund/resume"]`)
	browser.typeInto(t, "#by", "ana")
	browser.typeInto(t, "#reason", "the provider recovered")
	browser.clickAndLoad(t, "#confirm")
	require.Contains(t, browser.text(t, "#outcome"), "the tool is now not paused")
	tool, err = b.client.Tool(t.Context(), "refund")
	require.NoError(t, err)
	require.False(t, tool.Paused)

	// A tombstone says what it is and what it had.
	_, err = pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(b.schema), pgoncetest.StoredKey(t, string(refund)), nil)
	require.NoError(t, err)
	browser.navigate(t, b.server.URL+"/keys/"+string(refund))
	require.Contains(t, browser.text(t, "#tombstone"), "This key is a tombstone.")
	require.Equal(t, "failed", browser.text(t, "#expired-from"))
	browser.screenshot(t, "tombstone.png")
}

// shortKeyOf is key as a list shows it.
func shortKeyOf(key outbox.Key) string { return string(key)[:13] + "…" }

// browserEdges drives the browser at the console's edges, on a console
// with a token: a token traded at a path a browser reads as another
// host's stays on the console, and a tenant holding bidi controls reads as
// stored, its controls visible.
func browserEdges[TTx any](t *testing.T, driver drivertest.Driver[TTx], browser *browser) {
	t.Helper()
	b := setup(t, driver, console.Config{Token: testToken, RefreshSeconds: -1})
	call := b.call("email")
	call.Tenant = "acme\u202egnp.exe\u202c"
	res, err := b.client.Submit(t.Context(), call)
	require.NoError(t, err)

	browser.navigate(t, b.server.URL+"/%5Cevil.example/?token="+testToken)
	var origin string
	browser.eval(t, `location.origin`, &origin)
	require.Equal(t, b.server.URL, origin, "the token trade's redirect stays on the console")

	browser.navigate(t, b.server.URL+"/keys/"+string(res.Key))
	tenant := browser.text(t, "dl dd:nth-of-type(2)")
	require.Equal(t, "acme⟨U+202E⟩gnp.exe⟨U+202C⟩", tenant)
	var body string
	browser.eval(t, `document.body.innerText`, &body)
	require.NotContains(t, body, "\u202e")
}
