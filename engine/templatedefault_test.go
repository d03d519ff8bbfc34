package engine_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// A placeholder's default stands for its value when that is empty, in a prompt,
// an exec sink's argv and a webhook's body; a value that is not empty is kept.
func TestAPlaceholdersDefaultStandsForAnEmptyValue(t *testing.T) {
	t.Parallel()
	f := fired(t, taskID, `{"command":"true","origin":{"chat":"c-1","none":""},`+
		`"prompt":"to {{ origin.session | agent:main:main }} in {{origin.chat|nowhere}}, {{origin.none|-}}: {{reason|no reason}}{{reason|}}, {{result|none}}."}`)
	if got, want := f.state.Wakeup.Prompt, "to agent:main:main in c-1, -: no reason, ok."; got != want {
		t.Fatalf("the prompt %q, want %q", got, want)
	}
	w := events.Wakeup{ID: "t1", Status: "succeeded", Prompt: "p", Origin: []byte(`{"session":"s-9"}`)}
	if got, want := engine.RenderArgv([]string{"send", "--session={{origin.session|main}}", "--agent={{origin.agent|main}}"}, w),
		[]string{"send", "--session=s-9", "--agent=main"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("RenderArgv = %q, want %q", got, want)
	}
	body, err := engine.RenderBody(json.RawMessage(`{"agentId":"{{origin.agent|main}}","sessionKey":"{{origin.session|x}}","q":"{{origin.q|\"quoted\"}}"}`), w, false)
	if want := `{"agentId":"main","sessionKey":"s-9","q":"\"quoted\""}`; err != nil || string(body) != want {
		t.Fatalf("RenderBody = %s, %v; want %s", body, err, want)
	}
}

// A default is plain text: one that holds {{ is refused, naming the field.
func TestADefaultThatHoldsAPlaceholderIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, field string }{
		{`{"command":"x","prompt":"{{origin.a|{{result}}"}`, "prompt"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","body":{"k":"{{origin.a|{{b}}"}}]}`, "deliver[0].body.k"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a","{{origin.a|{{}}"]}]}`, "deliver[0].argv"},
	} {
		_, err := engine.ParseSpec([]byte(tc.spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, "holds {{: a default is plain text") {
			t.Errorf("ParseSpec(%s) = %v, want field %s", tc.spec, err, tc.field)
		}
	}
	if _, err := engine.ParseSpec([]byte(`{"command":"x","prompt":"{{nope|x}}"}`)); err == nil || !strings.Contains(err.Error(), "unknown placeholder {{nope}}") {
		t.Fatalf("an unknown placeholder with a default: %v", err)
	}
}

// With omit_empty, a body's string value that renders empty is left out: an
// object's member with its key (the first, a middle one, all of them), an
// array's element; a default that is not empty keeps it. Without it, the empty
// string stays.
func TestOmitEmptyLeavesOutWhatRendersEmpty(t *testing.T) {
	t.Parallel()
	w := events.Wakeup{ID: "t1", Status: "succeeded", Prompt: "done", Origin: []byte(`{"chat":"c-1"}`)}
	for _, tc := range []struct{ tmpl, omitted, kept string }{
		{`{"message":"{{prompt}}","sessionKey":"{{origin.session}}","wait":true}`, `{"message":"done","wait":true}`, `{"message":"done","sessionKey":"","wait":true}`},
		{`{"sessionKey":"{{origin.session}}","message":"{{prompt}}"}`, `{"message":"done"}`, `{"sessionKey":"","message":"done"}`},
		{`{"a":"{{origin.a}}","b":"{{origin.b}}"}`, `{}`, `{"a":"","b":""}`},
		{`{"to":["{{origin.a}}","{{origin.chat}}","{{origin.b}}",1],"deep":{"k":"{{origin.k}}","n":null}}`,
			`{"to":["c-1",1],"deep":{"n":null}}`, `{"to":["","c-1","",1],"deep":{"k":"","n":null}}`},
		{`{"agentId":"{{origin.agent|main}}","x":"{{origin.x|}}"}`, `{"agentId":"main"}`, `{"agentId":"main","x":""}`},
		{`"{{origin.none}}"`, `""`, `""`},
	} {
		for omit, want := range map[bool]string{true: tc.omitted, false: tc.kept} {
			body, err := engine.RenderBody(json.RawMessage(tc.tmpl), w, omit)
			if err != nil || string(body) != want {
				t.Errorf("RenderBody(%s, omit_empty %v) = %s, %v; want %s", tc.tmpl, omit, body, err, want)
			}
		}
	}
	for _, tc := range []struct{ spec, reason string }{
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","omit_empty":true}]}`, "only with a body"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"omit_empty":true}]}`, "only with type webhook"},
	} {
		_, err := engine.ParseSpec([]byte(tc.spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != "deliver[0].omit_empty" || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("ParseSpec(%s) = %v, want deliver[0].omit_empty: ...%s", tc.spec, err, tc.reason)
		}
	}
}

// A real pusher posts a body whose empty session is left out and whose agent
// takes its default, as OpenClaw's /hooks/agent wants it.
func TestAPushLeavesOutAnEmptySessionAndDefaultsTheAgent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bodies := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		bodies <- string(data)
	}))
	t.Cleanup(srv.Close)
	fireInStore(t, b.store, "agent-hook", `{"command":"true","prompt":"done","origin":{"chat":"c-1"},"deliver":[{"type":"webhook","url":"`+srv.URL+`","omit_empty":true,`+
		`"body":{"message":"{{prompt}}","sessionKey":"{{origin.session}}","agentId":"{{origin.agent|main}}","waitForCompletion":true}}]}`)
	startReplica(t, b.store, engine.Engine{Writer: "engine-a", Instance: "a"})
	waitDelivered(t, b.store, "agent-hook")
	var got string
	select {
	case got = <-bodies: // posted before the push was recorded delivered
	case <-time.After(10 * time.Second):
		t.Fatal("no body posted")
	}
	if want := `{"message":"done","agentId":"main","waitForCompletion":true}`; got != want {
		t.Fatalf("the receiver got %s, want %s", got, want)
	}
}
