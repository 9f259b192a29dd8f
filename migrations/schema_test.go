package migrations

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateSchema(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name   string
		schema string
		// inMessage must appear in the error.
		inMessage string
	}{
		{"Empty", "", "must not be empty"},
		{"TooLong", strings.Repeat("a", schemaMaxLen+1), "longer than 48 bytes"},
		{"Huge", strings.Repeat("x", 10_000), "(10000 bytes)"},
		{"HugeWithSQL", `x"; DROP TABLE users; --` + strings.Repeat("é", 5000), "(10024 bytes)"},
		{"UpperCase", "Pgonce", "must match"},
		{"Reserved", "pg_once", "pg_ prefix"},
		{"NUL", "pgonce\x00", "must match"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateSchema(tt.schema)
			require.ErrorIs(t, err, ErrInvalidSchema)
			require.Contains(t, err.Error(), tt.inMessage)
			// A name is quoted with at most quoteMaxBytes of it.
			require.Less(t, len(err.Error()), 200, "message too long: %d bytes", len(err.Error()))
		})
	}

	t.Run("Accepted", func(t *testing.T) {
		t.Parallel()
		for _, schema := range []string{"pgonce", "_x", "a1_b2", strings.Repeat("a", schemaMaxLen)} {
			require.NoError(t, ValidateSchema(schema), schema)
		}
	})

	t.Run("QuotesCutAtCharacterBoundary", func(t *testing.T) {
		t.Parallel()
		err := ValidateSchema("a" + strings.Repeat("é", 100))
		require.ErrorIs(t, err, ErrInvalidSchema)
		require.Contains(t, err.Error(), `"a`+strings.Repeat("é", 31)+`"… (201 bytes)`)
	})
}
