package outbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pgonce/pgonce/internal/jcs"
	"github.com/pgonce/pgonce/internal/store"
)

const (
	// KeyVersion is the version of the key derivation that [DeriveKey]
	// implements, as specified in KEYSPEC.md. A change to the derivation is a
	// new version with a new [KeyPrefix], never a silent change.
	KeyVersion = 1

	// KeyPrefix starts every key of [KeyVersion]: "k1_".
	KeyPrefix = store.KeyPrefix

	// KeyLength is the length in bytes of every key of [KeyVersion]:
	// [KeyPrefix] followed by 64 lower-case hexadecimal digits.
	KeyLength = len(KeyPrefix) + 2*sha256.Size

	// CallStringMaxBytes is the longest Tenant, RunID, Key or NaturalID a
	// [Call] may have, in bytes.
	CallStringMaxBytes = 512

	// toolMaxLen is the longest tool name; see validToolName.
	toolMaxLen = 64

	// toolNamePattern is the rule validToolName implements, for messages.
	toolNamePattern = "^[a-z][a-z0-9_.:-]{0,63}$"
)

// Domain tags open every hashed frame, so that the hashes for different
// purposes can never be confused with each other (KEYSPEC.md).
const (
	tagKey         = "pgonce/key/v1"
	tagScope       = "pgonce/scope/v1"
	tagFingerprint = "pgonce/fingerprint/v1"

	kindStep     = "step"
	kindBusiness = "business"
)

// Key is the idempotency key of a [Call]: every attempt of the same intended
// action derives the same Key, and two different actions never share one.
// A Key is printable, fixed-length and versioned, e.g.
// "k1_" followed by 64 lower-case hex digits. Get one from [DeriveKey], or
// from [ParseKey] for a string received from elsewhere.
type Key string

// String returns the key as a string.
func (k Key) String() string { return string(k) }

// ParseKey checks that s is a well-formed key of a known version (today only
// [KeyVersion]) and returns it as a [Key]. It returns an error matching
// [ErrInvalidKey] otherwise. It cannot tell whether the key was ever derived.
func ParseKey(s string) (Key, error) {
	if len(s) != KeyLength || s[:len(KeyPrefix)] != KeyPrefix {
		return "", fmt.Errorf("%w: %s must be %q followed by %d lower-case hex digits",
			ErrInvalidKey, quoteShort(s), KeyPrefix, 2*sha256.Size)
	}
	for i := len(KeyPrefix); i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", fmt.Errorf("%w: %s has %q at byte %d, want a lower-case hex digit",
				ErrInvalidKey, quoteShort(s), c, i)
		}
	}
	return Key(s), nil
}

// DeriveKey returns the idempotency key of c, after validating it.
//
// For a step call (c.Key empty) the key hashes the tenant, run id, step, tool
// and canonical arguments. For a business call (c.Key set) it hashes the
// tenant, tool and business key only; RunID and Step are ignored, and the
// arguments are compared by fingerprint when the key is claimed, so a
// business key reused with different arguments is a conflict rather than a
// new key. NaturalID never affects the key. KEYSPEC.md specifies the
// derivation exactly, with golden vectors, for runtimes in other languages.
//
// DeriveKey returns an error matching [ErrInvalidCall] when c breaks a
// validation rule (see [Call]), and one matching [ErrNotCanonical] when the
// arguments have no canonical form (see [Canonicalize]) or hold a number
// whose canonical form is a different value: canonical form writes the
// nearest float64 in its shortest round-trip digits, so 9007199254740993
// would become 9007199254740992, 0.1000000000000000055511151231257827 would
// become 0.1, and 2^60 (1152921504606846976), although a float64 holds it
// exactly, would become 1152921504606847000. Such numbers are refused rather
// than rounded, because two different values must never share a key. Send
// big integer ids and exact decimal amounts as strings. 1, 1.0 and 1e0 are
// the same value and derive the same key.
//
// DeriveKey is deterministic, does no I/O and is safe for concurrent use.
func DeriveKey(c Call) (Key, error) {
	d, err := deriveCall(c, false)
	if err != nil {
		return "", err
	}
	return d.Key, nil
}

// derivation is everything the client derives from a [Call].
type derivation struct {
	// Key is the idempotency key.
	Key Key

	// Scope identifies the logical action the key belongs to: the run and
	// step of a step call, or the business key of a business call, within a
	// tenant. The store keeps one action per scope, so asking for the same
	// step with another tool or other arguments is a conflict. Lower-case hex.
	Scope string

	// Fingerprint hashes the tool and canonical arguments, to tell a repeat
	// of the same request from a different request under the same key or
	// scope. Lower-case hex.
	Fingerprint string

	// Args are the canonical arguments (RFC 8785 bytes), owned by the
	// derivation.
	Args []byte
}

// derive validates c and returns its key, scope, fingerprint and canonical
// arguments.
func derive(c Call) (derivation, error) { return deriveCall(c, true) }

func deriveCall(c Call, full bool) (derivation, error) {
	if err := c.validate(); err != nil {
		return derivation{}, err
	}

	st := jcs.Get()
	defer st.Release()

	args, err := st.Canonicalize(c.Args, jcs.NumbersExact)
	if err != nil {
		return derivation{}, fmt.Errorf("canonicalize args: %w", notCanonical(err))
	}

	var stepBuf [20]byte
	step := strconv.AppendInt(stepBuf[:0], c.Step, 10)

	f := st.Frame[:0]
	f = appendField(f, tagKey)
	if c.Key == "" {
		f = appendField(f, kindStep)
		f = appendField(f, c.Tenant)
		f = appendField(f, c.RunID)
		f = appendField(f, step)
		f = appendField(f, c.Tool)
		f = appendField(f, args)
	} else {
		f = appendField(f, kindBusiness)
		f = appendField(f, c.Tenant)
		f = appendField(f, c.Tool)
		f = appendField(f, c.Key)
	}
	sum := sha256.Sum256(f)
	var keyBuf [KeyLength]byte
	copy(keyBuf[:], KeyPrefix)
	hex.Encode(keyBuf[len(KeyPrefix):], sum[:])
	d := derivation{Key: Key(keyBuf[:])}

	if full {
		if c.Key == "" {
			f = appendStepScopeFrame(f[:0], c.Tenant, c.RunID, step)
		} else {
			f = appendField(f[:0], tagScope)
			f = appendField(f, kindBusiness)
			f = appendField(f, c.Tenant)
			f = appendField(f, c.Key)
		}
		sum = sha256.Sum256(f)
		d.Scope = hex.EncodeToString(sum[:])

		f = appendFingerprintFrame(f[:0], c.Tool, args)
		sum = sha256.Sum256(f)
		d.Fingerprint = hex.EncodeToString(sum[:])

		d.Args = bytes.Clone(args)
	}
	st.Frame = f
	return d, nil
}

// appendField appends one frame field: its length as a 4-byte big-endian
// unsigned integer, then its bytes. Fields are bounded well below 4 GiB by
// [CanonicalMaxBytes] and [CallStringMaxBytes].
func appendField[T string | []byte](dst []byte, field T) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(field))) //nolint:gosec // bounded, see above
	return append(dst, field...)
}

// validate checks c against the rules documented on [Call].
func (c Call) validate() error {
	switch {
	case c.Tool == "":
		return &InvalidCallError{Field: "Tool", Reason: "is required"}
	case !validToolName(c.Tool):
		return &InvalidCallError{Field: "Tool", Reason: fmt.Sprintf("%s must match %s", quoteShort(c.Tool), toolNamePattern)}
	case c.Key == "" && c.RunID == "":
		return &InvalidCallError{Field: "RunID", Reason: "is required unless Key is set"}
	case c.Step < 0:
		return &InvalidCallError{Field: "Step", Reason: fmt.Sprintf("must not be negative, got %d", c.Step)}
	}
	for _, field := range [...]struct{ name, value string }{
		{"Tenant", c.Tenant},
		{"RunID", c.RunID},
		{"Key", c.Key},
		{"NaturalID", c.NaturalID},
	} {
		if reason := callStringProblem(field.value); reason != "" {
			return &InvalidCallError{Field: field.name, Reason: reason}
		}
	}
	return nil
}

// callStringProblem says what is wrong with a call's string field, or
// returns "" when nothing is.
func callStringProblem(value string) string {
	if len(value) > CallStringMaxBytes {
		return fmt.Sprintf("must be at most %d bytes, got %d", CallStringMaxBytes, len(value))
	}
	if !utf8.ValidString(value) {
		return "must be valid UTF-8"
	}
	// PostgreSQL text cannot hold NUL: refused here, before any SQL, it
	// cannot abort the caller's transaction (SQLSTATE 22021).
	if i := strings.IndexByte(value, 0); i >= 0 {
		return fmt.Sprintf("must not contain NUL bytes, found one at byte %d", i)
	}
	return ""
}

// validToolName reports whether name matches toolNamePattern, without the
// cost of a regular expression.
func validToolName(name string) bool {
	if len(name) == 0 || len(name) > toolMaxLen || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for i := 1; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_', c == '.', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// appendStepScopeFrame appends the frame a step call's scope hashes: the
// tenant, the run and the step in decimal, whatever the tool and arguments.
func appendStepScopeFrame(f []byte, tenant, runID string, step []byte) []byte {
	f = appendField(f, tagScope)
	f = appendField(f, kindStep)
	f = appendField(f, tenant)
	f = appendField(f, runID)
	return appendField(f, step)
}

// stepScopes returns the scopes of steps from, from+1, … from+n-1 of run
// runID in tenant, in their hex form: the scopes every step call of those
// steps has, whatever its tool and arguments.
func stepScopes(tenant, runID string, from int64, n int) []string {
	scopes := make([]string, n)
	var f []byte
	var stepBuf [20]byte
	for i := range scopes {
		f = appendStepScopeFrame(f[:0], tenant, runID, strconv.AppendInt(stepBuf[:0], from+int64(i), 10))
		sum := sha256.Sum256(f)
		scopes[i] = hex.EncodeToString(sum[:])
	}
	return scopes
}

// appendFingerprintFrame appends the frame a fingerprint hashes: the tool
// and the canonical arguments.
func appendFingerprintFrame(f []byte, tool string, args []byte) []byte {
	f = appendField(f, tagFingerprint)
	f = appendField(f, tool)
	return appendField(f, args)
}

// fingerprint returns the fingerprint of a call of tool with canonical args.
func fingerprint(tool string, args []byte) string {
	sum := sha256.Sum256(appendFingerprintFrame(nil, tool, args))
	return hex.EncodeToString(sum[:])
}
