package setup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// SameJSON reports whether a and b hold the same JSON value, however written.
func SameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := Marshal(x)
	jb, _ := Marshal(y)
	return bytes.Equal(ja, jb)
}

// Member is one key of a JSON object, its value as written.
type Member struct {
	Key   string
	Value json.RawMessage
}

// Object is a JSON object with its keys in the order they were written, so that a
// user's settings keep theirs.
type Object []Member

// ParseObject reads a JSON object; empty data is an empty one.
func ParseObject(data []byte, what string) (Object, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return Object{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%s: not JSON: %w", what, err)
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("%s: not a JSON object", what)
	}
	obj := Object{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%s: not JSON: %w", what, err)
		}
		key := tok.(string) // inside an object, the decoder gives only string keys here
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, fmt.Errorf("%s: not JSON at the value of %q: %w", what, key, err)
		}
		if seen[key] {
			return nil, fmt.Errorf("%s: key %q twice", what, key)
		}
		seen[key] = true
		obj = append(obj, Member{key, value})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%s: not JSON: %w", what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: more after the JSON object", what)
	}
	return obj, nil
}

// Get is key's value as written.
func (o Object) Get(key string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.Key == key {
			return m.Value, true
		}
	}
	return nil, false
}

// Set replaces key's value in its place, or adds it at the end.
func (o Object) Set(key string, value json.RawMessage) Object {
	out := append(Object{}, o...)
	for i, m := range out {
		if m.Key == key {
			out[i].Value = value
			return out
		}
	}
	return append(out, Member{key, value})
}

// Without is the object without key.
func (o Object) Without(key string) Object {
	var out Object
	for _, m := range o {
		if m.Key != key {
			out = append(out, m)
		}
	}
	return out
}

// Encode writes the object back, compact, its members as written.
func (o Object) Encode() (json.RawMessage, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		key, _ := Marshal(m.Key)
		b.Write(key)
		b.WriteByte(':')
		b.Write(m.Value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Indent is the object as a settings file: indented by two spaces, a newline at the
// end.
func (o Object) Indent() ([]byte, error) {
	raw, _ := o.Encode()
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return nil, err
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// Marshal is json.Marshal without the escapes of <, > and &, which would rewrite a
// user's commands (a && b) into \u0026.
func Marshal(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}
