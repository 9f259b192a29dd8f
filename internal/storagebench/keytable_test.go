package storagebench_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// This file is the only one that knows the key table's columns: everything
// else goes through the public API. When a migration adds, drops or renames
// a column, change replicaColumns to match; TestReplicaReadsLikeItsTemplate
// and the scale benchmark fail, naming the columns, until it does.

// templateTable holds a copy of the finished keys that the scale benchmark
// replicates, in the fixture's schema, while the fixture is built.
const templateTable = "storagebench_template"

// replicaColumn fills one column of a replica.
type replicaColumn struct {
	name string
	// value is an SQL expression over t, the template row, and r.n, the
	// replica's number (from 1); empty for a digest column, which
	// replicaDigest fills according to its type.
	value string
}

// replicaShift moves every time of replica r.n that many seconds back, so
// that the timestamp indexes hold distinct values, as they would after
// keys that finished over hours, not within the seconds the templates
// took.
const replicaShift = `r.n * interval '1 second'`

// replicaColumns names every column of the key table with the value a
// replica gets: a new key and scope, well formed and distinct for every
// template and number, and the rest as the template row was left by its
// real finish.
var replicaColumns = []replicaColumn{
	{"key", ""},
	{"scope", ""},
	{"tenant", "t.tenant"},
	{"run_id", "t.run_id"},
	{"step", "t.step"},
	{"business_key", "t.business_key"},
	{"tool", "t.tool"},
	{"natural_id", "t.natural_id"},
	{"fingerprint", "t.fingerprint"},
	{"args", "t.args"},
	{"metadata", "t.metadata"},
	{"delivery", "t.delivery"},
	{"key_retention_ms", "t.key_retention_ms"},
	{"state", "t.state"},
	{"attempt", "t.attempt"},
	{"available_at", "t.available_at - " + replicaShift},
	{"lease_until", "t.lease_until - " + replicaShift},
	{"worker", "t.worker"},
	{"first_attempted_at", "t.first_attempted_at - " + replicaShift},
	{"ambiguous", "t.ambiguous"},
	{"response", "t.response"},
	{"failure", "t.failure"},
	{"last_error", "t.last_error"},
	{"created_at", "t.created_at - " + replicaShift},
	{"updated_at", "t.updated_at - " + replicaShift},
	{"completed_at", "t.completed_at - " + replicaShift},
	{"expires_at", "t.expires_at - " + replicaShift},
	{"forget_at", "t.forget_at - " + replicaShift},
	{"expired_state", "t.expired_state"},
}

// replicaDigest returns the value of column (key or scope) for replica r.n
// of template t, given the column's type, and the text form of that value
// as the public API spells it (outbox.Key: "k1_" and 64 lower-case hex
// digits; a scope: the hex digits). Stored as text, the column holds that
// text; stored as bytea, the 32-byte digest it spells.
func replicaDigest(column, dataType string) (value, text string, ok bool) {
	prefix := ""
	if column == "key" {
		prefix = `'k1_' || `
	}
	switch dataType {
	case "text":
		text = prefix + `encode(sha256(convert_to(t.` + column + ` || '/' || r.n, 'UTF8')), 'hex')`
		return text, text, true
	case "bytea":
		value = `sha256(t.` + column + ` || int8send(r.n))`
		return value, prefix + `encode(` + value + `, 'hex')`, true
	}
	return "", "", false
}

// replicaSQL is what the replicating statements need: the columns, the
// value of each, and the text form of a replica's key.
type replicaSQL struct {
	columns, values []string
	keyText         string
}

// replicaStatements fails tb unless replicaColumns names exactly the
// columns of schema's key table, and returns the values of a replica's
// columns for the types they have.
func replicaStatements(tb testing.TB, schema string) replicaSQL {
	tb.Helper()
	rows, err := pgoncetest.Pool(tb).Query(context.Background(), `SELECT
			column_name::text,
			data_type::text
		FROM information_schema.columns
		WHERE table_schema = $1
			AND table_name = $2`, schema, keyTable)
	require.NoError(tb, err)
	defer rows.Close()
	types := map[string]string{}
	for rows.Next() {
		var name, dataType string
		require.NoError(tb, rows.Scan(&name, &dataType))
		types[name] = dataType
	}
	require.NoError(tb, rows.Err())

	var missing, unknown []string
	for name := range types {
		if !slices.ContainsFunc(replicaColumns, func(c replicaColumn) bool { return c.name == name }) {
			missing = append(missing, name)
		}
	}
	var statement replicaSQL
	for _, c := range replicaColumns {
		dataType, ok := types[c.name]
		if !ok {
			unknown = append(unknown, c.name)
			continue
		}
		value := c.value
		if value == "" {
			var text string
			if value, text, ok = replicaDigest(c.name, dataType); !ok {
				tb.Fatalf("replicaDigest (keytable_test.go) cannot fill %s.%s of type %s", keyTable, c.name, dataType)
			}
			if c.name == "key" {
				statement.keyText = text
			}
		}
		statement.columns = append(statement.columns, c.name)
		statement.values = append(statement.values, value)
	}
	if len(missing) > 0 || len(unknown) > 0 {
		slices.Sort(missing)
		tb.Fatalf("replicaColumns (keytable_test.go) no longer matches %s: columns it does not fill: %v; "+
			"columns the table no longer has: %v", keyTable, missing, unknown)
	}
	return statement
}

// copyTemplates copies schema's key rows, the finished templates, into
// templateTable, whatever the key table's columns.
func copyTemplates(tb testing.TB, schema string) {
	tb.Helper()
	quoted := ident.Quote(schema)
	_, err := pgoncetest.Pool(tb).Exec(context.Background(), `CREATE TABLE `+quoted+`.`+ident.Quote(templateTable)+
		` AS SELECT * FROM `+quoted+`.`+ident.Quote(keyTable))
	require.NoError(tb, err)
}

// dropTemplates drops templateTable.
func dropTemplates(tb testing.TB, schema string) {
	tb.Helper()
	_, err := pgoncetest.Pool(tb).Exec(context.Background(), `DROP TABLE `+ident.Quote(schema)+`.`+ident.Quote(templateTable))
	require.NoError(tb, err)
}

// replicate inserts replicas numbered first to last of every template row:
// one statement, run inside PostgreSQL.
func replicate(tb testing.TB, statement replicaSQL, schema string, first, last int64) int64 {
	tb.Helper()
	quoted := ident.Quote(schema)
	tag, err := pgoncetest.Pool(tb).Exec(context.Background(), `INSERT INTO `+quoted+`.`+ident.Quote(keyTable)+` (
			`+strings.Join(statement.columns, ",\n\t\t\t")+`
		)
		SELECT
			`+strings.Join(statement.values, ",\n\t\t\t")+`
		FROM `+quoted+`.`+ident.Quote(templateTable)+` AS t
		CROSS JOIN generate_series($1::bigint, $2::bigint) AS r (n)`, first, last)
	require.NoError(tb, err)
	return tag.RowsAffected()
}

// sampleReplicaKeys returns count keys of replicas numbered 1 to copies,
// each of a random one of the templates and a random number.
func sampleReplicaKeys(tb testing.TB, statement replicaSQL, schema string, templates, copies int64, count int) []string {
	tb.Helper()
	// The lateral subquery refers to the outer rows, so that it draws a
	// number for each of them.
	rows, err := pgoncetest.Pool(tb).Query(context.Background(), `SELECT `+statement.keyText+`
		FROM `+ident.Quote(schema)+`.`+ident.Quote(templateTable)+` AS t
		CROSS JOIN generate_series(1, $2::bigint) AS g (i)
		CROSS JOIN LATERAL (
			SELECT 1 + floor(random() * $1::bigint)::bigint AS n
			WHERE g.i > 0 AND t.key IS NOT NULL
		) AS r
		ORDER BY random()
		LIMIT $3`, copies, (int64(count)+templates-1)/templates, count)
	require.NoError(tb, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(tb, err)
	return keys
}
