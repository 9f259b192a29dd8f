// Package header holds the header handling that the HTTP provider
// and the idempotency middleware share.
package header

import (
	"net/http"
	"slices"
	"strings"
)

// Canonical returns names in canonical header form, in a new slice, so that
// lookups in an [http.Header] find them. A nil names gives an empty slice.
func Canonical(names []string) []string {
	canonical := make([]string, len(names))
	for i, name := range names {
		canonical[i] = http.CanonicalHeaderKey(name)
	}
	return canonical
}

// Keep returns the values of h under the given canonical names, copied;
// names absent from h are left out.
func Keep(h http.Header, names []string) http.Header {
	kept := http.Header{}
	for _, name := range names {
		if values := h.Values(name); len(values) > 0 {
			kept[name] = slices.Clone(values)
		}
	}
	return kept
}

// ValidToken reports whether s is an RFC 9110 token, as header names and
// methods are.
func ValidToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// InvalidName returns the first of names that is not a header name (not a
// [ValidToken]), and whether there is one.
func InvalidName(names []string) (string, bool) {
	for _, name := range names {
		if !ValidToken(name) {
			return name, true
		}
	}
	return "", false
}
