package outbox

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/jcs"
)

// keyVector is one entry of testdata/keys/v1.json at the repository root;
// KEYSPEC.md "Golden vectors" documents every field. A vector either has the
// expected canonical_args, key, scope and fingerprint, or the expected error.
type keyVector struct {
	Name string `json:"name"`
	Note string `json:"note"`
	Call struct {
		Tenant        string           `json:"tenant"`
		RunID         string           `json:"run_id"`
		Step          json.Number      `json:"step"`
		StepText      string           `json:"step_text"`
		Tool          string           `json:"tool"`
		ArgsJSON      *string          `json:"args_json"`
		ArgsGenerator []keyVectorPiece `json:"args_generator"`
		ArgsNative    *keyVectorNative `json:"args_native"`
		Key           string           `json:"key"`
		NaturalID     string           `json:"natural_id"`
	} `json:"call"`
	CanonicalArgs *string         `json:"canonical_args"`
	Key           string          `json:"key"`
	Scope         string          `json:"scope"`
	Fingerprint   string          `json:"fingerprint"`
	Error         *keyVectorError `json:"error"`
}

// keyVectorPiece is one piece of an args_generator: text, text repeated
// count times, or bytes in hex.
type keyVectorPiece struct {
	Text   *string `json:"text"`
	Repeat *string `json:"repeat"`
	Count  int     `json:"count"`
	Hex    *string `json:"hex"`
}

// keyVectorNative is a native (not JSON text) argument value: an integer or
// a double, each spelled as a string so that no JSON reader rounds it.
type keyVectorNative struct {
	Int   *string `json:"int"`
	Float *string `json:"float"`
}

// keyVectorError is the refusal a vector expects: its kind, and the JSON
// path (not_canonical) or call field (invalid_call) that Go names.
type keyVectorError struct {
	Kind  string `json:"kind"`
	Path  string `json:"path"`
	Field string `json:"field"`
}

// vectorField maps the Go field names of [InvalidCallError] to the vector
// file's call fields.
var vectorField = map[string]string{
	"Tenant":    "tenant",
	"RunID":     "run_id",
	"Step":      "step",
	"Tool":      "tool",
	"Key":       "key",
	"NaturalID": "natural_id",
}

func loadKeyVectors(t *testing.T) []keyVector {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "keys", "v1.json"))
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields() // a misspelt field must not silently test nothing
	var vectors []keyVector
	require.NoError(t, dec.Decode(&vectors))
	return vectors
}

// expandArgs returns the arguments of a vector's call as [Call.Args] takes
// them: JSON text for args_json and args_generator, a Go value for
// args_native.
func expandArgs(t *testing.T, vec keyVector) any {
	t.Helper()
	c := vec.Call
	sources := 0
	for _, set := range []bool{c.ArgsJSON != nil, c.ArgsGenerator != nil, c.ArgsNative != nil} {
		if set {
			sources++
		}
	}
	require.Equal(t, 1, sources, "exactly one of args_json, args_generator and args_native")

	switch {
	case c.ArgsJSON != nil:
		return json.RawMessage(*c.ArgsJSON)
	case c.ArgsGenerator != nil:
		var text []byte
		for _, piece := range c.ArgsGenerator {
			switch {
			case piece.Text != nil && piece.Repeat == nil && piece.Hex == nil && piece.Count == 0:
				text = append(text, *piece.Text...)
			case piece.Repeat != nil && piece.Text == nil && piece.Hex == nil && piece.Count > 0:
				text = append(text, strings.Repeat(*piece.Repeat, piece.Count)...)
			case piece.Hex != nil && piece.Text == nil && piece.Repeat == nil && piece.Count == 0:
				b, err := hex.DecodeString(*piece.Hex)
				require.NoError(t, err)
				text = append(text, b...)
			default:
				require.Failf(t, "bad args_generator piece", "%+v", piece)
			}
		}
		return json.RawMessage(text)
	default:
		n := c.ArgsNative
		require.NotEqual(t, n.Int != nil, n.Float != nil, "exactly one of int and float")
		if n.Int != nil {
			i, ok := new(big.Int).SetString(*n.Int, 10)
			require.True(t, ok, "int %q", *n.Int)
			switch {
			case i.IsInt64():
				return i.Int64()
			case i.IsUint64():
				return i.Uint64()
			default:
				return i // marshals as its decimal text
			}
		}
		switch *n.Float {
		case "NaN":
			return math.NaN()
		case "Infinity":
			return math.Inf(1)
		case "-Infinity":
			return math.Inf(-1)
		}
		require.True(t, jcs.IsNumber([]byte(*n.Float)), "float %q", *n.Float)
		f, err := strconv.ParseFloat(*n.Float, 64)
		require.NoError(t, err)
		return f
	}
}

// TestDeriveKeyGoldenVectors checks every vector of testdata/keys/v1.json,
// accepted and refused, so that the file cannot drift from the code.
func TestDeriveKeyGoldenVectors(t *testing.T) {
	t.Parallel()

	vectors := loadKeyVectors(t)
	require.GreaterOrEqual(t, len(vectors), 12)
	names := make(map[string]bool, len(vectors))
	for _, vec := range vectors {
		require.NotEmpty(t, vec.Name)
		require.False(t, names[vec.Name], "duplicate vector name %s", vec.Name)
		names[vec.Name] = true
	}

	for _, vec := range vectors {
		t.Run(vec.Name, func(t *testing.T) {
			t.Parallel()

			// step_text is there for readers whose JSON numbers are
			// doubles: it must be given, and agree, exactly when step is
			// beyond 2^53-1.
			step, ok := new(big.Int).SetString(vec.Call.Step.String(), 10)
			require.True(t, ok, "step %q is not an integer", vec.Call.Step)
			if new(big.Int).Abs(step).Cmp(big.NewInt(1<<53-1)) > 0 {
				require.Equal(t, step.String(), vec.Call.StepText, "step_text")
			} else {
				require.Empty(t, vec.Call.StepText, "step_text is only for steps beyond 2^53-1")
			}

			args := expandArgs(t, vec)
			require.NotEqual(t, vec.Error != nil, vec.CanonicalArgs != nil, "exactly one of error and canonical_args")

			if !step.IsInt64() {
				// A Call cannot hold the step at all.
				require.NotNil(t, vec.Error, "step outside int64 must be refused")
				require.Equal(t, "invalid_call", vec.Error.Kind)
				require.Equal(t, "step", vec.Error.Field)
				return
			}
			call := Call{
				Tenant:    vec.Call.Tenant,
				RunID:     vec.Call.RunID,
				Step:      step.Int64(),
				Tool:      vec.Call.Tool,
				Args:      args,
				Key:       vec.Call.Key,
				NaturalID: vec.Call.NaturalID,
			}

			if vec.Error != nil {
				require.Empty(t, vec.Key+vec.Scope+vec.Fingerprint, "a refused vector has no key, scope or fingerprint")
				key, err := DeriveKey(call)
				require.Empty(t, key)
				requireVectorError(t, *vec.Error, err)
				_, err = derive(call)
				requireVectorError(t, *vec.Error, err)
				return
			}

			d, err := derive(call)
			require.NoError(t, err)
			require.Equal(t, *vec.CanonicalArgs, string(d.Args))
			require.Equal(t, vec.Key, string(d.Key))
			require.Equal(t, vec.Scope, d.Scope)
			require.Equal(t, vec.Fingerprint, d.Fingerprint)

			key, err := DeriveKey(call)
			require.NoError(t, err)
			require.Equal(t, d.Key, key)

			parsed, err := ParseKey(vec.Key)
			require.NoError(t, err)
			require.Equal(t, key, parsed)

			// What keys accept, plain RFC 8785 writes the same way.
			canonical, err := Canonicalize(args)
			require.NoError(t, err)
			require.Equal(t, *vec.CanonicalArgs, string(canonical))
		})
	}
}

func requireVectorError(t *testing.T, want keyVectorError, err error) {
	t.Helper()
	switch want.Kind {
	case "not_canonical":
		require.ErrorIs(t, err, ErrNotCanonical)
		require.NotErrorIs(t, err, ErrInvalidCall)
		var nce *NotCanonicalError
		require.ErrorAs(t, err, &nce)
		require.Equal(t, want.Path, nce.Path)
		require.Empty(t, want.Field)
	case "invalid_call":
		require.ErrorIs(t, err, ErrInvalidCall)
		require.NotErrorIs(t, err, ErrNotCanonical)
		var ice *InvalidCallError
		require.ErrorAs(t, err, &ice)
		require.Equal(t, want.Field, vectorField[ice.Field], "field %s", ice.Field)
		require.Empty(t, want.Path)
	default:
		require.Failf(t, "unknown error kind", "%q", want.Kind)
	}
}

// keyspecWords are the words KEYSPEC.md writes in backquotes that look like
// vector names but name something else.
var keyspecWords = map[string]bool{
	"Call": true, "Decimal": true, "ErrInvalidCall": true, "ErrNotCanonical": true,
	"Infinity": true, "MarshalJSON": true, "NaN": true, "None": true,
	"TestDeriveKeyGoldenVectors": true, "TestES6NumberSerialization": true, "TextEncoder": true,
}

// TestKeyspecCitesVectors checks that every vector KEYSPEC.md cites by name
// is in testdata/keys/v1.json, so that a reader who looks a rule's vector up
// finds it.
func TestKeyspecCitesVectors(t *testing.T) {
	t.Parallel()

	names := make(map[string]bool)
	for _, vec := range loadKeyVectors(t) {
		names[vec.Name] = true
	}
	spec, err := os.ReadFile(filepath.Join("..", "KEYSPEC.md"))
	require.NoError(t, err)
	cited := 0
	for _, m := range regexp.MustCompile("`([A-Z][A-Za-z0-9]+)`").FindAllStringSubmatch(string(spec), -1) {
		if keyspecWords[m[1]] {
			continue
		}
		require.True(t, names[m[1]], "KEYSPEC.md cites vector %s, which testdata/keys/v1.json lacks", m[1])
		cited++
	}
	require.Positive(t, cited)
}
