package jcs

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"unicode/utf8"
)

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// encode appends JSON text for the Go value v to dst. Common dynamic types
// are written directly; anything else is checked for what encoding/json
// would silently change (invalid UTF-8) or refuse without a path (NaN, ±Inf),
// then marshalled by encoding/json. The text need not be canonical: it is
// parsed again.
func (st *Buffer) encode(dst []byte, v any, depth int) ([]byte, error) {
	if len(dst) > MaxBytes {
		return dst, errTooLarge()
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		return strconv.AppendBool(dst, x), nil
	case string:
		return appendGoString(dst, x)
	case float64:
		return appendGoFloat(dst, x, 64)
	case float32:
		return appendGoFloat(dst, float64(x), 32)
	case int:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(dst, x, 10), nil
	case int32:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int16:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case int8:
		return strconv.AppendInt(dst, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(dst, x, 10), nil
	case uint32:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint16:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case uint8:
		return strconv.AppendUint(dst, uint64(x), 10), nil
	case json.Number:
		if x == "" { // as encoding/json does
			return append(dst, '0'), nil
		}
		if !IsNumber([]byte(x)) {
			return dst, &Error{Reason: fmt.Sprintf("json.Number %s is not a JSON number", quoteShort(string(x)))}
		}
		return append(dst, x...), nil
	case json.RawMessage:
		if x == nil {
			return append(dst, "null"...), nil
		}
		// Checked here only so that the text cannot change the structure
		// around it (e.g. `1,2`); the strict checks happen on the re-parse.
		if !json.Valid(x) {
			return dst, &Error{Reason: "json.RawMessage is not a single JSON value"}
		}
		return append(dst, x...), nil
	case map[string]any:
		if depth++; depth > MaxDepth {
			return dst, errTooDeep()
		}
		dst = append(dst, '{')
		first := true
		for name, elem := range x {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			if dst, err = appendGoString(dst, name); err != nil {
				return dst, prefixPath(errInvalidUTF8Name(), nameSegment(name))
			}
			dst = append(dst, ':')
			if dst, err = st.encode(dst, elem, depth); err != nil {
				return dst, prefixPath(err, nameSegment(name))
			}
		}
		return append(dst, '}'), nil
	case []any:
		if depth++; depth > MaxDepth {
			return dst, errTooDeep()
		}
		dst = append(dst, '[')
		for i, elem := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = st.encode(dst, elem, depth); err != nil {
				return dst, prefixPath(err, indexSegment(i))
			}
		}
		return append(dst, ']'), nil
	case map[string]string:
		dst = append(dst, '{')
		first := true
		for name, elem := range x {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			if dst, err = appendGoString(dst, name); err != nil {
				return dst, prefixPath(errInvalidUTF8Name(), nameSegment(name))
			}
			dst = append(dst, ':')
			if dst, err = appendGoString(dst, elem); err != nil {
				return dst, prefixPath(err, nameSegment(name))
			}
		}
		return append(dst, '}'), nil
	case []string:
		dst = append(dst, '[')
		for i, elem := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendGoString(dst, elem); err != nil {
				return dst, prefixPath(err, indexSegment(i))
			}
		}
		return append(dst, ']'), nil
	}

	// Anything else goes through encoding/json, after a check for what it
	// would accept but change or refuse without saying where.
	if err := checkGoValue(reflect.ValueOf(v), depth, 0); err != nil {
		return dst, err
	}
	text, err := json.Marshal(v)
	if err != nil {
		return dst, &Error{Reason: fmt.Sprintf("cannot marshal %T: %v", v, err), Err: err}
	}
	if len(dst)+len(text) > MaxBytes {
		return dst, errTooLarge()
	}
	return append(dst, text...), nil
}

func errInvalidUTF8Name() error { return &Error{Reason: "invalid UTF-8 in member name"} }

// appendGoFloat writes f in its canonical spelling (ECMAScript's
// Number::toString), as encoding/json writes the floats of a struct, so that
// the size a native value is measured at does not depend on whether its
// floats stand in a map or a struct, and is what another runtime measures
// (KEYSPEC.md "Limits").
func appendGoFloat(dst []byte, f float64, bitSize int) ([]byte, error) {
	if err := checkFloat(f); err != nil {
		return dst, err
	}
	return appendES6Float(dst, f, bitSize), nil
}

func checkFloat(f float64) error {
	switch {
	case math.IsNaN(f):
		return &Error{Reason: "NaN is not a JSON number"}
	case math.IsInf(f, 1):
		return &Error{Reason: "+Inf is not a JSON number"}
	case math.IsInf(f, -1):
		return &Error{Reason: "-Inf is not a JSON number"}
	}
	return nil
}

// appendGoString appends s as a JSON string, refusing invalid UTF-8 (which
// encoding/json would silently replace with U+FFFD).
func appendGoString(dst []byte, s string) ([]byte, error) {
	dst = append(dst, '"')
	run := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[run:i]...)
		if c < utf8.RuneSelf {
			dst = appendEscapedRune(dst, rune(c))
			i++
			run = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return dst, &Error{Reason: fmt.Sprintf("invalid UTF-8 in string at byte %d", i)}
		}
		dst = append(dst, s[i:i+size]...)
		i += size
		run = i
	}
	dst = append(dst, s[run:]...)
	return append(dst, '"'), nil
}

// checkGoValue walks a value that encoding/json will marshal and refuses,
// with a path, NaN and infinite floats and strings with invalid UTF-8. It
// stops at types with their own marshalling, whose output is checked when it
// is parsed. level bounds the walk (pointer and interface hops count), so a
// cyclic value cannot recurse forever; encoding/json reports the cycle.
func checkGoValue(rv reflect.Value, depth, level int) error {
	if !rv.IsValid() {
		return nil
	}
	if level > 4*MaxDepth {
		return &Error{Reason: "value nests too deep, or is cyclic"}
	}
	rt := rv.Type()
	if rt.Implements(jsonMarshalerType) || rt.Implements(textMarshalerType) {
		return nil
	}
	if rt.Kind() != reflect.Pointer {
		pt := reflect.PointerTo(rt)
		if pt.Implements(jsonMarshalerType) || pt.Implements(textMarshalerType) {
			return nil
		}
	}

	switch rv.Kind() {
	case reflect.Float32, reflect.Float64:
		return checkFloat(rv.Float())
	case reflect.String:
		if s := rv.String(); !utf8.ValidString(s) {
			return &Error{Reason: "invalid UTF-8 in string"}
		}
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil
		}
		return checkGoValue(rv.Elem(), depth, level+1)
	case reflect.Struct:
		if depth++; depth > MaxDepth {
			return errTooDeep()
		}
		for i := range rt.NumField() {
			field := rt.Field(i)
			if !field.IsExported() && !field.Anonymous {
				continue
			}
			tag := field.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := cutComma(tag)
			segment := ""
			if name != "" || !field.Anonymous {
				segment = nameSegment(cmp.Or(name, field.Name))
			} else {
				depth-- // promoted fields live at the same level
			}
			if err := checkGoValue(rv.Field(i), depth, level+1); err != nil {
				return prefixPath(err, segment)
			}
			if segment == "" {
				depth++
			}
		}
	case reflect.Map:
		if depth++; depth > MaxDepth {
			return errTooDeep()
		}
		iter := rv.MapRange()
		for iter.Next() {
			key := iter.Key()
			name := fmt.Sprint(key)
			if key.Kind() == reflect.String {
				name = key.String()
			}
			if key.Kind() == reflect.String && !utf8.ValidString(key.String()) {
				return prefixPath(errInvalidUTF8Name(), nameSegment(name))
			}
			if err := checkGoValue(iter.Value(), depth, level+1); err != nil {
				return prefixPath(err, nameSegment(name))
			}
		}
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rt.Elem().Kind() == reflect.Uint8 {
			return nil // base64
		}
		if depth++; depth > MaxDepth {
			return errTooDeep()
		}
		for i := range rv.Len() {
			if err := checkGoValue(rv.Index(i), depth, level+1); err != nil {
				return prefixPath(err, indexSegment(i))
			}
		}
	default:
	}
	return nil
}

func cutComma(s string) (before, after string, found bool) {
	if i := bytes.IndexByte([]byte(s), ','); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}
