package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/pgonce/pgonce/outbox"
)

// parseKey reads the key from the header's values: one value, an RFC 8941
// sf-string ("…", whose only escapes are \" and \\) as the IETF draft
// specifies, or a bare token as Stripe's clients send it; printable ASCII,
// not empty, at most maxLen bytes.
func parseKey(values []string, maxLen int) (string, error) {
	if len(values) != 1 {
		return "", errors.New("send exactly one Idempotency-Key header")
	}
	key := strings.Trim(values[0], " \t")
	if strings.HasPrefix(key, `"`) {
		unquoted, err := parseSFString(key)
		if err != nil {
			return "", err
		}
		key = unquoted
	}
	switch {
	case key == "":
		return "", errors.New("the key is empty")
	case len(key) > maxLen:
		return "", fmt.Errorf("the key is longer than %d bytes", maxLen)
	}
	for i := range len(key) {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return "", errors.New("the key must be printable ASCII")
		}
	}
	return key, nil
}

// parseSFString parses s, which starts with a double quote, as an RFC 8941
// sf-string (§3.3.3, parsed as §4.2.5 says) that makes up the whole field
// value: printable ASCII between double quotes, where a backslash escapes
// only a double quote or a backslash. Parameters (;name=value) are not
// accepted: the draft defines none.
func parseSFString(s string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || s[i] != '"' && s[i] != '\\' {
				return "", errors.New(`the key is not a valid quoted string: a backslash escapes only \" and \\`)
			}
			b.WriteByte(s[i])
		case c == '"':
			if i != len(s)-1 {
				return "", errors.New("the key is not a valid quoted string: nothing may follow its closing quote")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("the key is not a valid quoted string: printable ASCII only")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the key is not a valid quoted string: no closing quote")
}

// fingerprint is what identifies a request beside its key: method, path,
// query and a digest of its body, canonical when it is JSON, so that a
// respelled JSON body is the same request.
func fingerprint(r *http.Request, body []byte) map[string]any {
	digestOf := body
	if json.Valid(body) {
		if canonical, err := outbox.Canonicalize(json.RawMessage(body)); err == nil {
			digestOf = canonical
		}
	}
	sum := sha256.Sum256(digestOf)
	return map[string]any{
		"method":      r.Method,
		"path":        r.URL.EscapedPath(),
		"query":       r.URL.RawQuery,
		"body_sha256": hex.EncodeToString(sum[:]),
	}
}
