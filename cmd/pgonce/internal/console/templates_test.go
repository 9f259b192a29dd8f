package console_test

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"text/template/parse"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/cmd/pgonce/internal/console"
)

// ruleFuncs are the template functions that print text through the
// console's one rule for shown text (visible): show itself, and the
// functions built on it.
var ruleFuncs = []string{"show", "line", "args", "join"}

// formatFuncs are the template functions that print the console's own
// text for a value that holds none of a request's or the database's: a
// time, a duration, a key's start, a delivery or an outcome, a length.
var formatFuncs = []string{"time", "stamp", "precise", "ago", "short", "delivery", "outcome", "len"}

// typedPrints are the values templates print as they are, by what the
// action prints, and why that is safe: each is of a type that holds no
// text from a request or the database (a key, a state, a search field, a
// number, a duration, the CSRF token the console made). A file's name
// before the action limits it to that file ("." is a key or a state
// there).
var typedPrints = map[string]string{
	".Key": "outbox.Key", ".In.Key": "outbox.Key", ".Result.Key": "outbox.Key", "$key": "outbox.Key",
	"parts.html .": "outbox.Key (keyid)", "bulk.html .": "outbox.Key (the keys to change)",
	".State": "outbox.State", ".In.State": "outbox.State", ".Result.State": "outbox.State",
	".In.ExpiredFrom": "outbox.State", ".Outcome": "outbox.AttemptOutcome", "overview.html .": "outbox.State (the table's columns)",
	".Field": "outbox.SearchField", "$m": "outbox.SearchField",
	".Step": "int64", ".In.Step": "int64", ".Params.FromStep": "int64", ".Attempt": "int",
	".Attempts": "int", ".In.Attempts": "int", ".N": "int64", ".Changed": "int", ".Refresh": "int",
	".Max": "int", ".GapMax": "int", ".Keys": "int64 (keys of a run)", ".Size": "int",
	".Stats.Pending": "int64", ".Stats.InFlight": "int64", ".Stats.NeedsReview": "int64",
	".Stats.ExpiredLeases": "int64", ".Stats.Tombstones": "int64", ".SearchSpan": "time.Duration",
	"$csrf": "hex digits the console made",
}

// urlEscapers are html/template's escapers of a URL: they percent-encode
// every byte outside ASCII, so that no hidden character is printed raw.
var urlEscapers = []string{"_html_template_urlescaper", "_html_template_urlnormalizer", "_html_template_urlfilter"}

// TestTemplatesPrintTextThroughOneRule walks every action of every
// template that prints, in the context html/template escapes it for: in a
// URL, html/template percent-encodes it; anywhere else (page text, an
// attribute, an input's value, a text area) it must go through the rule
// (ruleFuncs), be a time or the like (formatFuncs), or be a value that
// holds no text (typedPrints). A template that printed request data or
// stored data raw would show its bidi and zero-width characters raw.
func TestTemplatesPrintTextThroughOneRule(t *testing.T) {
	t.Parallel()
	pages, err := console.Pages()
	require.NoError(t, err)

	// Every template file is parsed into some page.
	files, err := fs.Glob(os.DirFS("templates"), "*.html")
	require.NoError(t, err)
	parsed := map[string]bool{}

	// An action is escaped in the pages that reach its template (in a
	// copy of the template for each context it is reached in); it is
	// checked there.
	type site struct {
		action   string
		escaped  bool
		problems []string
	}
	sites := map[string]*site{}
	for name, page := range pages {
		// html/template escapes a page on its first execution, adding its
		// escapers to every action it reaches; an empty page fails to
		// execute, once escaped.
		_ = page.Execute(io.Discard, nil)
		for _, tmpl := range page.Templates() {
			if tmpl.Tree == nil || tmpl.Tree.Root == nil {
				continue
			}
			file := tmpl.Tree.ParseName
			parsed[file] = true
			walkActions(tmpl.Tree.Root, func(action *parse.ActionNode) {
				id := fmt.Sprintf("%s:%d", file, action.Position())
				s := sites[id]
				if s == nil {
					s = &site{action: file + ": " + action.String()}
					sites[id] = s
				}
				escaped, problem := printProblem(file, action)
				if escaped {
					s.escaped = true
					if problem != "" {
						s.problems = append(s.problems, name+": "+file+": "+problem)
					}
				}
			})
		}
	}
	var problems []string
	for _, s := range sites {
		if !s.escaped {
			problems = append(problems, s.action+" is reached by no page")
		}
		problems = append(problems, s.problems...)
	}
	slices.Sort(problems)
	require.Empty(t, problems, "templates print text around the rule (show it with show, or list a value that holds no text in typedPrints)")
	require.Greater(t, len(sites), 100, "the walk reached the actions")
	for _, file := range files {
		require.True(t, parsed[file], "%s is parsed into no page", file)
	}
}

// walkActions calls f with every action under node that prints: not a
// variable's declaration.
func walkActions(node parse.Node, f func(*parse.ActionNode)) {
	switch node := node.(type) {
	case *parse.ListNode:
		if node == nil {
			return
		}
		for _, n := range node.Nodes {
			walkActions(n, f)
		}
	case *parse.ActionNode:
		if len(node.Pipe.Decl) == 0 {
			f(node)
		}
	case *parse.IfNode:
		walkActions(node.List, f)
		walkActions(node.ElseList, f)
	case *parse.RangeNode:
		walkActions(node.List, f)
		walkActions(node.ElseList, f)
	case *parse.WithNode:
		walkActions(node.List, f)
		walkActions(node.ElseList, f)
	}
}

// printProblem reports whether html/template escaped an action that
// prints, and, if it did, says what is wrong with it or returns "".
func printProblem(file string, action *parse.ActionNode) (escaped bool, problem string) {
	var own []*parse.CommandNode
	inURL := false
	for _, cmd := range action.Pipe.Cmds {
		if id, ok := cmd.Args[0].(*parse.IdentifierNode); ok && strings.HasPrefix(id.Ident, "_html_template_") {
			escaped = true
			inURL = inURL || slices.Contains(urlEscapers, id.Ident)
			continue
		}
		own = append(own, cmd)
	}
	switch {
	case !escaped:
		return false, ""
	case inURL:
		return true, ""
	case len(own) == 0:
		return true, action.String() + " prints nothing of its own"
	}
	first := own[0]
	if id, ok := first.Args[0].(*parse.IdentifierNode); ok {
		if slices.Contains(ruleFuncs, id.Ident) || slices.Contains(formatFuncs, id.Ident) {
			return true, ""
		}
		return true, action.String() + " prints through " + id.Ident + ", which is not the rule"
	}
	if len(own) > 1 || len(first.Args) > 1 {
		return true, action.String() + " prints through a pipeline, not through the rule"
	}
	printed := first.Args[0].String()
	if _, ok := typedPrints[printed]; ok && printed != "." {
		return true, ""
	}
	if _, ok := typedPrints[file+" "+printed]; ok {
		return true, ""
	}
	return true, action.String() + " prints " + printed + " raw"
}

func TestVisibleReadsBack(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ typed, shown string }{
		{"acme\u202egnp.exe\u202c", "acme⟨U+202E⟩gnp.exe⟨U+202C⟩"},
		{"ord\u200b42\u2060\ufeff", "ord⟨U+200B⟩42⟨U+2060⟩⟨U+FEFF⟩"},
		{"soft\u00adhyphen \x1b[31m\x7f", "soft⟨U+00AD⟩hyphen ⟨U+001B⟩[31m⟨U+007F⟩"},
		{"tab\tline\nreturn\r", "tab\tline\nreturn\r"},
		{"tag \U000e0041", "tag ⟨U+E0041⟩"},
		{"plain, ünïcödé, 😀", "plain, ünïcödé, 😀"},
	} {
		require.Equal(t, tt.shown, console.Visible(tt.typed))
		require.Equal(t, tt.typed, console.FromVisible(tt.shown))
	}
	// Only what visible writes is read back.
	for _, s := range []string{"⟨U+0041⟩", "⟨U+202e⟩", "⟨U+202E", "⟨U+02E⟩", "⟨U+0202E⟩", "⟨U+⟩", "⟨U+110000⟩", "x⟨U+2028⟩"} {
		require.Equal(t, s, console.FromVisible(s))
	}
}

// TestBulkMaxIsDocumented keeps the console's page of the CLI reference
// saying how many keys a bulk action takes.
func TestBulkMaxIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../../docs/cli.md")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(doc)), " ")
	require.Contains(t, text, fmt.Sprintf("One action takes at most %d keys", console.BulkMax))
}
