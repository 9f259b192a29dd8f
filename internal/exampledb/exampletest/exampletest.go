// Package exampletest builds and runs pgonce's runnable programs
// (examples/) in their tests, against the tests' database.
package exampletest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// Build builds the program in the current directory, as `go build` does
// (with the race detector when the test binary has it), and returns the
// path of the binary, which goes when tb ends.
func Build(tb testing.TB) string {
	tb.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		tb.Fatalf("the examples' tests build the programs with the go command, which is not on PATH: %v", err)
	}
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatalf("getwd: %v", err)
	}
	bin := filepath.Join(tb.TempDir(), filepath.Base(wd))
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(tb.Context(), goTool, append(args, ".")...) //nolint:gosec // the go command
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Command returns a command that runs the program bin with args against the
// tests' database: $DATABASE_URL is pgoncetest's URL, and
// $PGONCE_DATABASE_URL, which a program would read first, is empty.
// The command is killed if it still runs when tb ends.
func Command(tb testing.TB, bin string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.CommandContext(tb.Context(), bin, args...) //nolint:gosec // a program the test built
	cmd.Env = append(os.Environ(),
		exampledb.URLEnv+"=",
		exampledb.URLFallbackEnv+"="+pgoncetest.DatabaseURL(tb))
	return cmd
}

// Run runs the program bin with args against the tests' database, and
// returns what it printed on its standard output. It fails tb when the
// program fails, showing both outputs.
func Run(tb testing.TB, bin string, args ...string) string {
	tb.Helper()
	cmd := Command(tb, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), err, &stdout, &stderr)
	}
	if stderr.Len() > 0 {
		tb.Logf("%s wrote to stderr:\n%s", filepath.Base(bin), &stderr)
	}
	return stdout.String()
}

// RequireLines fails tb unless out has, in this order, a line matching each
// pattern (regular expressions, each matched anywhere in its line).
func RequireLines(tb testing.TB, out string, patterns ...string) {
	tb.Helper()
	lines := strings.Split(out, "\n")
	at := 0
	for _, pattern := range patterns {
		re := regexp.MustCompile(pattern)
		for at < len(lines) && !re.MatchString(lines[at]) {
			at++
		}
		if at == len(lines) {
			tb.Fatalf("no line matching %q (after the ones before it) in the output:\n%s", pattern, out)
		}
		at++
	}
}

// RequireSchemaGone fails tb if schema exists.
func RequireSchemaGone(tb testing.TB, schema string) {
	tb.Helper()
	var exists bool
	if err := pgoncetest.Pool(tb).QueryRow(tb.Context(),
		`SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		tb.Fatalf("look for schema %s: %v", schema, err)
	}
	if exists {
		tb.Fatalf("the program left schema %s behind", schema)
	}
}
