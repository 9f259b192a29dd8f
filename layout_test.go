package pgonce_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const modulePath = "github.com/pgonce/pgonce"

// listPackages returns, for every package of the module matching pattern,
// the packages it lists under field (Imports or Deps), as `go list` reports
// them without test files.
func listPackages(t *testing.T, field string, pattern string) map[string][]string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-f",
		`{{.ImportPath}}{{range .`+field+`}} {{.}}{{end}}`, pattern).Output()
	require.NoError(t, err)
	pkgs := make(map[string][]string)
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkgs[fields[0]] = fields[1:]
	}
	return pkgs
}

func isInternal(pkg string) bool {
	return strings.HasPrefix(pkg, modulePath+"/internal/")
}

func isPublic(pkg string) bool {
	return (pkg == modulePath || strings.HasPrefix(pkg, modulePath+"/")) && !isInternal(pkg)
}

// TestMigrationsImportNothingInternal checks that the migrations package,
// which users run from their own tooling, depends on none of pgonce's
// internal packages, so that nothing below it can come to depend on it.
func TestMigrationsImportNothingInternal(t *testing.T) {
	t.Parallel()

	for pkg, deps := range listPackages(t, "Deps", "./migrations") {
		for _, dep := range deps {
			require.False(t, isInternal(dep) || dep == modulePath+"/outbox", "%s depends on %s", pkg, dep)
		}
	}
}

// internalAboveThePublicAPI are the internal packages that import a public
// package: test harnesses and example support, which build on the public
// API by design and which only tests import (TestTestMachineryOnlyInTests).
// Any other internal package sits beneath every public one.
var internalAboveThePublicAPI = map[string][]string{
	modulePath + "/internal/exampledb":             {modulePath + "/migrations"},
	modulePath + "/internal/faults":                {modulePath + "/outbox"},
	modulePath + "/internal/pgoncetest":            {modulePath + "/migrations"},
	modulePath + "/internal/pgoncetest/drivertest": {modulePath + "/outbox"},
}

// TestInternalImportsNoPublicPackage checks that imports point one way:
// public packages import internal ones, never the reverse, but for the
// listed exceptions.
func TestInternalImportsNoPublicPackage(t *testing.T) {
	t.Parallel()

	for pkg, imports := range listPackages(t, "Imports", "./internal/...") {
		for _, imp := range imports {
			if !isPublic(imp) {
				continue
			}
			require.True(t, slices.Contains(internalAboveThePublicAPI[pkg], imp),
				"%s imports the public package %s", pkg, imp)
		}
	}
}

// publicImports lists, for every public package of the library, the public
// packages it may import. The arrows point one way, `cmd` → `dispatcher`,
// `reconcile` → `outbox` → internal: the dispatcher and the reconciler are
// siblings that meet only through `outbox` and what lies beneath it (the
// reconcile engine both run is internal), and `outbox` imports neither. The
// packages over the public API import what they build on: the HTTP
// middleware stores httpprovider's response envelope, and oncetest drains
// with a dispatcher. The CLI and the examples, at the top, import anything.
// A new public package needs its line here.
var publicImports = map[string][]string{
	modulePath:                   nil,
	modulePath + "/migrations":   nil,
	modulePath + "/outbox":       {modulePath + "/migrations"},
	modulePath + "/dispatcher":   {modulePath + "/outbox"},
	modulePath + "/reconcile":    {modulePath + "/outbox"},
	modulePath + "/httpprovider": {modulePath + "/outbox"},
	modulePath + "/httpstatus":   {modulePath + "/outbox"},
	modulePath + "/telemetry":    {modulePath + "/outbox"},
	modulePath + "/toolcall":     {modulePath + "/outbox"},
	modulePath + "/idempotency":  {modulePath + "/outbox", modulePath + "/httpprovider"},
	modulePath + "/oncetest":     {modulePath + "/outbox", modulePath + "/dispatcher", modulePath + "/migrations"},
}

// isTop reports whether pkg sits above the library, free to import any of
// it: the CLI (with its own internal packages) and the examples.
func isTop(pkg string) bool {
	return strings.HasPrefix(pkg, modulePath+"/cmd/") || strings.HasPrefix(pkg, modulePath+"/examples/")
}

// TestPublicImportsPointOneWay checks the arrows between the public
// packages against publicImports: no public package imports another but
// those listed, so that neither `dispatcher` nor `reconcile` comes to
// import the other, and `outbox` neither.
func TestPublicImportsPointOneWay(t *testing.T) {
	t.Parallel()

	for pkg, imports := range listPackages(t, "Imports", "./...") {
		if !isPublic(pkg) || isTop(pkg) {
			continue
		}
		allowed, listed := publicImports[pkg]
		require.True(t, listed, "the public package %s is missing from publicImports", pkg)
		for _, imp := range imports {
			if isPublic(imp) {
				require.True(t, slices.Contains(allowed, imp), "%s imports the public package %s", pkg, imp)
			}
		}
	}
}

// extensionInternalImports lists, for every package that builds on the
// client from outside (the HTTP layers, telemetry, the agents' shared rule),
// the internal packages it may import: none of the storage or attempt
// machinery, only small shared helpers that carry no state of the client's.
// What an extension needs of the client (its errors, its checks such as
// [outbox.IsTransient]) the public API offers, as it does to users.
var extensionInternalImports = map[string][]string{
	modulePath + "/httpprovider": {modulePath + "/internal/header"},
	modulePath + "/httpstatus":   nil,
	modulePath + "/idempotency":  {modulePath + "/internal/header"},
	modulePath + "/telemetry":    {modulePath + "/internal/observe"},
	modulePath + "/toolcall":     nil,
}

// TestExtensionsUseThePublicAPI checks extensionInternalImports: an
// extension that reached beneath the public API for a check would tie
// itself to internals that users writing the same extension cannot see.
func TestExtensionsUseThePublicAPI(t *testing.T) {
	t.Parallel()

	for pkg, imports := range listPackages(t, "Imports", "./...") {
		allowed, extension := extensionInternalImports[pkg]
		if !extension {
			continue
		}
		for _, imp := range imports {
			if isInternal(imp) {
				require.True(t, slices.Contains(allowed, imp), "the extension %s imports %s", pkg, imp)
			}
		}
	}
}

// TestTestMachineryOnlyInTests checks that the internal packages allowed
// above the public API (internalAboveThePublicAPI) are test machinery: no
// library package depends on them, only tests, the runnable examples and
// other test machinery do.
func TestTestMachineryOnlyInTests(t *testing.T) {
	t.Parallel()

	machinery := func(pkg string) bool {
		for above := range internalAboveThePublicAPI {
			if pkg == above || strings.HasPrefix(pkg, above+"/") {
				return true
			}
		}
		return pkg == modulePath+"/internal/failover" || strings.HasPrefix(pkg, modulePath+"/examples/")
	}
	for pkg, deps := range listPackages(t, "Deps", "./...") {
		if machinery(pkg) {
			continue
		}
		for _, dep := range deps {
			_, above := internalAboveThePublicAPI[dep]
			require.False(t, above, "the library package %s depends on the test machinery %s", pkg, dep)
		}
	}
}

// TestVocabularyIsDefinedOnce checks that the delivery mode, the key state
// and the key prefix each have one definition in the library's code (outside
// tests and generated code): internal/store's, which outbox re-exports by
// alias.
func TestVocabularyIsDefinedOnce(t *testing.T) {
	t.Parallel()

	var deliveries, states, prefixes []string
	for _, file := range libraryFiles(t) {
		fset := token.NewFileSet()
		parsed, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		ast.Inspect(parsed, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeSpec:
				if n.Assign.IsValid() {
					return true // an alias names the type, it does not define it
				}
				switch n.Name.Name {
				case "Delivery":
					deliveries = append(deliveries, fset.Position(n.Pos()).String())
				case "State":
					states = append(states, fset.Position(n.Pos()).String())
				}
			case *ast.BasicLit:
				if n.Kind == token.STRING && strings.HasPrefix(strings.Trim(n.Value, "`\""), "k1_") {
					prefixes = append(prefixes, fset.Position(n.Pos()).String())
				}
			}
			return true
		})
	}
	require.Len(t, deliveries, 1, "types named Delivery: %v", deliveries)
	require.Len(t, states, 1, "types named State: %v", states)
	require.Len(t, prefixes, 1, "string literals starting with k1_: %v", prefixes)
}

// libraryFiles returns the module's hand-written, non-test Go files, the
// generated sqlc code and the modules beside the library left out.
func libraryFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if entry.IsDir() {
			if path != "." && isOtherModule(path) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		head, err := os.ReadFile(path)
		require.NoError(t, err)
		if generated.Match(head) {
			return nil
		}
		files = append(files, path)
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// generated matches the header Go's convention puts on generated files.
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// isOtherModule reports whether dir holds a module of its own (bench/, the
// agent adapters, telemetry's SDK tests) or testdata.
func isOtherModule(dir string) bool {
	if filepath.Base(dir) == "testdata" {
		return true
	}
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// libraryFileMaxLines is the most lines a hand-written library file may have.
const libraryFileMaxLines = 600

// TestNoLibraryFileIsTooLong keeps library files (not tests, not generated
// code) at most libraryFileMaxLines long: a longer one holds more than one
// job.
func TestNoLibraryFileIsTooLong(t *testing.T) {
	t.Parallel()

	for _, file := range libraryFiles(t) {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		lines := strings.Count(string(data), "\n")
		require.LessOrEqual(t, lines, libraryFileMaxLines, "%s has %d lines", file, lines)
	}
}

// TestNoInitFunction keeps the wiring visible: no library file has an init
// function, so that no package registers itself with another behind the
// import graph's back; what one package needs of another is passed when it
// is made.
func TestNoInitFunction(t *testing.T) {
	t.Parallel()

	for _, file := range libraryFiles(t) {
		fset := token.NewFileSet()
		parsed, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range parsed.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "init" {
				t.Errorf("%s has an init function", fset.Position(fn.Pos()))
			}
		}
	}
}
