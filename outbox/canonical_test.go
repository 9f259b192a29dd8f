package outbox

import (
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/jcs"
)

func TestCanonicalizeRFC8785Vectors(t *testing.T) {
	t.Parallel()

	inputs, err := filepath.Glob(filepath.Join("testdata", "jcs", "input", "*.json"))
	require.NoError(t, err)
	require.Len(t, inputs, 6)

	for _, input := range inputs {
		name := strings.TrimSuffix(filepath.Base(input), ".json")
		t.Run(strings.ToUpper(name[:1])+name[1:], func(t *testing.T) {
			t.Parallel()

			in, err := os.ReadFile(input)
			require.NoError(t, err)
			want, err := os.ReadFile(filepath.Join("testdata", "jcs", "output", name+".json"))
			require.NoError(t, err)
			outhex, err := os.ReadFile(filepath.Join("testdata", "jcs", "outhex", name+".txt"))
			require.NoError(t, err)
			wantFromHex, err := hex.DecodeString(strings.Join(strings.Fields(string(outhex)), ""))
			require.NoError(t, err)
			require.Equal(t, want, wantFromHex)

			got, err := Canonicalize(json.RawMessage(in))
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))

			// []byte is JSON text too, and canonical output is a fixed point.
			got, err = Canonicalize(in)
			require.NoError(t, err)
			require.Equal(t, want, got)
			again, err := Canonicalize(got)
			require.NoError(t, err)
			require.Equal(t, want, again)

			// A Go value decoded from the input canonicalises the same way.
			var decoded any
			require.NoError(t, json.Unmarshal(in, &decoded))
			got, err = Canonicalize(decoded)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))
		})
	}
}

func TestCanonicalizeValues(t *testing.T) {
	t.Parallel()

	type refund struct {
		Order    int64   `json:"order"`
		Amount   float64 `json:"amount"`
		Currency string  `json:"currency"`
		Note     string  `json:"note,omitempty"`
		Internal string  `json:"-"`
	}

	for _, tt := range []struct {
		name string
		in   any
		want string
	}{
		{"Nil", nil, `null`},
		{"NilRawMessage", json.RawMessage(nil), `null`},
		{"GoStringIsAString", `{"a":1}`, `"{\"a\":1}"`},
		{"RawMessageIsText", json.RawMessage(` {"b":1, "a":[1.0, 2e0]} `), `{"a":[1,2],"b":1}`},
		{"Bool", true, `true`},
		{"Struct", refund{Order: 8842, Amount: 42.00, Currency: "EUR", Internal: "x"}, `{"amount":42,"currency":"EUR","order":8842}`},
		{"StructPointer", &refund{Order: 1, Amount: 0.5}, `{"amount":0.5,"currency":"","order":1}`},
		{"Map", map[string]any{"b": []any{1, "x", nil}, "a": map[string]string{"z": "<&>"}}, `{"a":{"z":"<&>"},"b":[1,"x",null]}`},
		{"JSONNumber", map[string]any{"n": json.Number("1E3")}, `{"n":1000}`},
		{"NestedRawMessage", map[string]any{"raw": json.RawMessage(`{"y":2,"x":1}`)}, `{"raw":{"x":1,"y":2}}`},
		{"NestedBytesAreBase64", map[string]any{"b": []byte("hi")}, `{"b":"aGk="}`},
		{"Float32", float32(0.1), `0.1`},
		{"NegativeZero", math.Copysign(0, -1), `0`},
		{"BigIntegerRounds", json.RawMessage(`9007199254740993`), `9007199254740992`},
		{"Underflow", json.RawMessage(`1e-400`), `0`},
		{"Escapes", json.RawMessage(`"\u0041\/\u00e9\u2028\u001F\b\"\\"`), "\"A/é\u2028\\u001f\\b\\\"\\\\\""},
		{"SurrogatePair", json.RawMessage(`"\ud83d\ude02"`), `"😂"`},
		{
			"ExponentRules", json.RawMessage(`[1e21,1e20,123e-9,0.000001,1E-7,-5e-324,1.7976931348623157e308]`),
			`[1e+21,100000000000000000000,1.23e-7,0.000001,1e-7,-5e-324,1.7976931348623157e+308]`,
		},
		{"UTF16Order", json.RawMessage(`{"\ufb33":1,"😂":2,"\u00f6":3}`), "{\"\u00f6\":3,\"\U0001F602\":2,\"\ufb33\":1}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := Canonicalize(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestCanonicalizeRefuses(t *testing.T) {
	t.Parallel()

	deep := strings.Repeat("[", CanonicalMaxDepth+1) + strings.Repeat("]", CanonicalMaxDepth+1)
	deepOK := strings.Repeat("[", CanonicalMaxDepth) + strings.Repeat("]", CanonicalMaxDepth)
	_, err := Canonicalize(json.RawMessage(deepOK))
	require.NoError(t, err)

	var deepGo any = []any{}
	for range CanonicalMaxDepth {
		deepGo = []any{deepGo}
	}

	large := json.RawMessage(`"` + strings.Repeat("x", CanonicalMaxBytes) + `"`)

	type withFloat struct {
		Items []struct {
			Amount float64 `json:"amount"`
		} `json:"items"`
	}
	structNaN := withFloat{Items: make([]struct {
		Amount float64 `json:"amount"`
	}, 3)}
	structNaN.Items[2].Amount = math.Inf(1)

	type withString struct {
		Name string
	}

	for _, tt := range []struct {
		name   string
		in     any
		path   string
		reason string
	}{
		{"NaN", map[string]any{"amount": math.NaN()}, "$.amount", "NaN"},
		{"PositiveInfinity", map[string]any{"items": []any{1, 2, math.Inf(1)}}, "$.items[2]", "+Inf"},
		{"NegativeInfinity", math.Inf(-1), "$", "-Inf"},
		{"InfinityInStruct", structNaN, "$.items[2].amount", "+Inf"},
		{"OutOfRange", json.RawMessage(`{"a":[1e400]}`), "$.a[0]", "out of float64 range"},
		{"NegativeOutOfRange", json.RawMessage(`-1e400`), "$", "out of float64 range"},
		{"InvalidUTF8GoString", map[string]any{"s": "a\xffb"}, "$.s", "invalid UTF-8"},
		{"InvalidUTF8InStruct", withString{Name: "\xc3"}, "$.Name", "invalid UTF-8"},
		{"InvalidUTF8GoName", map[string]any{"\xff": 1}, `$["\xff"]`, "invalid UTF-8 in member name"},
		{"InvalidUTF8Raw", json.RawMessage("{\"s\":\"a\xffb\"}"), "$.s", "invalid UTF-8"},
		{"EncodedSurrogateRaw", json.RawMessage("\"\xed\xa0\x80\""), "$", "invalid UTF-8"},
		{"LoneHighSurrogate", json.RawMessage(`{"s":"\ud800"}`), "$.s", `lone surrogate \ud800`},
		{"LoneLowSurrogate", json.RawMessage(`["\udc00x"]`), "$[0]", `lone surrogate \udc00`},
		{"HighSurrogateThenNonSurrogate", json.RawMessage(`"\ud800\u0041"`), "$", `lone surrogate \ud800`},
		{"DuplicateMember", json.RawMessage(`{"a":1,"a":2}`), "$.a", "duplicate member name"},
		{"DuplicateAfterUnescaping", json.RawMessage(`{"x":{"a":1,"\u0061":2}}`), "$.x.a", "duplicate member name"},
		{"TooDeep", json.RawMessage(deep), "$" + strings.Repeat("[0]", CanonicalMaxDepth), "nesting deeper than the limit of 128 levels"},
		{"TooDeepGo", []any{deepGo}, "$" + strings.Repeat("[0]", CanonicalMaxDepth), "nesting deeper"},
		{"TooLarge", large, "$", "larger than the limit"},
		{"Unterminated", json.RawMessage(`{`), "$", "not JSON"},
		{"NotJSON", json.RawMessage(`nope`), "$", "not JSON"},
		{"TrailingData", json.RawMessage(`1 2`), "$", "trailing data"},
		{"Empty", json.RawMessage(``), "$", "unexpected end of input"},
		{"LeadingZero", json.RawMessage(`[01]`), "$[0]", "not JSON"},
		{"BareDot", json.RawMessage(`{"a":1.}`), "$.a", "not JSON"},
		{"Control", json.RawMessage("\"a\nb\""), "$", "control character"},
		{"BadEscape", json.RawMessage(`"\x"`), "$", "invalid escape"},
		{"TrailingComma", json.RawMessage(`{"a":1,}`), "$", "not JSON"},
		{"WeirdName", json.RawMessage(`{"a b":[nul]}`), `$["a b"][0]`, "not JSON"},
		{"BadJSONNumber", json.Number("1.2.3"), "$", "not a JSON number"},
		{"BadNestedRawMessage", []any{json.RawMessage(`1,2`)}, "$[0]", "not a single JSON value"},
		{"UnsupportedType", map[string]any{"f": func() {}}, "$.f", "cannot marshal"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := Canonicalize(tt.in)
			require.Nil(t, got)
			require.ErrorIs(t, err, ErrNotCanonical)
			var nce *NotCanonicalError
			require.ErrorAs(t, err, &nce)
			require.Equal(t, tt.path, nce.Path)
			require.Contains(t, nce.Reason, tt.reason)
			require.Contains(t, err.Error(), tt.path)
		})
	}
}

func TestCanonicalizeOutputIsOwned(t *testing.T) {
	t.Parallel()

	first, err := Canonicalize(json.RawMessage(`{"b":1,"a":2}`))
	require.NoError(t, err)
	_, err = Canonicalize(json.RawMessage(`{"c":3,"d":4,"e":5}`))
	require.NoError(t, err)
	require.Equal(t, `{"a":2,"b":1}`, string(first))
}

func TestNotCanonicalErrorUnwrap(t *testing.T) {
	t.Parallel()

	_, err := Canonicalize(map[string]any{"c": make(chan int)})
	require.ErrorIs(t, err, ErrNotCanonical)
	var unsupported *json.UnsupportedTypeError
	require.ErrorAs(t, err, &unsupported)
	require.NotErrorIs(t, err, ErrInvalidCall)
}

// TestCanonicalLimitsAreTheEncoders checks that the documented limits are the
// ones the encoder enforces.
func TestCanonicalLimitsAreTheEncoders(t *testing.T) {
	t.Parallel()

	require.Equal(t, jcs.MaxDepth, CanonicalMaxDepth)
	require.Equal(t, jcs.MaxBytes, CanonicalMaxBytes)
}
