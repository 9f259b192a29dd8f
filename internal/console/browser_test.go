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

	"github.com/pgonce/pgonce/internal/console"
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
	browser.screenshot(t, "console-overview.png")

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
	browser.screenshot(t, "console-key.png")

	browser.clickAndLoad(t, "#action-resolve")
	browser.eval(t, `(() => {
		document.querySelector('input[name=outcome][value=succeeded]').checked = true;
		document.querySelector('#body').value = '{"sent":true,"provider_id":"em_8842"}';
		document.querySelector('#by').value = 'ana';
		document.querySelector('#reason').value = 'the provider log shows the e-mail was delivered';
		return true })()`, nil)
	browser.screenshot(t, "console-resolve.png")
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
	browser.screenshot(t, "console-run.png")

	browserEdges(t, driver, browser)
}

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
