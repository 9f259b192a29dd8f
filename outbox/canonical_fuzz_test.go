package outbox

import (
	"bytes"
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

// FuzzDeriveKeyRespelling checks that one canonical value never has two
// keys: the key of any argument text that keys accept equals the key of
// its canonical form, of an indented spelling of it, and of the Go value it
// decodes to, for step and business calls alike.
func FuzzDeriveKeyRespelling(f *testing.F) {
	addFuzzSeeds(f)

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, call := range []Call{
			{RunID: "run", Step: 1, Tool: "fuzz", Args: json.RawMessage(data)},
			{Tenant: "acme", Key: "order-1", Tool: "fuzz", Args: json.RawMessage(data)},
		} {
			want, err := deriveCall(call, true)
			if err != nil {
				require.ErrorIs(t, err, ErrNotCanonical)
				return
			}
			canonical, err := Canonicalize(json.RawMessage(data))
			require.NoError(t, err)
			var indented bytes.Buffer
			require.NoError(t, json.Indent(&indented, data, "", "\t"))
			var decoded any
			require.NoError(t, json.Unmarshal(data, &decoded))

			for _, respelled := range []any{json.RawMessage(canonical), json.RawMessage(indented.Bytes()), decoded} {
				call.Args = respelled
				got, err := deriveCall(call, true)
				require.NoError(t, err)
				require.Equal(t, want.Key, got.Key, "two keys for %q", canonical)
				require.Equal(t, want.Fingerprint, got.Fingerprint, "two fingerprints for %q", canonical)
			}
		}
	})
}
