package migrations_test

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/migrations"
)

const schemaMarker = "/* TEMPLATE: schema */"

// sqlToken is one token of a migration file: a word (keyword or
// identifier), a quoted identifier, the schema marker, or punctuation.
// Comments other than the marker and string literals are dropped.
type sqlToken struct {
	text   string
	line   int
	quoted bool // a "quoted identifier"
}

func (t sqlToken) isMarker() bool { return t.text == schemaMarker }

func (t sqlToken) isWord() bool {
	if t.quoted {
		return true
	}
	r := []rune(t.text)
	return len(r) > 0 && (unicode.IsLetter(r[0]) || r[0] == '_')
}

// tokenize splits SQL into tokens. Dollar quotes ($$ or $tag$) are dropped
// and their contents tokenized as SQL, so that a function body's table
// names are checked too.
func tokenize(sql string) []sqlToken {
	var tokens []sqlToken
	line := 1
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				end = len(sql) - i
			}
			i += end
		case strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i:], "*/")
			if end < 0 {
				end = len(sql) - i - 2
			}
			comment := sql[i : i+end+2]
			if comment == schemaMarker {
				tokens = append(tokens, sqlToken{text: comment, line: line})
			}
			line += strings.Count(comment, "\n")
			i += len(comment)
		case c == '\'':
			j := i + 1
			for j < len(sql) {
				if sql[j] == '\'' {
					if j+1 < len(sql) && sql[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			line += strings.Count(sql[i:min(j+1, len(sql))], "\n")
			i = j + 1
		case c == '"':
			j := i + 1
			for j < len(sql) && sql[j] != '"' {
				j++
			}
			tokens = append(tokens, sqlToken{text: sql[i+1 : min(j, len(sql))], line: line, quoted: true})
			i = j + 1
		case c == '$':
			j := i + 1
			for j < len(sql) && (sql[j] == '_' || unicode.IsLetter(rune(sql[j])) || unicode.IsDigit(rune(sql[j]))) {
				j++
			}
			if j < len(sql) && sql[j] == '$' {
				i = j + 1 // a dollar-quote delimiter
				continue
			}
			tokens = append(tokens, sqlToken{text: sql[i:j], line: line})
			i = j
		case c == '_' || unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)):
			j := i
			for j < len(sql) && (sql[j] == '_' || sql[j] == '$' || unicode.IsLetter(rune(sql[j])) || unicode.IsDigit(rune(sql[j]))) {
				j++
			}
			tokens = append(tokens, sqlToken{text: sql[i:j], line: line})
			i = j
		default:
			tokens = append(tokens, sqlToken{text: string(c), line: line})
			i++
		}
	}
	return tokens
}

// tablePositions are the keywords after which a relation name follows:
// CREATE/ALTER/DROP/COMMENT ON/LOCK TABLE, REFERENCES, CREATE INDEX … ON,
// CREATE TRIGGER … ON, INSERT INTO, DELETE FROM, UPDATE, FROM, JOIN,
// TRUNCATE, and DROP/ALTER INDEX (whose index lives in the table's schema).
var tablePositions = map[string]bool{
	"TABLE": true, "REFERENCES": true, "ON": true, "INTO": true, "FROM": true,
	"JOIN": true, "UPDATE": true, "TRUNCATE": true, "INDEX": true,
}

// modifiers may stand between a table-position keyword and the name.
var modifiers = map[string]bool{
	"IF": true, "NOT": true, "EXISTS": true, "ONLY": true, "CONCURRENTLY": true,
}

// keywords that may follow a table-position keyword where no name follows
// (ON DELETE, ON CONFLICT, ON UPDATE CASCADE, FOR UPDATE SKIP LOCKED, …).
var notNames = map[string]bool{
	"DELETE": true, "UPDATE": true, "INSERT": true, "CONFLICT": true, "CASCADE": true,
	"RESTRICT": true, "SET": true, "NO": true, "ACTION": true, "TABLE": true,
	"COLUMN": true, "INDEX": true, "SCHEMA": true, "FUNCTION": true, "TRIGGER": true,
	"SEQUENCE": true, "TYPE": true, "VIEW": true, "ON": true, "OF": true, "SKIP": true,
	"LOCKED": true, "NOWAIT": true, "SELECT": true, "LATERAL": true, "COMMIT": true,
	"ROWS": true, "DROP": true, "EACH": true, "ROW": true, "STATEMENT": true,
}

// unmarkedTables returns, as "line N: name", every relation name in a table
// position that is not written behind the schema marker, and every marker
// not followed at once by a name.
func unmarkedTables(sql string) []string {
	tokens := tokenize(sql)
	var problems []string
	// Whether each open parenthesis starts a subquery: FROM inside
	// extract(epoch FROM …) names no table.
	var subquery []bool
	createIndex := false
	for i := 0; i < len(tokens); i++ {
		tok := tokens[i]
		upper := strings.ToUpper(tok.text)
		switch {
		case tok.isMarker():
			if i+1 >= len(tokens) || !tokens[i+1].isWord() {
				problems = append(problems, fmt.Sprintf("line %d: marker not followed by a name", tok.line))
			}
			continue
		case tok.text == "(":
			next := ""
			if i+1 < len(tokens) {
				next = strings.ToUpper(tokens[i+1].text)
			}
			subquery = append(subquery, next == "SELECT" || next == "WITH")
			continue
		case tok.text == ")":
			if len(subquery) > 0 {
				subquery = subquery[:len(subquery)-1]
			}
			continue
		case tok.text == ";":
			createIndex = false
			continue
		}
		if tok.quoted || !tablePositions[upper] {
			continue
		}
		if upper == "FROM" && len(subquery) > 0 && !subquery[len(subquery)-1] {
			continue
		}
		if upper == "INDEX" {
			// CREATE [UNIQUE] INDEX name ON table: the index name takes the
			// table's schema and must not be qualified; its table is.
			prev := ""
			if i > 0 {
				prev = strings.ToUpper(tokens[i-1].text)
			}
			if prev == "CREATE" || prev == "UNIQUE" {
				createIndex = true
				continue
			}
		}
		if upper == "ON" && createIndex {
			createIndex = false
		}
		j := i + 1
		for j < len(tokens) && !tokens[j].quoted && modifiers[strings.ToUpper(tokens[j].text)] {
			j++
		}
		if j >= len(tokens) {
			continue
		}
		name := tokens[j]
		if name.isMarker() {
			continue
		}
		if !name.isWord() || (!name.quoted && notNames[strings.ToUpper(name.text)]) {
			continue
		}
		problems = append(problems, fmt.Sprintf("line %d: %s %s", name.line, tok.text, name.text))
	}
	return problems
}

func TestEveryTableNameHasTheSchemaMarker(t *testing.T) {
	t.Parallel()

	t.Run("EmbeddedFiles", func(t *testing.T) {
		t.Parallel()
		names, err := fs.Glob(migrations.FS, "*.sql")
		require.NoError(t, err)
		require.NotEmpty(t, names)
		for _, name := range names {
			body, err := migrations.FS.ReadFile(name)
			require.NoError(t, err)
			require.Contains(t, string(body), schemaMarker, name)
			require.Empty(t, unmarkedTables(string(body)), "%s names a table without %s", name, schemaMarker)
		}
	})

	t.Run("FindsPlantedUnmarkedNames", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name string
			sql  string
			want []string
		}{
			{"CreateTable", "CREATE TABLE pgonce_x (id int);", []string{"line 1: TABLE pgonce_x"}},
			{"CreateTableIfNotExists", "CREATE TABLE IF NOT EXISTS pgonce_x (id int);", []string{"line 1: TABLE pgonce_x"}},
			{"IndexTable", "CREATE INDEX pgonce_x_idx ON pgonce_x (id);", []string{"line 1: ON pgonce_x"}},
			{"UniqueIndexConcurrently", "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS i ON ONLY pgonce_x (id);", []string{"line 1: ON pgonce_x"}},
			{"ForeignKey", "CREATE TABLE " + schemaMarker + "a (k text REFERENCES pgonce_key (key) ON DELETE CASCADE);", []string{"line 1: REFERENCES pgonce_key"}},
			{"AlterTableConstraint", "ALTER TABLE ONLY pgonce_key ADD CONSTRAINT c FOREIGN KEY (k) REFERENCES " + schemaMarker + "b (k);", []string{"line 1: TABLE pgonce_key"}},
			{"DropTable", "-- +goose Down\nDROP TABLE IF EXISTS pgonce_x;", []string{"line 2: TABLE pgonce_x"}},
			{"DropIndex", "DROP INDEX pgonce_x_idx;", []string{"line 1: INDEX pgonce_x_idx"}},
			{"QuotedName", `DROP TABLE "pgonce_x";`, []string{"line 1: TABLE pgonce_x"}},
			{"LowerCaseKeywords", "create table anything (id int);", []string{"line 1: table anything"}},
			{"Backfill", "INSERT INTO pgonce_x SELECT * FROM pgonce_y;", []string{"line 1: INTO pgonce_x", "line 1: FROM pgonce_y"}},
			{"Update", "UPDATE pgonce_x SET a = 1;", []string{"line 1: UPDATE pgonce_x"}},
			{
				"TriggerAndFunctionBody", "CREATE TRIGGER t AFTER INSERT ON pgonce_x FOR EACH ROW EXECUTE FUNCTION f();\n" +
					"CREATE FUNCTION f() RETURNS trigger AS $$ BEGIN DELETE FROM pgonce_y; END $$ LANGUAGE plpgsql;",
				[]string{"line 1: ON pgonce_x", "line 2: FROM pgonce_y"},
			},
			{"DanglingMarker", "CREATE TABLE " + schemaMarker + " (id int);", []string{"line 1: marker not followed by a name"}},
			{"MarkedIsFine", "CREATE TABLE " + schemaMarker + "pgonce_x (id int REFERENCES " + schemaMarker + "pgonce_key (key) ON UPDATE CASCADE);\n" +
				"CREATE INDEX pgonce_x_idx ON " + schemaMarker + "pgonce_x (id) WHERE extract(epoch FROM now()) > 0;\n" +
				"COMMENT ON TABLE " + schemaMarker + "pgonce_x IS 'FROM pgonce_y';\n" +
				"DROP TABLE IF EXISTS " + schemaMarker + "pgonce_x;", nil},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				require.Equal(t, tt.want, unmarkedTables(tt.sql))
			})
		}
	})
}
