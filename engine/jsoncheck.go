package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
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
func CheckJSON(data []byte, root string) error { return checkJSON(data, root, nil) }

// fieldTree holds the names an object's fields may have, each with the tree of
// its value where that is an object, or a list of objects, with fields of its own
// (nil where it is not: a map, a free-form value).
type fieldTree map[string]fieldTree

// fieldsOf is the fieldTree of struct type t, by the wire names of its fields.
func fieldsOf(t reflect.Type) fieldTree {
	fields := fieldTree{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
			continue // never decoded
		case name == "":
			name = f.Name
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		var nested fieldTree
		if ft.Kind() == reflect.Struct {
			nested = fieldsOf(ft)
		}
		fields[name] = nested
	}
	return fields
}

// checkJSON is CheckJSON that, where fields is not nil, also refuses an object
// key that fields does not name exactly, at the top and below it.
//
// It reads the document once, in place: a spec is checked with each registration
// (and a request around it too), and a decoder's tokens cost an allocation each,
// the caller's environment hundreds.
func checkJSON(data []byte, root string, fields fieldTree) error {
	c := jsonChecker{data: data, root: root, top: root}
	if err := c.value(0, fields, false); err != errNotJSON {
		return err
	}
	return nil
}

// errNotJSON stops a check at what is not JSON: the decoder says why.
var errNotJSON = errors.New("not JSON")

// jsonChecker reads a JSON document for checkJSON.
type jsonChecker struct {
	data []byte
	i    int // where it reads
	root string
	top  string     // the top-level field the value read belongs to, for depth errors
	path []pathPart // of the value read
}

// pathPart is a step in a value's path: the key of an object's field, or an
// index in an array.
type pathPart struct {
	key   string
	index int // -1 for a key
}

// value checks the value at c.i, inside depth arrays and objects. An object is
// checked against fields where that is not nil, and so are the objects an array
// holds where the array is an object field's value (ofField).
func (c *jsonChecker) value(depth int, fields fieldTree, ofField bool) error {
	c.space()
	if c.i >= len(c.data) {
		return errNotJSON
	}
	switch b := c.data[c.i]; b {
	case '{', '[':
		if depth > MaxJSONDepth {
			return fieldErr(orRoot(c.top, c.root), "nested deeper than %d levels", MaxJSONDepth)
		}
		if b == '{' {
			return c.object(depth, fields)
		}
		if !ofField {
			fields = nil
		}
		return c.array(depth, fields)
	case '"':
		start := c.i
		if !c.str() {
			return errNotJSON
		}
		if !validString(c.data[start:c.i]) {
			return fieldErr(orRoot(c.pathString(), c.root), "not valid UTF-8 (or holds a lone surrogate escape)")
		}
		return nil
	default: // a number, true, false or null: its syntax is the decoder's to check
		start := c.i
		for c.i < len(c.data) && isLiteralByte(c.data[c.i]) {
			c.i++
		}
		if c.i == start {
			return errNotJSON
		}
		return nil
	}
}

func (c *jsonChecker) object(depth int, fields fieldTree) error {
	if c.open('}') {
		return nil
	}
	var keys map[string]bool
	for {
		c.space()
		start := c.i
		if c.i >= len(c.data) || c.data[c.i] != '"' || !c.str() {
			return errNotJSON
		}
		raw := c.data[start:c.i]
		if !validString(raw) {
			var key string
			_ = json.Unmarshal(raw, &key) // as the decoder reads it
			return fieldErr(orRoot(c.pathString(), c.root), "the key %q is not valid UTF-8 (or holds a lone surrogate escape)", key)
		}
		var key string
		if bytes.IndexByte(raw, '\\') < 0 {
			key = string(raw[1 : len(raw)-1])
		} else if json.Unmarshal(raw, &key) != nil {
			return errNotJSON
		}
		if keys == nil {
			keys = map[string]bool{}
		}
		if keys[key] {
			return fieldErr(join(c.pathString(), key), "the key is given twice; each key may appear once")
		}
		keys[key] = true
		var nested fieldTree
		if fields != nil {
			var known bool
			if nested, known = fields[key]; !known {
				return fieldErr(join(c.pathString(), key), "unknown field")
			}
		}
		if c.space(); c.i >= len(c.data) || c.data[c.i] != ':' {
			return errNotJSON
		}
		c.i++
		if depth == 0 {
			c.top = key
		}
		c.path = append(c.path, pathPart{key: key, index: -1})
		if err := c.value(depth+1, nested, true); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
		if closed, err := c.next('}'); closed || err != nil {
			return err
		}
	}
}

func (c *jsonChecker) array(depth int, elems fieldTree) error {
	if c.open(']') {
		return nil
	}
	for index := 0; ; index++ {
		c.path = append(c.path, pathPart{index: index})
		if err := c.value(depth+1, elems, false); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
		if closed, err := c.next(']'); closed || err != nil {
			return err
		}
	}
}

// open reads past the bracket at c.i, and past end too where it follows at once:
// true for an empty object or array.
func (c *jsonChecker) open(end byte) bool {
	c.i++
	if c.space(); c.i < len(c.data) && c.data[c.i] == end {
		c.i++
		return true
	}
	return false
}

// next reads past what follows a member of an object or array: a comma, or end,
// which closes it (closed).
func (c *jsonChecker) next(end byte) (closed bool, err error) {
	if c.space(); c.i >= len(c.data) {
		return false, errNotJSON
	}
	switch c.data[c.i] {
	case ',':
		c.i++
		return false, nil
	case end:
		c.i++
		return true, nil
	}
	return false, errNotJSON
}

// str reads past the string at c.i; false if it is not one.
func (c *jsonChecker) str() bool {
	for c.i++; c.i < len(c.data); c.i++ {
		switch b := c.data[c.i]; {
		case b == '"':
			c.i++
			return true
		case b < 0x20:
			return false
		case b == '\\':
			if c.i++; c.i >= len(c.data) {
				return false
			}
			switch c.data[c.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if c.i+4 >= len(c.data) {
					return false
				}
				for _, h := range c.data[c.i+1 : c.i+5] {
					if !isHex(h) {
						return false
					}
				}
				c.i += 4
			default:
				return false
			}
		}
	}
	return false
}

func (c *jsonChecker) space() {
	for c.i < len(c.data) {
		switch c.data[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// pathString is the path of the value read, as a FieldError names it: "" for
// the document and its top-level fields' parent.
func (c *jsonChecker) pathString() string {
	path := ""
	for _, p := range c.path {
		if p.index < 0 {
			path = join(path, p.key)
		} else {
			path = fmt.Sprintf("%s[%d]", orRoot(path, c.root), p.index)
		}
	}
	return path
}

func isLiteralByte(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '-' || b == '+' || b == '.'
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F'
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

// validString reports whether the raw text of a JSON string, quotes included,
// decodes to itself: UTF-8, and every \u escape of a surrogate one half of a pair.
// Its syntax has been checked (jsonChecker.str).
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
