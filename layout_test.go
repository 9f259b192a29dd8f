package pgonce_test

import (
	"os/exec"
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
// package. The console is the operator console's server, a user of outbox
// as cmd/pgonce is; the others are test harnesses and example support,
// which build on the public API by design. Any other internal package sits
// beneath every public one.
var internalAboveThePublicAPI = map[string][]string{
	modulePath + "/internal/console":               {modulePath + "/outbox"},
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
