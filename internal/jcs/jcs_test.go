package jcs

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonicalizeNumberPolicy(t *testing.T) {
	t.Parallel()

	in := json.RawMessage(`{"b":9007199254740993,"a":4.50}`)

	out, err := Canonicalize(in, NumbersRounded)
	require.NoError(t, err)
	require.Equal(t, `{"a":4.5,"b":9007199254740992}`, string(out))

	_, err = Canonicalize(in, NumbersExact)
	var jerr *Error
	require.ErrorAs(t, err, &jerr)
	require.Equal(t, "$.b", jerr.Path)
	require.Contains(t, jerr.Reason, "would become 9007199254740992")
}

func TestStateOutputIsReused(t *testing.T) {
	t.Parallel()

	st := Get()
	defer st.Release()
	first, err := st.Canonicalize([]any{1, "x"}, NumbersExact)
	require.NoError(t, err)
	require.Equal(t, `[1,"x"]`, string(first))
	second, err := st.Canonicalize(map[string]any{"z": true, "a": nil}, NumbersExact)
	require.NoError(t, err)
	require.Equal(t, `{"a":null,"z":true}`, string(second))
}

func TestIsNumber(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		in   string
		want bool
	}{
		{"0", true}, {"-1.5e+3", true}, {"01", false}, {"1.", false}, {"", false}, {"1 ", false},
	} {
		require.Equal(t, tt.want, IsNumber([]byte(tt.in)), tt.in)
	}
}
