package outbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// addFuzzSeeds seeds a corpus with the RFC 8785 test inputs and a few edge
// cases.
func addFuzzSeeds(f *testing.F) {
	f.Helper()

	inputs, err := filepath.Glob(filepath.Join("testdata", "jcs", "input", "*.json"))
	require.NoError(f, err)
	for _, input := range inputs {
		data, err := os.ReadFile(input)
		require.NoError(f, err)
		f.Add(data)
	}
	for _, seed := range []string{
		`{"order":8842,"amount":42.00,"currency":"EUR"}`,
		`[1e21,1e-7,-0,0.1,9007199254740993,4.2e1]`,
		`"\ud83d\ude02\u2028\/\u0000"`,
		`{"a":1,"a":2}`,
		`"\ud800"`,
		"\"\xff\"",
		`{"":{"":[[]]}}`,
		`1 2`,
	} {
		f.Add([]byte(seed))
	}
}

// FuzzCanonicalize checks, for any input that canonicalises, that the output
// is a fixed point, is valid JSON, and means what the input means.
func FuzzCanonicalize(f *testing.F) {
	addFuzzSeeds(f)

	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(json.RawMessage(data))
		if err != nil {
			require.ErrorIs(t, err, ErrNotCanonical)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON %q", data)
		require.True(t, json.Valid(out), "produced invalid JSON %q", out)

		again, err := Canonicalize(json.RawMessage(out))
		require.NoError(t, err)
		require.Equal(t, string(out), string(again))

		var in, canon any
		require.NoError(t, json.Unmarshal(data, &in))
		require.NoError(t, json.Unmarshal(out, &canon))
		require.True(t, reflect.DeepEqual(in, canon), "%q means something else than %q", out, data)

		// Through a Go value, the same canonical bytes.
		viaGo, err := Canonicalize(in)
		require.NoError(t, err)
		require.Equal(t, string(out), string(viaGo))
	})
}

// FuzzDeriveKeyRespelling checks that the key of any argument text that keys
// accept equals the key of its canonical form, a respelling of it.
func FuzzDeriveKeyRespelling(f *testing.F) {
	addFuzzSeeds(f)

	f.Fuzz(func(t *testing.T, data []byte) {
		call := Call{RunID: "run", Step: 1, Tool: "fuzz", Args: json.RawMessage(data)}
		key, err := DeriveKey(call)
		if err != nil {
			require.ErrorIs(t, err, ErrNotCanonical)
			return
		}
		canonical, err := Canonicalize(json.RawMessage(data))
		require.NoError(t, err)
		call.Args = json.RawMessage(canonical)
		again, err := DeriveKey(call)
		require.NoError(t, err)
		require.Equal(t, key, again)
	})
}
