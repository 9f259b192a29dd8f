package store

import (
	"encoding/hex"
	"strings"
)

// The key table stores keys, scopes and fingerprints as their 32-byte
// digests; the rest of pgonce speaks their text forms (KEYSPEC.md): a key is
// KeyPrefix followed by the digest in lower-case hex, a scope or fingerprint
// is the digest in lower-case hex. Conversions between the two happen here
// and nowhere else.

// KeyPrefix starts the text form of a version 1 key, the only version.
// outbox exports it as outbox.KeyPrefix.
const KeyPrefix = "k1_"

// digestSize is the size of a stored key, scope or fingerprint.
const digestSize = 32

// keyDigest returns the stored form of a key's text form, or nil for text
// that is not a well-formed key: nil matches no row, and the table refuses
// it as a new key.
func keyDigest(key string) []byte {
	digest, ok := strings.CutPrefix(key, KeyPrefix)
	if !ok {
		return nil
	}
	return hexDigest(digest)
}

// keyText returns the text form of a stored key.
func keyText(digest []byte) string { return KeyPrefix + hex.EncodeToString(digest) }

// hexDigest returns the stored form of a scope's or fingerprint's text form,
// or nil for text that is not 64 hex digits. The empty text is nil: a
// fingerprint that is not stored.
func hexDigest(text string) []byte {
	if len(text) != 2*digestSize {
		return nil
	}
	digest, err := hex.DecodeString(text)
	if err != nil {
		return nil
	}
	return digest
}

// hexText returns the text form of a stored scope or fingerprint; nil is
// the empty text.
func hexText(digest []byte) string {
	if digest == nil {
		return ""
	}
	return hex.EncodeToString(digest)
}
