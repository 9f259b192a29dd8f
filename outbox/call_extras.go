package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// encodeMetadata validates call's metadata and schedule, and returns the
// metadata as stored: a JSON object with its names sorted, or nil for none.
// Neither is part of the key.
func encodeMetadata(call Call) ([]byte, error) {
	switch {
	case call.Delay < 0:
		return nil, &InvalidCallError{Field: "Delay", Reason: "must not be negative"}
	case call.Delay > 0 && !call.NotBefore.IsZero():
		return nil, &InvalidCallError{Field: "Delay", Reason: "must be zero when NotBefore is set"}
	}
	if len(call.Metadata) == 0 {
		return nil, nil
	}
	if len(call.Metadata) > MetadataMaxEntries {
		return nil, &InvalidCallError{Field: "Metadata", Reason: fmt.Sprintf("must hold at most %d entries, got %d", MetadataMaxEntries, len(call.Metadata))}
	}
	for name, value := range call.Metadata {
		if name == "" {
			return nil, &InvalidCallError{Field: "Metadata", Reason: "names must not be empty"}
		}
		for _, s := range [...]string{name, value} {
			if !utf8.ValidString(s) {
				return nil, &InvalidCallError{Field: "Metadata", Reason: fmt.Sprintf("entry %s must be valid UTF-8", quoteShort(name))}
			}
			if strings.IndexByte(s, 0) >= 0 {
				return nil, &InvalidCallError{Field: "Metadata", Reason: fmt.Sprintf("entry %s must not contain NUL bytes", quoteShort(name))}
			}
		}
	}
	// encoding/json sorts map keys: equal metadata is stored as equal bytes.
	encoded, err := json.Marshal(call.Metadata)
	if err != nil {
		return nil, &InvalidCallError{Field: "Metadata", Reason: err.Error()}
	}
	if len(encoded) > MetadataMaxBytes {
		return nil, &InvalidCallError{Field: "Metadata", Reason: fmt.Sprintf("must take at most %d bytes as JSON, got %d", MetadataMaxBytes, len(encoded))}
	}
	return encoded, nil
}

// decodeMetadata reads stored metadata; nil for none.
func decodeMetadata(stored []byte) map[string]string {
	if len(stored) == 0 {
		return nil
	}
	var metadata map[string]string
	if err := json.Unmarshal(stored, &metadata); err != nil {
		// The CHECK constraint bounds the bytes, and only encodeMetadata
		// writes them; a row written otherwise shows no metadata.
		return nil
	}
	return metadata
}
