package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// nested is v inside n arrays.
func nested(n int, v string) string { return strings.Repeat("[", n) + v + strings.Repeat("]", n) }

// TestParseSpecRefusesHostileJSON: what a decoder would silently change or what no
// reader could read back is refused, with the field named by its path.
func TestParseSpecRefusesHostileJSON(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, spec, field, reason string
	}{
		{"duplicate top-level key", `{"command":"echo FIRST","command":"echo SECOND"}`, "command", "given twice"},
		{"duplicate key in an origin", `{"command":"true","origin":{"chat":"a","x":{"id":1,"id":2}}}`, "origin.x.id", "given twice"},
		{"duplicate key in an object in an array", `{"command":"true","origin":{"l":[{"a":1},{"a":1,"a":2}]}}`, "origin.l[1].a", "given twice"},
		{"duplicate key in a sink", `{"command":"true","deliver":[{"type":"webhook","url":"http://a/","url":"http://b/"}]}`, "deliver[0].url", "given twice"},
		{"duplicate key in a completion", `{"command":"true","completion":{"type":"exit","type":"json_line"}}`, "completion.type", "given twice"},
		{"duplicate env name", `{"command":"true","env":{"A":"1","A":"2"}}`, "env.A", "given twice"},
		{"duplicate env name, once escaped", `{"command":"true","env":{"A":"1","\u0041":"2"}}`, "env.A", "given twice"},
		{"a field's name in another case in a sink", `{"command":"true","deliver":[{"type":"inbox"},{"type":"webhook","URL":"http://a/"}]}`, "deliver[1].URL", "unknown field"},
		{"a field's name in another case in a completion", `{"command":"true","completion":{"Type":"exit"}}`, "completion.Type", "unknown field"},
		{"invalid UTF-8 in the command", "{\"command\":\"echo \xff\xfe\"}", "command", "UTF-8"},
		{"invalid UTF-8 in an argv element", "{\"argv\":[\"echo\",\"\xc3\"]}", "argv[1]", "UTF-8"},
		{"invalid UTF-8 in an origin value", "{\"command\":\"true\",\"origin\":{\"a\":[\"ok\",\"\xed\xa0\x80\"]}}", "origin.a[1]", "UTF-8"},
		{"invalid UTF-8 in an origin key", "{\"command\":\"true\",\"origin\":{\"\xff\":1}}", "origin", "UTF-8"},
		{"invalid UTF-8 in a top-level key", "{\"command\":\"true\",\"\xff\":1}", "spec", "UTF-8"},
		{"a lone high surrogate escape", `{"command":"echo \ud800"}`, "command", "surrogate"},
		{"a lone low surrogate escape", `{"command":"true","kind":"\udc00x"}`, "kind", "surrogate"},
		{"a high surrogate before a non-surrogate escape", `{"command":"echo \ud800\u0041"}`, "command", "surrogate"},
		{"an origin nested deeper than the limit", `{"command":"true","origin":` + nested(engine.MaxJSONDepth+1, "1") + `}`, "origin", "nested deeper"},
		{"an origin nested 9,997 deep", `{"command":"true","origin":` + nested(9997, "") + `}`, "origin", "nested deeper"},
		{"a match value nested too deep", `{"command":"true","completion":{"type":"json_line","match":{"a":` + nested(engine.MaxJSONDepth, "1") + `}}}`, "completion", "nested deeper"},
		{"an origin over its byte limit", `{"command":"true","origin":"` + strings.Repeat("o", engine.MaxOriginBytes) + `"}`, "origin", "over the limit"},
		{"invalid UTF-8 after a number no decoder reads (1e400)", "{\"origin\":{\"n\":1e400},\"command\":\"echo \xff\"}", "command", "UTF-8"},
		{"a duplicate env name after a number no decoder reads", `{"origin":{"n":1e400},"command":"true","env":{"A":"1","A":"2"}}`, "env.A", "given twice"},
		{"NUL in a result argv", `{"command":"true","result":{"type":"command","argv":["cat","a\u0000b"]}}`, "result.argv", "NUL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := engine.ParseSpec([]byte(tc.spec))
			var fe *engine.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("ParseSpec = %+v, %v; want a *FieldError", got, err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("error %q: want field %q and a reason with %q", err, tc.field, tc.reason)
			}
		})
	}
}

// TestParseSpecAcceptsJSONAtItsLimits: the limits refuse only what is over them.
func TestParseSpecAcceptsJSONAtItsLimits(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{
		`{"command":"true","origin":` + nested(engine.MaxJSONDepth, "1") + `}`,
		`{"command":"true","origin":{"a":` + nested(engine.MaxJSONDepth-2, `{}`) + `}}`,
		`{"command":"true","origin":"` + strings.Repeat("o", engine.MaxOriginBytes-2) + `"}`,
		`{"command":"echo \ud83d\ude00 \u00e9 ✓ \ufffd \\ud800","kind":"ü"}`,
		`{"command":"true","origin":{"a":{"id":1},"b":{"id":1}},"env":{"A":"1","a":"2"}}`,
		`{"command":"true","completion":{"type":"json_line","match":{"a":` + nested(engine.MaxJSONDepth-2, "1") + `}}}`,
		`{"\u0063ommand":"true","origin":{"Command":[{"Type":1}]}}`, // a name escaped is the name; origin is free-form
	} {
		if _, err := engine.ParseSpec([]byte(spec)); err != nil {
			t.Errorf("ParseSpec(%.120s): %v", spec, err)
		}
	}
}

// TestCheckJSONNamesTheRoot: a document other than a spec (an API request) is named
// by the root it is given.
func TestCheckJSONNamesTheRoot(t *testing.T) {
	t.Parallel()
	err := engine.CheckJSON([]byte("{\"reason\":\"a\xffb\",\"id\":\"x\"}"), "request")
	var fe *engine.FieldError
	if !errors.As(err, &fe) || fe.Field != "reason" {
		t.Fatalf("CheckJSON = %v, want a *FieldError on reason", err)
	}
	if err := engine.CheckJSON([]byte(`{"id":"x","id":"y"}`), "request"); err == nil || !strings.HasPrefix(err.Error(), "id: ") {
		t.Fatalf("CheckJSON of a duplicate id = %v, want an error on id", err)
	}
	if err := engine.CheckJSON([]byte(`not json`), "request"); err != nil {
		t.Fatalf("CheckJSON of what is not JSON = %v, want nil: the decoder says why", err)
	}
}

// TestCheckJSONLeavesWhatIsNotJSONToTheDecoder: a document cut short or
// malformed anywhere passes the check, which stops there, for the decoder to say
// what is wrong with it.
func TestCheckJSONLeavesWhatIsNotJSONToTheDecoder(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		``, `{`, `[`, `"`, `"\`, `"\u12`, `{"a":"\u12"}`, `{"a":"\x"}`, `{"a"`, `{"a":`, `{"a":}`, `{"a":1,}`,
		`{"a":1 "b":2}`, `[1,`, `[1 2]`, `{a:1}`, "{\"a\":\"\x01\"}", `{"a":[{"b":1},`, `{"a":1}}`, `}`,
	} {
		if err := engine.CheckJSON([]byte(doc), "request"); err != nil {
			t.Errorf("CheckJSON(%q) = %v, want nil: the decoder says why", doc, err)
		}
		if _, err := engine.ParseSpec([]byte(doc)); err == nil {
			t.Errorf("ParseSpec(%q) passed", doc)
		}
	}
}

// FuzzCheckJSON: whatever the bytes, the check ends without a panic, with nil or
// a *FieldError, and so does the whole spec's parse.
func FuzzCheckJSON(f *testing.F) {
	for _, seed := range []string{
		`{"command":"true","env":{"A":"1"},"deliver":[{"type":"inbox"}],"origin":{"a":[1,{"b":"\ud83d\ude00"}]}}`,
		`{"command":"true","completion":{"type":"json_line","match":{"id":12345678901234567890}}}`,
		`{"a":"\u12`, `[[[[`, "{\"\xff\":1}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fe *engine.FieldError
		if err := engine.CheckJSON(data, "doc"); err != nil && !errors.As(err, &fe) {
			t.Fatalf("CheckJSON = %v, want nil or a *FieldError", err)
		}
		_, _ = engine.ParseSpec(data)
	})
}

// TestParseSpecNamesTheFirstProblemInTheDocument: of a spec's problems, the one
// written first is named; an array where the spec should be is no spec at all.
func TestParseSpecNamesTheFirstProblemInTheDocument(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, field, reason string }{
		{`{"Command":"x","env":{"A":"1","A":"2"}}`, "Command", "unknown field"},
		{`{"env":{"A":"1","A":"2"},"Command":"x"}`, "env.A", "given twice"},
		{"{\"kind\":\"\xff\",\"bogus\":1}", "kind", "UTF-8"},
		{`[{"bogus":1}]`, "spec", "not a JSON object"},
	} {
		_, err := engine.ParseSpec([]byte(tc.spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("ParseSpec(%s) = %v, want field %q and a reason with %q", tc.spec, err, tc.field, tc.reason)
		}
	}
}
