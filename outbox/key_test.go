package outbox

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func refundCall() Call {
	return Call{
		RunID: "run-1",
		Step:  3,
		Tool:  "refund",
		Args:  json.RawMessage(`{"order":8842,"amount":42,"currency":"EUR"}`),
	}
}

func mustDerive(t *testing.T, c Call) derivation {
	t.Helper()
	d, err := derive(c)
	require.NoError(t, err)
	return d
}

func TestDeriveKeyInvariants(t *testing.T) {
	t.Parallel()

	with := func(mutate func(*Call)) Call {
		c := refundCall()
		mutate(&c)
		return c
	}
	base := mustDerive(t, refundCall())

	t.Run("KeyFormat", func(t *testing.T) {
		t.Parallel()
		require.Len(t, string(base.Key), KeyLength)
		require.True(t, strings.HasPrefix(string(base.Key), KeyPrefix))
		require.Len(t, base.Scope, 64)
		require.Len(t, base.Fingerprint, 64)
		require.Equal(t, string(base.Key), base.Key.String())
	})

	for _, tt := range []struct {
		name string
		args any
	}{
		{"ReorderedMembers", json.RawMessage(`{"currency":"EUR","amount":42,"order":8842}`)},
		{"RespelledNumbers", json.RawMessage(`{"order":8.842e3,"amount":42.0,"currency":"EUR"}`)},
		{"RespelledNumbersExponent", json.RawMessage(`{"order":8842.000,"amount":4.2E+1,"currency":"EUR"}`)},
		{"EscapedUnicode", json.RawMessage(`{"\u006frder":8842,"amount":42,"currency":"\u0045\u0055R"}`)},
		{"Whitespace", json.RawMessage(" {\n\t\"order\" : 8842 ,\r\"amount\":42, \"currency\":\"EUR\" }\n")},
		{"GoMap", map[string]any{"order": 8842, "amount": 42.0, "currency": "EUR"}},
		{"GoStruct", struct {
			Currency string  `json:"currency"`
			Order    int     `json:"order"`
			Amount   float64 `json:"amount"`
		}{"EUR", 8842, 42}},
		{"Bytes", []byte(`{"order":8842,"amount":42,"currency":"EUR"}`)},
	} {
		t.Run("SameKey"+tt.name, func(t *testing.T) {
			t.Parallel()
			d := mustDerive(t, with(func(c *Call) { c.Args = tt.args }))
			require.Equal(t, base, d)
		})
	}

	t.Run("LiteralAndEscapedUnicodeSameKey", func(t *testing.T) {
		t.Parallel()
		literal := mustDerive(t, with(func(c *Call) { c.Args = json.RawMessage(`{"to":"zoë 😂 €"}`) }))
		escaped := mustDerive(t, with(func(c *Call) { c.Args = json.RawMessage(`{"to":"zo\u00eb \ud83d\ude02 \u20AC"}`) }))
		goValue := mustDerive(t, with(func(c *Call) { c.Args = map[string]string{"to": "zoë 😂 €"} }))
		require.Equal(t, literal, escaped)
		require.Equal(t, literal, goValue)
	})

	t.Run("NaturalIDDoesNotChangeKey", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, base, mustDerive(t, with(func(c *Call) { c.NaturalID = "refund-8842" })))
	})

	for _, tt := range []struct {
		name       string
		mutate     func(*Call)
		sameScope  bool
		sameFinger bool
	}{
		{"Tenant", func(c *Call) { c.Tenant = "acme" }, false, true},
		{"RunID", func(c *Call) { c.RunID = "run-2" }, false, true},
		{"Step", func(c *Call) { c.Step = 4 }, false, true},
		{"Tool", func(c *Call) { c.Tool = "refund_v2" }, true, false},
		{"Args", func(c *Call) { c.Args = json.RawMessage(`{"order":8842,"amount":43,"currency":"EUR"}`) }, true, false},
		{"ArgsType", func(c *Call) { c.Args = json.RawMessage(`{"order":"8842","amount":42,"currency":"EUR"}`) }, true, false},
		{"BusinessKey", func(c *Call) { c.Key = "order-8842" }, false, true},
	} {
		t.Run("DifferentKey"+tt.name, func(t *testing.T) {
			t.Parallel()
			d := mustDerive(t, with(tt.mutate))
			require.NotEqual(t, base.Key, d.Key)
			require.Equal(t, tt.sameScope, base.Scope == d.Scope, "scope")
			require.Equal(t, tt.sameFinger, base.Fingerprint == d.Fingerprint, "fingerprint")
		})
	}

	t.Run("FramingIsUnambiguous", func(t *testing.T) {
		t.Parallel()
		pairs := [][2]Call{
			{{Tenant: "ab", RunID: "c", Tool: "t"}, {Tenant: "a", RunID: "bc", Tool: "t"}},
			{{Tenant: "", RunID: "ab", Tool: "t"}, {Tenant: "a", RunID: "b", Tool: "t"}},
			{{RunID: "r1", Step: 1, Tool: "t"}, {RunID: "r", Step: 11, Tool: "t"}},
			{{Tenant: "a", Tool: "t", Key: "bc"}, {Tenant: "ab", Tool: "t", Key: "c"}},
			{{Tenant: "t", Key: "k", Tool: "x"}, {Tenant: "t", Key: "kx", Tool: "x"}},
			{{RunID: "r", Tool: "t", Args: "x"}, {RunID: "r", Tool: "t", Args: json.RawMessage(`"x"`), Tenant: "\x01"}},
		}
		for _, pair := range pairs {
			a, b := mustDerive(t, pair[0]), mustDerive(t, pair[1])
			require.NotEqual(t, a.Key, b.Key, "%+v vs %+v", pair[0], pair[1])
			require.NotEqual(t, a.Scope, b.Scope, "%+v vs %+v", pair[0], pair[1])
		}
	})

	t.Run("BusinessKeyIgnoresRunIDAndStep", func(t *testing.T) {
		t.Parallel()
		a := mustDerive(t, Call{Tenant: "acme", Tool: "refund", Key: "order-8842", RunID: "run-1", Step: 3, Args: map[string]any{"amount": 42}})
		b := mustDerive(t, Call{Tenant: "acme", Tool: "refund", Key: "order-8842", Step: 99, Args: map[string]any{"amount": 42}})
		require.Equal(t, a, b)
	})

	t.Run("BusinessKeyArgsChangeFingerprintNotKey", func(t *testing.T) {
		t.Parallel()
		a := mustDerive(t, Call{Tool: "refund", Key: "order-8842", Args: map[string]any{"amount": 42}})
		b := mustDerive(t, Call{Tool: "refund", Key: "order-8842", Args: map[string]any{"amount": 43}})
		require.Equal(t, a.Key, b.Key)
		require.Equal(t, a.Scope, b.Scope)
		require.NotEqual(t, a.Fingerprint, b.Fingerprint)
	})

	t.Run("BusinessKeyOtherToolSameScope", func(t *testing.T) {
		t.Parallel()
		a := mustDerive(t, Call{Tool: "refund", Key: "order-8842"})
		b := mustDerive(t, Call{Tool: "charge", Key: "order-8842"})
		require.NotEqual(t, a.Key, b.Key)
		require.Equal(t, a.Scope, b.Scope)
	})

	t.Run("StepAndBusinessNeverCollide", func(t *testing.T) {
		t.Parallel()
		a := mustDerive(t, Call{Tool: "t", RunID: "x"})
		b := mustDerive(t, Call{Tool: "t", Key: "x"})
		require.NotEqual(t, a.Key, b.Key)
		require.NotEqual(t, a.Scope, b.Scope)
	})

	t.Run("NilArgsAreNull", func(t *testing.T) {
		t.Parallel()
		a := mustDerive(t, Call{Tool: "t", RunID: "x"})
		b := mustDerive(t, Call{Tool: "t", RunID: "x", Args: json.RawMessage(" null ")})
		require.Equal(t, a, b)
		require.Equal(t, "null", string(a.Args))
	})
}

func TestDeriveKeyRefusesArgs(t *testing.T) {
	t.Parallel()

	deep := json.RawMessage(strings.Repeat(`{"a":`, CanonicalMaxDepth+1) + "1" + strings.Repeat("}", CanonicalMaxDepth+1))

	for _, tt := range []struct {
		name   string
		args   any
		path   string
		reason string
	}{
		{"NaN", map[string]any{"amount": math.NaN()}, "$.amount", "NaN"},
		{"PositiveInfinity", map[string]any{"amount": math.Inf(1)}, "$.amount", "+Inf"},
		{"NegativeInfinity", map[string]any{"amount": math.Inf(-1)}, "$.amount", "-Inf"},
		{"BigIntegerLiteral", json.RawMessage(`{"items":[1,2,{"amount":9007199254740993}]}`), "$.items[2].amount", "would become 9007199254740992"},
		{"BigGoInt64", map[string]any{"id": int64(9007199254740993)}, "$.id", "would become"},
		{"BigGoUint64", map[string]any{"id": uint64(math.MaxUint64)}, "$.id", "would become"},
		{"TwoPow60Literal", json.RawMessage(`{"id":1152921504606846976}`), "$.id", "would become 1152921504606847000"},
		{"TwoPow60GoInt64", map[string]any{"id": int64(1 << 60)}, "$.id", "would become 1152921504606847000"},
		{"OverPreciseDecimal", json.RawMessage(`[0.1000000000000000055511151231257827]`), "$[0]", "would become 0.1"},
		{"Underflow", json.RawMessage(`{"x":1e-400}`), "$.x", "would become 0"},
		{"OutOfRange", json.RawMessage(`{"x":1e400}`), "$.x", "out of float64 range (it rounds to +Inf)"},
		{"InvalidUTF8String", map[string]any{"s": "\xff"}, "$.s", "invalid UTF-8"},
		{"InvalidUTF8Raw", json.RawMessage("[\"\xff\"]"), "$[0]", "invalid UTF-8"},
		{"LoneSurrogate", json.RawMessage(`{"s":"\ud800"}`), "$.s", "lone surrogate"},
		{"DuplicateMembers", json.RawMessage(`{"a":1,"a":2}`), "$.a", "duplicate member name"},
		{"TooDeep", deep, "$" + strings.Repeat(".a", CanonicalMaxDepth), "nesting deeper"},
		{"TooLarge", json.RawMessage(`"` + strings.Repeat("x", CanonicalMaxBytes) + `"`), "$", "larger than the limit"},
		{"Unterminated", json.RawMessage(`{`), "$", "not JSON"},
		{"NotJSON", json.RawMessage(`nope`), "$", "not JSON"},
		{"TrailingData", json.RawMessage(`1 2`), "$", "trailing data"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			c := refundCall()
			c.Args = tt.args
			key, err := DeriveKey(c)
			require.Empty(t, key)
			require.ErrorIs(t, err, ErrNotCanonical)
			var nce *NotCanonicalError
			require.ErrorAs(t, err, &nce)
			require.Equal(t, tt.path, nce.Path)
			require.Contains(t, nce.Reason, tt.reason)

			_, err = derive(c)
			require.ErrorIs(t, err, ErrNotCanonical)
		})
	}

	t.Run("CanonicalizeRoundsWhatKeysRefuse", func(t *testing.T) {
		t.Parallel()
		got, err := Canonicalize(json.RawMessage(`{"amount":9007199254740993}`))
		require.NoError(t, err)
		require.JSONEq(t, `{"amount":9007199254740992}`, string(got))
	})

	t.Run("ExactNumbersAccepted", func(t *testing.T) {
		t.Parallel()
		for _, lit := range []string{
			"0", "-0", "0.0", "0e10", "1", "1.0", "1.000e0", "10e-1", "4.2e1", "42E+0", "-1.5",
			"0.1", "1e21", "1e-7", "9007199254740992", "123456789012345680000", "5e-324",
			"1.7976931348623157e308", "0.000001", "100", "1e2", "0.001e3",
			"18014398509481984", "1000000000000000000", "1000000000000000000000",
		} {
			c := refundCall()
			c.Args = json.RawMessage(lit)
			_, err := DeriveKey(c)
			require.NoError(t, err, lit)
		}
	})
}

func TestDeriveKeyValidation(t *testing.T) {
	t.Parallel()

	long := strings.Repeat("x", CallStringMaxBytes+1)
	for _, tt := range []struct {
		name   string
		mutate func(*Call)
		field  string
		reason string
	}{
		{"ToolRequired", func(c *Call) { c.Tool = "" }, "Tool", "is required"},
		{"ToolUpperCase", func(c *Call) { c.Tool = "Refund" }, "Tool", "must match"},
		{"ToolLeadingDigit", func(c *Call) { c.Tool = "1refund" }, "Tool", "must match"},
		{"ToolSpace", func(c *Call) { c.Tool = "re fund" }, "Tool", "must match"},
		{"ToolTooLong", func(c *Call) { c.Tool = "a" + strings.Repeat("b", 64) }, "Tool", "must match"},
		{"RunIDRequired", func(c *Call) { c.RunID = "" }, "RunID", "is required unless Key is set"},
		{"NegativeStep", func(c *Call) { c.Step = -1 }, "Step", "must not be negative"},
		{"TenantTooLong", func(c *Call) { c.Tenant = long }, "Tenant", "at most 512 bytes"},
		{"RunIDTooLong", func(c *Call) { c.RunID = long }, "RunID", "at most 512 bytes"},
		{"KeyTooLong", func(c *Call) { c.Key = long }, "Key", "at most 512 bytes"},
		{"NaturalIDTooLong", func(c *Call) { c.NaturalID = long }, "NaturalID", "at most 512 bytes"},
		{"TenantInvalidUTF8", func(c *Call) { c.Tenant = "\xff" }, "Tenant", "valid UTF-8"},
		{"RunIDInvalidUTF8", func(c *Call) { c.RunID = "\xff" }, "RunID", "valid UTF-8"},
		{"KeyInvalidUTF8", func(c *Call) { c.Key = "\xff" }, "Key", "valid UTF-8"},
		{"NaturalIDInvalidUTF8", func(c *Call) { c.NaturalID = "\xff" }, "NaturalID", "valid UTF-8"},
		{"TenantNUL", func(c *Call) { c.Tenant = "acme\x00" }, "Tenant", "NUL"},
		{"RunIDNUL", func(c *Call) { c.RunID = "\x00" }, "RunID", "NUL"},
		{"KeyNUL", func(c *Call) { c.Key = "order\x008842" }, "Key", "NUL"},
		{"NaturalIDNUL", func(c *Call) { c.NaturalID = "vm\x00" }, "NaturalID", "NUL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			c := refundCall()
			tt.mutate(&c)
			key, err := DeriveKey(c)
			require.Empty(t, key)
			require.ErrorIs(t, err, ErrInvalidCall)
			require.NotErrorIs(t, err, ErrNotCanonical)
			var ice *InvalidCallError
			require.ErrorAs(t, err, &ice)
			require.Equal(t, tt.field, ice.Field)
			require.Contains(t, ice.Reason, tt.reason)
			require.Contains(t, err.Error(), tt.field)
		})
	}

	t.Run("Accepted", func(t *testing.T) {
		t.Parallel()
		for _, c := range []Call{
			{Tool: "a", RunID: "r"},
			{Tool: "crm:contacts.upsert-v2_x", RunID: "r"},
			{Tool: "a" + strings.Repeat("b", 63), RunID: "r"},
			{Tool: "refund", Key: "order-1"},
			{Tool: "refund", RunID: strings.Repeat("é", CallStringMaxBytes/2)},
			{Tool: "refund", RunID: "r", Step: math.MaxInt64},
		} {
			_, err := DeriveKey(c)
			require.NoError(t, err, "%+v", c)
		}
	})
}

func TestParseKey(t *testing.T) {
	t.Parallel()

	key, err := DeriveKey(refundCall())
	require.NoError(t, err)
	parsed, err := ParseKey(string(key))
	require.NoError(t, err)
	require.Equal(t, key, parsed)

	for _, tt := range []struct {
		name string
		in   string
	}{
		{"Empty", ""},
		{"NoPrefix", strings.TrimPrefix(string(key), KeyPrefix)},
		{"OtherVersion", "k2_" + string(key[3:])},
		{"UpperCaseHex", KeyPrefix + strings.ToUpper(string(key[3:]))},
		{"TooShort", string(key[:KeyLength-1])},
		{"TooLong", string(key) + "0"},
		{"NotHex", string(key[:KeyLength-1]) + "g"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.in)
			require.ErrorIs(t, err, ErrInvalidKey)
			require.Empty(t, got)
		})
	}
}

// TestDeriveKeyRespellingProperty generates random argument trees, writes each
// twice with a different member order, number spelling, string escaping and
// whitespace, and checks that both spellings (and the Go value itself) derive
// the same key and canonical form.
func TestDeriveKeyRespellingProperty(t *testing.T) {
	t.Parallel()

	rng := rand.New(rand.NewPCG(8842, 42)) //nolint:gosec // deterministic test data
	for i := range 500 {
		tree := randomTree(rng, 0)
		a := spell(rng, tree)
		b := spell(rng, tree)

		da, err := derive(Call{RunID: "run", Tool: "t", Args: json.RawMessage(a)})
		require.NoError(t, err, "case %d: %s", i, a)
		db, err := derive(Call{RunID: "run", Tool: "t", Args: json.RawMessage(b)})
		require.NoError(t, err, "case %d: %s", i, b)
		require.Equal(t, da, db, "case %d:\n%s\n%s", i, a, b)

		dv, err := derive(Call{RunID: "run", Tool: "t", Args: tree})
		require.NoError(t, err, "case %d", i)
		require.Equal(t, da, dv, "case %d", i)
	}
}

var propertyNames = []string{"a", "b", "amount", "A", "é", "€", "😂", "\ufb33", "\u2028", "x y", `q"uote`, `back\slash`, "\n", "\x01", ""}

func randomTree(rng *rand.Rand, depth int) any {
	kind := rng.IntN(8)
	if depth >= 4 {
		kind = rng.IntN(5)
	}
	switch kind {
	case 0:
		return nil
	case 1:
		return rng.IntN(2) == 0
	case 2:
		return randomString(rng)
	case 3:
		// Integers and short decimals are exact in every spelling.
		return float64(rng.Int64N(1<<53)-1<<52) / math.Pow10(rng.IntN(4))
	case 4:
		return []float64{0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 123456789012345680000, 0.1, -2.5e-9}[rng.IntN(8)]
	case 5, 6:
		obj := map[string]any{}
		for range rng.IntN(6) {
			obj[propertyNames[rng.IntN(len(propertyNames))]+randomString(rng)[:0]] = randomTree(rng, depth+1)
		}
		return obj
	default:
		arr := make([]any, rng.IntN(5))
		for i := range arr {
			arr[i] = randomTree(rng, depth+1)
		}
		return arr
	}
}

func randomString(rng *rand.Rand) string {
	runes := []rune{'a', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', 0x01, 0x1f, 0x7f, 'é', '€', '😂', 0xfb33, 0x2028, 0xffff}
	var sb strings.Builder
	for range rng.IntN(6) {
		sb.WriteRune(runes[rng.IntN(len(runes))])
	}
	return sb.String()
}

// spell writes v as JSON text with random member order, number spelling,
// string escapes and whitespace.
func spell(rng *rand.Rand, v any) string {
	var sb strings.Builder
	ws := func() {
		sb.WriteString([]string{"", "", " ", "\n\t", "\r\n  "}[rng.IntN(5)])
	}
	var write func(v any)
	write = func(v any) {
		ws()
		switch x := v.(type) {
		case nil:
			sb.WriteString("null")
		case bool:
			sb.WriteString(strconv.FormatBool(x))
		case string:
			spellString(rng, &sb, x)
		case float64:
			sb.WriteString(spellNumber(rng, x))
		case []any:
			sb.WriteByte('[')
			for i, elem := range x {
				if i > 0 {
					sb.WriteByte(',')
				}
				write(elem)
			}
			ws()
			sb.WriteByte(']')
		case map[string]any:
			names := make([]string, 0, len(x))
			for name := range x {
				names = append(names, name)
			}
			rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			sb.WriteByte('{')
			for i, name := range names {
				if i > 0 {
					sb.WriteByte(',')
				}
				ws()
				spellString(rng, &sb, name)
				ws()
				sb.WriteByte(':')
				write(x[name])
			}
			ws()
			sb.WriteByte('}')
		default:
			panic(fmt.Sprintf("unexpected %T", v))
		}
		ws()
	}
	write(v)
	return sb.String()
}

func spellString(rng *rand.Rand, sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for _, r := range s {
		escape := r < 0x20 || r == '"' || r == '\\' || rng.IntN(3) == 0
		switch {
		case !escape:
			sb.WriteRune(r)
		case r == '"' || r == '\\' || r == '/':
			if rng.IntN(2) == 0 {
				sb.WriteByte('\\')
				sb.WriteRune(r)
			} else {
				fmt.Fprintf(sb, `\u%04x`, r)
			}
		case r >= 0x10000:
			hi, lo := 0xD800+(r-0x10000)>>10, 0xDC00+(r-0x10000)&0x3FF
			fmt.Fprintf(sb, `\u%04X\u%04x`, hi, lo)
		case r == '\n' && rng.IntN(2) == 0:
			sb.WriteString(`\n`)
		default:
			fmt.Fprintf(sb, `\u%04x`, r)
		}
	}
	sb.WriteByte('"')
}

// spellNumber writes f exactly, with a random placement of the decimal
// point, redundant zeros and exponent style.
func spellNumber(rng *rand.Rand, f float64) string {
	if f == 0 {
		return []string{"0", "-0", "0.0", "0e5", "-0.000E-3"}[rng.IntN(5)]
	}
	shortest := strconv.FormatFloat(f, 'e', -1, 64)
	neg, digits, exp := shortestDecimal(shortest) // f = 0.digits × 10^exp
	d := string(digits) + strings.Repeat("0", rng.IntN(3))
	point := 1 + rng.IntN(len(d))
	var sb strings.Builder
	if neg {
		sb.WriteByte('-')
	}
	lead := rng.IntN(2) == 0 && point == 1 // 0.ddd form
	if lead {
		sb.WriteString("0." + strings.Repeat("0", rng.IntN(2)))
		zeros := sb.Len() - 2 - boolInt(neg)
		sb.WriteString(d)
		writeExponent(rng, &sb, exp+zeros)
		return sb.String()
	}
	sb.WriteString(d[:point])
	if point < len(d) {
		sb.WriteString("." + d[point:])
	}
	writeExponent(rng, &sb, exp-point)
	return sb.String()
}

// shortestDecimal splits strconv's shortest 'e' form of a non-zero float,
// -d.ddde±dd, into its sign, significant digits and exponent e, so that the
// value is 0.digits × 10^e.
func shortestDecimal(s string) (neg bool, digits string, exp int) {
	s, neg = strings.CutPrefix(s, "-")
	mantissa, e, _ := strings.Cut(s, "e")
	n, err := strconv.Atoi(e)
	if err != nil {
		panic(err)
	}
	return neg, strings.Replace(mantissa, ".", "", 1), n + 1
}

func writeExponent(rng *rand.Rand, sb *strings.Builder, e int) {
	if e == 0 && rng.IntN(2) == 0 {
		return
	}
	sb.WriteString([]string{"e", "E"}[rng.IntN(2)])
	if e >= 0 && rng.IntN(2) == 0 {
		sb.WriteByte('+')
	}
	sb.WriteString(strconv.Itoa(e))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestSpellNumberIsExact(t *testing.T) {
	t.Parallel()

	rng := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // deterministic test data
	for _, f := range []float64{1, -1, 42, 0.1, -2.5e-9, 1e21, 5e-324, 123456789012345680000, 1.7976931348623157e308} {
		for range 20 {
			s := spellNumber(rng, f)
			got, err := strconv.ParseFloat(s, 64)
			require.NoError(t, err, s)
			require.Equal(t, math.Float64bits(f), math.Float64bits(got), s)
			require.True(t, utf8.ValidString(s))
		}
	}
}
