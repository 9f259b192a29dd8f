package store

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tableName finds a name of pgonce's tables in SQL text; a name followed by
// a dot qualifies a column and needs no marker.
var tableName = regexp.MustCompile(`\bpgonce_[a-z_]+\b`)

// unmarkedTables returns, for each statement of a queries/ file, the lines
// that name a pgonce table without the schema marker in front.
func unmarkedTables(sqlText string) []string {
	var found []string
	for number, line := range strings.Split(sqlText, "\n") {
		code, _, _ := strings.Cut(line, "--")
		for _, loc := range tableName.FindAllStringIndex(code, -1) {
			if loc[1] < len(code) && code[loc[1]] == '.' {
				continue // a column qualifier: pgonce_key.key
			}
			if strings.HasSuffix(code[:loc[0]], schemaMarker) {
				continue
			}
			found = append(found, strings.TrimSpace(line)+" (line "+strconv.Itoa(number+1)+")")
		}
	}
	return found
}

func TestQueriesMarkEveryTable(t *testing.T) {
	t.Parallel()

	t.Run("EveryQueryFileIsMarked", func(t *testing.T) {
		t.Parallel()

		files, err := filepath.Glob("../../queries/*.sql")
		require.NoError(t, err)
		require.NotEmpty(t, files)
		for _, file := range files {
			text, err := os.ReadFile(file)
			require.NoError(t, err)
			require.Contains(t, string(text), schemaMarker, file)
			require.Empty(t, unmarkedTables(string(text)), "%s names pgonce tables without %q", file, schemaMarker)
		}
	})

	t.Run("CatchesAnUnmarkedTable", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name string
			sql  string
		}{
			{"From", "SELECT pgonce_key.key\nFROM pgonce_key\nWHERE pgonce_key.key = @key::text;"},
			{"Join", "SELECT 1\nFROM /* TEMPLATE: schema */pgonce_key\nJOIN pgonce_resolution ON pgonce_resolution.key = pgonce_key.key;"},
			{"Update", "UPDATE pgonce_key\nSET state = 'open';"},
			{"InsertInto", "INSERT INTO pgonce_resolution (key) VALUES (@key::text);"},
			{"DeleteFrom", "DELETE FROM pgonce_key\nWHERE pgonce_key.key = @key::text;"},
			{"CommaJoin", "SELECT 1 FROM /* TEMPLATE: schema */pgonce_key, pgonce_resolution;"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				require.Len(t, unmarkedTables(tt.sql), 1)
			})
		}
	})

	t.Run("AcceptsMarkedTablesAndColumns", func(t *testing.T) {
		t.Parallel()

		sqlText := "-- a comment that names pgonce_key\nUPDATE /* TEMPLATE: schema */pgonce_key\nSET state = pgonce_key.state\nFROM /* TEMPLATE: schema */pgonce_resolution;"
		require.Empty(t, unmarkedTables(sqlText))
	})
}

func TestTemplateFillsTheSchema(t *testing.T) {
	t.Parallel()

	tpl := newTemplate("tenant_a")
	query := "SELECT pgonce_key.key FROM /* TEMPLATE: schema */pgonce_key JOIN /* TEMPLATE: schema */pgonce_resolution USING (key)"
	want := `SELECT pgonce_key.key FROM "tenant_a".pgonce_key JOIN "tenant_a".pgonce_resolution USING (key)`
	require.Equal(t, want, tpl.fill(query))
	require.Equal(t, want, tpl.fill(query), "the cached text")
}
