package pgonce_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"
	"unicode"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// quickstartMarker precedes the README's quick start, a fenced Go block that
// is a whole program.
const quickstartMarker = "<!-- quickstart -->"

// TestReadmeQuickstartBuilds extracts the README's quick start and builds it
// inside this module, so that the code a newcomer copies compiles against
// the packages as they are. It builds through an overlay: nothing is written
// into the source tree, and nothing is downloaded.
func TestReadmeQuickstartBuilds(t *testing.T) {
	t.Parallel()
	buildQuickstart(t)
}

// TestReadmeQuickstartRuns runs the README's quick start as a newcomer
// would: without DATABASE_URL it stops with an error that names it and
// connects nowhere; with it, over a database of its own, it prints a line
// per call, the succeeded observations, and their replays on a second run,
// and nothing else: no log line of pgonce's; the store credit's row is
// written once.
func TestReadmeQuickstartRuns(t *testing.T) {
	t.Parallel()
	bin := buildQuickstart(t)
	run := func(env ...string) (stdout, stderr string, err error) {
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(t.Context(), bin)
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "DATABASE_URL=")
		}), env...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err = cmd.Run()
		return out.String(), errOut.String(), err
	}

	stdout, stderr, err := run()
	require.Error(t, err, "without DATABASE_URL the quick start must fail")
	require.Empty(t, stdout)
	require.Contains(t, stderr, "DATABASE_URL is not set")

	databaseURL := pgoncetest.NewDatabase(t)
	for i, want := range []string{`"status":"succeeded"`, `"replayed":true`} {
		stdout, stderr, err = run("DATABASE_URL=" + databaseURL)
		require.NoError(t, err, "run %d; stderr: %s", i+1, stderr)
		require.Empty(t, stderr, "run %d: pgonce logged without a Logger", i+1)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		require.Len(t, lines, 2, "run %d prints a line per call: %s", i+1, stdout)
		for _, line := range lines {
			require.Contains(t, line, want, "run %d", i+1)
		}
	}
	// The store credit, the transactional tool's row, was written once.
	db, err := sql.Open("pgx", databaseURL)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	var credits int
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT count(*) FROM store_credit`).Scan(&credits))
	require.Equal(t, 1, credits)
}

// buildQuickstart extracts the README's quick start, checks its form, and
// builds it; it returns the program's path.
func buildQuickstart(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	code, err := quickstart(readme)
	require.NoError(t, err)

	formatted, err := format.Source(code)
	require.NoError(t, err, "the quick start does not parse")
	require.Equal(t, string(formatted), string(code), "the quick start is not gofmt-formatted")

	file, err := parser.ParseFile(token.NewFileSet(), "main.go", code, parser.ImportsOnly)
	require.NoError(t, err)
	require.Equal(t, "main", file.Name.Name, "the quick start is a whole program, package main")
	for _, imp := range file.Imports {
		importPath, err := strconv.Unquote(imp.Path.Value)
		require.NoError(t, err)
		require.NotContains(t, importPath, "/internal/", "the quick start imports only what a user can import")
	}

	root, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	require.NoError(t, os.WriteFile(src, code, 0o600))
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "readme-quickstart", "main.go"): src},
	})
	require.NoError(t, err)
	overlayPath := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(overlayPath, overlay, 0o600))

	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "building the quick start needs the go command")
	bin := filepath.Join(dir, "quickstart")
	build := exec.CommandContext(t.Context(), goTool, "build", "-overlay", overlayPath, "-o", bin, "./readme-quickstart")
	build.Dir = root
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "the README's quick start does not build:\n%s", out)
	return bin
}

// quickstart returns the fenced Go block that follows the quick-start marker.
func quickstart(markdown []byte) ([]byte, error) {
	_, after, found := bytes.Cut(markdown, []byte(quickstartMarker))
	if !found {
		return nil, fmt.Errorf("no %s marker", quickstartMarker)
	}
	if bytes.Contains(after, []byte(quickstartMarker)) {
		return nil, fmt.Errorf("more than one %s marker", quickstartMarker)
	}
	after = bytes.TrimLeft(after, " \t\r\n")
	const fence = "```go\n"
	if !bytes.HasPrefix(after, []byte(fence)) {
		return nil, fmt.Errorf("%s is not followed by a ```go block", quickstartMarker)
	}
	code, _, found := bytes.Cut(after[len(fence):], []byte("\n```"))
	if !found {
		return nil, fmt.Errorf("the quick start's block is not closed")
	}
	return append(code, '\n'), nil
}

// TestDocLinks checks that every relative link in README.md, KEYSPEC.md,
// CHANGELOG.md and docs/ names a file that exists and, with a #fragment, a
// heading of that file.
func TestDocLinks(t *testing.T) {
	t.Parallel()

	files := []string{"README.md", "KEYSPEC.md", "CHANGELOG.md"}
	require.NoError(t, fs.WalkDir(os.DirFS("."), "docs", func(name string, entry fs.DirEntry, err error) error {
		if err == nil && !entry.IsDir() && strings.HasSuffix(name, ".md") {
			files = append(files, name)
		}
		return err
	}))
	require.Contains(t, files, "docs/README.md")

	problems, links := checkLinks(os.DirFS("."), files)
	require.Empty(t, problems)
	require.Greater(t, links, 50, "the checker found too few links to be reading them")
}

// TestDocLinksCatchesBrokenLinks runs the link checker on documents with
// known faults, so that a broken link cannot pass TestDocLinks unseen.
func TestDocLinksCatchesBrokenLinks(t *testing.T) {
	t.Parallel()

	fsys := fstest.MapFS{
		"README.md": {Data: []byte("# Top\n\n" +
			"[ok](docs/a.md#state-and-its-outcome) [ok](#top) [ok](docs/) [ok](https://example.com/x#y)\n" +
			"![ok](docs/img.png) [ok](docs/a.md#a-second-one-1) [ok](docs/a.md#submittx--bare)\n" +
			"[missing file](docs/b.md) [missing anchor](docs/a.md#nothing) [anchor on a file that is not markdown](docs/img.png#x)\n" +
			"`[in code](nowhere.md)`\n\n```md\n[in a block](nowhere.md)\n```\n\n" +
			"[ref]: docs/none.md\n")},
		"docs/a.md": {Data: []byte("# A\n\n## State and its `outcome`\n\n## A second one\n\n## A second one\n\n## `SubmitTx` ÷ bare\n\n" +
			"```sh\n# not a heading\n```\n\n[up](../README.md#top) [up](../README.md#not-a-heading)\n")},
		"docs/img.png": {Data: []byte{0x89}},
	}
	problems, links := checkLinks(fsys, []string{"README.md", "docs/a.md"})
	require.Equal(t, 12, links)
	require.Equal(t, []string{
		`README.md: [anchor on a file that is not markdown](docs/img.png#x): anchor on a file that is not markdown`,
		`README.md: [missing anchor](docs/a.md#nothing): no heading "nothing" in docs/a.md`,
		`README.md: [missing file](docs/b.md): docs/b.md does not exist`,
		`README.md: [ref](docs/none.md): docs/none.md does not exist`,
		`docs/a.md: [up](../README.md#not-a-heading): no heading "not-a-heading" in README.md`,
	}, problems)
}

var (
	// codeFence opens or closes a fenced code block.
	codeFence = regexp.MustCompile("^\\s*(```|~~~)")
	// codeSpan is inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	// inlineLink is [text](target) or ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`(!?\[(?:[^\[\]]|\[[^\[\]]*\])*\])\(\s*<?([^\s<>()]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDefinition is a reference-style link's definition: [label]: target.
	refDefinition = regexp.MustCompile(`^\s{0,3}(\[[^\]]+\]):\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	// scheme starts an absolute URL, which the checker leaves alone.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	// atxHeading is a Markdown heading line.
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	// htmlAnchor is an explicit anchor, <a id="x"> or <a name="x">.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// checkLinks reads the Markdown files named in fsys and returns a line per
// relative link that does not resolve, and how many links it checked.
func checkLinks(fsys fs.FS, files []string) (problems []string, links int) {
	anchors := make(map[string]map[string]bool) // by file, its headings' slugs
	anchorsOf := func(name string) (map[string]bool, error) {
		if set, ok := anchors[name]; ok {
			return set, nil
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		set := headingAnchors(data)
		anchors[name] = set
		return set, nil
	}

	for _, file := range files {
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		for _, line := range proseLines(data) {
			line = codeSpan.ReplaceAllString(line, "")
			matches := inlineLink.FindAllStringSubmatch(line, -1)
			if m := refDefinition.FindStringSubmatch(line); m != nil {
				matches = append(matches, m)
			}
			for _, m := range matches {
				text, target := m[1], m[2]
				if scheme.MatchString(target) {
					continue
				}
				links++
				if problem := checkLink(fsys, file, target, anchorsOf); problem != "" {
					problems = append(problems, fmt.Sprintf("%s: %s(%s): %s", file, text, target, problem))
				}
			}
		}
	}
	slices.Sort(problems)
	return problems, links
}

// checkLink resolves one relative link of file and says what is wrong with
// it, or "".
func checkLink(fsys fs.FS, file, target string, anchorsOf func(string) (map[string]bool, error)) string {
	ref, fragment, _ := strings.Cut(target, "#")
	ref, err := url.PathUnescape(ref)
	if err != nil {
		return err.Error()
	}
	name := file
	if ref != "" {
		name = path.Join(path.Dir(file), ref)
		if !fs.ValidPath(name) {
			return "outside the repository"
		}
		if _, err := fs.Stat(fsys, name); err != nil {
			return name + " does not exist"
		}
	}
	if fragment == "" {
		return ""
	}
	if !strings.HasSuffix(name, ".md") {
		return "anchor on a file that is not markdown"
	}
	set, err := anchorsOf(name)
	if err != nil {
		return err.Error()
	}
	if !set[fragment] {
		return fmt.Sprintf("no heading %q in %s", fragment, name)
	}
	return ""
}

// proseLines returns the lines of a Markdown document outside fenced code
// blocks.
func proseLines(data []byte) []string {
	var lines []string
	inCode := false
	for line := range strings.Lines(string(data)) {
		if codeFence.MatchString(line) {
			inCode = !inCode
			continue
		}
		if !inCode {
			lines = append(lines, strings.TrimRight(line, "\r\n"))
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives a document's headings, and
// its explicit <a id> anchors.
func headingAnchors(data []byte) map[string]bool {
	set := make(map[string]bool)
	seen := make(map[string]int)
	for _, line := range proseLines(data) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			set[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := headingSlug(m[1])
		if n := seen[slug]; n > 0 {
			set[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			set[slug] = true
		}
		seen[slug]++
	}
	return set
}

// markdownLink is a link inside a heading, whose text alone is the
// heading's.
var markdownLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// headingSlug is GitHub's anchor for a heading: its text lower-cased, with
// every character but letters, digits, spaces, hyphens and underscores
// removed and spaces made hyphens.
func headingSlug(heading string) string {
	text := markdownLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestRecoveryTimesMatchDefaults recomputes the figures of "Recovery times"
// in docs/operating.md from the defaults in the code, so that a changed
// default cannot leave the page promising other times.
func TestRecoveryTimesMatchDefaults(t *testing.T) {
	t.Parallel()

	db, err := sql.Open("pgx", "postgres://127.0.0.1:1/none") // never connected: New runs no statement
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	client, err := outbox.New(db, outbox.Config{})
	require.NoError(t, err)
	lease := client.Config().Lease
	grace := reconcile.GraceDefault
	interval := dispatcher.MaintenanceIntervalDefault
	leadership := 3 * interval // dispatcher.Config.MaintenanceInterval: "holds its leadership for three intervals"

	var backoffMin, backoffMax time.Duration // the 25th attempt's start, at the shortest and longest jitter
	for attempt := 1; attempt < dispatcher.MaxAttemptsDefault; attempt++ {
		delay := min(dispatcher.BackoffMinDefault<<(attempt-1), dispatcher.BackoffMaxDefault)
		backoffMin += delay / 2
		backoffMax += delay
	}

	page, err := os.ReadFile(filepath.Join("docs", "operating.md"))
	require.NoError(t, err)
	_, section, found := strings.Cut(string(page), "\n## Recovery times\n")
	require.True(t, found)
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ")

	seconds := func(d time.Duration) string { return fmt.Sprintf("%d s", int(d.Seconds())) }
	hoursMinutes := func(d time.Duration) string {
		d = d.Round(time.Minute)
		return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	}
	for _, want := range []string{
		"| " + seconds(outbox.CallTimeoutDefault) + " |",
		"`CallTimeout` + " + seconds(lease-outbox.CallTimeoutDefault) + " = " + seconds(lease) + " |",
		"| " + seconds(grace) + " |",
		"| " + seconds(interval) + " (leadership " + seconds(leadership) + ") |",
		"lease ends " + seconds(lease) + " after its claim",
		"from " + seconds(lease+grace) + " after the claim (lease + grace)",
		"every " + seconds(interval) + ": **" + seconds(lease+grace) + " to " + seconds(lease+grace+interval) + " after the claim**",
		"its leadership lasts " + seconds(leadership) + " from its last renewal, at most " + seconds(interval) + " before the crash",
		"at most " + seconds(interval) + " later",
		"**at most " + seconds(max(lease+grace, leadership)+interval) + " after the crash**",
		"The " + strconv.Itoa(dispatcher.MaxAttemptsDefault) + "th attempt starts " + hoursMinutes(backoffMin) + " to " + hoursMinutes(backoffMax) + " after the first",
	} {
		require.Contains(t, section, want)
	}
}
