package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// writeJSON writes v as one line of JSON, without HTML escaping.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// rawField is a member whose value is written verbatim: encoding/json would
// compact json.RawMessage and escape HTML characters in it, and pgonce's
// promise is the provider's exact bytes.
type rawField struct {
	name  string
	value []byte // nil: the member is left out
}

// jsonWithRaw returns head (a struct marshalling to a non-empty JSON object)
// with the raw fields appended, verbatim. A value that is not valid JSON is
// written as a JSON string instead, as outbox.Observation.JSON does; an empty
// one as "".
func jsonWithRaw(head any, raws ...rawField) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(head); err != nil {
		return nil, err
	}
	body := bytes.TrimRight(buf.Bytes(), "\n")
	if len(body) < 2 || body[len(body)-1] != '}' {
		return nil, fmt.Errorf("jsonWithRaw: head marshals to %s, not an object", body)
	}
	out := append([]byte(nil), body[:len(body)-1]...)
	empty := len(body) == 2
	for _, raw := range raws {
		if raw.value == nil {
			continue
		}
		if !empty {
			out = append(out, ',')
		}
		empty = false
		name, _ := json.Marshal(raw.name)
		out = append(out, name...)
		out = append(out, ':')
		if json.Valid(raw.value) {
			out = append(out, raw.value...)
			continue
		}
		quoted, _ := json.Marshal(string(raw.value))
		out = append(out, quoted...)
	}
	return append(out, '}', '\n'), nil
}

// formatTime prints a timestamp for people: UTC, RFC 3339 with
// milliseconds, or "-" for none.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// timePtr is nil for the zero time, so that JSON leaves it out.
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	utc := t.UTC()
	return &utc
}

// formatDuration rounds d for people.
func formatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// plural counts n of noun, in English: "1 key", "2 keys".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// pluralVerb is plural followed by the verb that agrees with it: "1 key
// needs", "2 keys need".
func pluralVerb(n int64, noun, singular, pluralForm string) string {
	if n == 1 {
		return plural(n, noun) + " " + singular
	}
	return plural(n, noun) + " " + pluralForm
}
