package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Limits of a spec's free-form JSON. A spec is copied whole into its armed event, its
// task's view, every list page, the archive and (origin) the wake-up: what is
// accepted here must stay readable by every one of them.
const (
	// MaxJSONDepth is how many levels the value of one top-level field may nest
	// (origin: {"a":{"b":1}} is 2). Go's decoders stop at 10,000 levels in all, and a
	// deep value printed indented grows with the square of its depth.
	MaxJSONDepth = 32
	// MaxOriginBytes bounds origin as written, for it travels in every wake-up.
	MaxOriginBytes = 16 << 10
)

// CheckJSON checks a JSON document as written, before it is decoded, for what
// decoding would hide: a key given twice in one object (the decoder keeps the last,
// so a proxy that reads the first would pass what bgtask never sees), a string that
// is not UTF-8 or holds a lone surrogate escape (the decoder silently puts U+FFFD in
// its place, so what runs would not be what was sent), and a value nested more than
// MaxJSONDepth levels below its top-level field. A rejection is a *FieldError that
// names the field by its path ("origin.chat", "deliver[0].url"); root names the
// document itself. A document that is not JSON passes: its decoder says why.
func CheckJSON(data []byte, root string) error {
	type frame struct {
		path   string
		object bool
		keys   map[string]bool
		key    string // the key whose value comes next, in an object
		hasKey bool
		index  int
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(data))
	// top is the top-level field the innermost value belongs to, for depth errors.
	top := root
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		raw := data[start:dec.InputOffset()]
		var parent *frame
		if len(stack) > 0 {
			parent = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return nil
			}
			continue
		}
		if parent != nil && parent.object && !parent.hasKey {
			key, _ := tok.(string)
			if !validString(raw) {
				return fieldErr(orRoot(parent.path, root), "the key %q is not valid UTF-8 (or holds a lone surrogate escape)", key)
			}
			if parent.keys[key] {
				return fieldErr(join(parent.path, key), "the key is given twice; each key may appear once")
			}
			parent.keys[key] = true
			parent.key, parent.hasKey = key, true
			if len(stack) == 1 {
				top = key
			}
			continue
		}
		path := root
		switch {
		case parent != nil && parent.object:
			path = join(parent.path, parent.key)
			parent.hasKey = false
		case parent != nil:
			path = fmt.Sprintf("%s[%d]", orRoot(parent.path, root), parent.index)
			parent.index++
		}
		switch tok := tok.(type) {
		case json.Delim:
			if len(stack) > MaxJSONDepth {
				return fieldErr(orRoot(top, root), "nested deeper than %d levels", MaxJSONDepth)
			}
			f := &frame{path: path, object: tok == '{'}
			if parent == nil {
				f.path = "" // the top-level fields are named by themselves
			}
			if f.object {
				f.keys = map[string]bool{}
			}
			stack = append(stack, f)
		case string:
			if !validString(raw) {
				return fieldErr(orRoot(path, root), "not valid UTF-8 (or holds a lone surrogate escape)")
			}
		}
		if len(stack) == 0 {
			return nil // a document that is one scalar
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path, root string) string {
	if path == "" {
		return root
	}
	return path
}

// validString reports whether the raw text of a JSON string (with the separators
// before it) decodes to itself: UTF-8, and every \u escape of a surrogate one half of
// a pair. The decoder has checked its syntax.
func validString(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if raw[i] != 'u' {
			continue
		}
		r := hex4(raw[i+1:])
		i += 4
		switch {
		case r >= 0xd800 && r < 0xdc00: // a high half: its low half must follow
			if i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if lo := hex4(raw[i+3:]); lo >= 0xdc00 && lo < 0xe000 {
					i += 6
					continue
				}
			}
			return false
		case r >= 0xdc00 && r < 0xe000:
			return false
		}
	}
	return true
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		}
	}
	return r
}
