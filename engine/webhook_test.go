package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

func TestWebhookBodyAndBearerAreValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, field, reason string }{
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","body":{"text":"{{nope}}"}}]}`, "deliver[0].body.text", "unknown placeholder {{nope}}"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","body":{"a":[1,{"b":"{{prompt"}]}}]}`, "deliver[0].body.a[1].b", "unclosed {{"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","body":"{{exit_code}"}]}`, "deliver[0].body", "unclosed {{"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"body":{"text":"x"}}]}`, "deliver[0].body", "only with type webhook"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"bearer":"openclaw"}]}`, "deliver[0].bearer", "only with type webhook"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","bearer":"no spaces"}]}`, "deliver[0].bearer", "letters, digits"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","body":{"t":"x","t":"y"}}]}`, "deliver[0].body.t", "given twice"},
	} {
		_, err := engine.ParseSpec([]byte(tc.spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("ParseSpec(%s) = %v, want field %s: ...%s...", tc.spec, err, tc.field, tc.reason)
		}
	}
	spec := mustSpec(t, `{"command":"x","deliver":[{"type":"webhook","url":"http://h/","body":null},
		{"type":"webhook","url":"http://h/","bearer":"openclaw","body":{"text":"{{prompt}} {{origin.chat}} {{tail}}","mode":"now","n":[1,true,null]}}]}`)
	if spec.Deliver[0].Body != nil || spec.Deliver[1].Bearer != "openclaw" || spec.Deliver[1].Body == nil {
		t.Fatalf("sinks = %+v", spec.Deliver)
	}
}

func prefixes(t *testing.T, raw ...string) []engine.URLPrefix {
	t.Helper()
	var out []engine.URLPrefix
	for _, r := range raw {
		p, err := engine.ParseURLPrefix(r)
		if err != nil {
			t.Fatalf("ParseURLPrefix(%s): %v", r, err)
		}
		out = append(out, p)
	}
	return out
}

func TestURLPrefixesRefuseWhatIsNotTheirs(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"ftp://h/", "http:///x", "http://u:p@h/", "http://h/x?token=1", "http://h/x#f", "http://h/a/../b", "http://h/a;b", `http://h/a\b`, "h/x"} {
		if _, err := engine.ParseURLPrefix(raw); err == nil {
			t.Errorf("ParseURLPrefix(%s) accepted", raw)
		}
	}
	b := engine.WebhookBearer{Name: "openclaw", Prefixes: prefixes(t, "http://127.0.0.1:18789/hooks", "https://Hooks.Example.com/bgtask/")}
	for url, allowed := range map[string]bool{
		"http://127.0.0.1:18789/hooks":                    true,
		"http://127.0.0.1:18789/hooks/wake":               true,
		"http://127.0.0.1:18789/hooks/wake?x=1":           true,
		"https://hooks.example.com/bgtask/x":              true,
		"https://HOOKS.example.com/bgtask/":               true,
		"https://hooks.example.com/bgtask":                false, // the prefix ends with a slash
		"http://127.0.0.1:18789/hooksmith":                false,
		"http://127.0.0.1:18789/":                         false,
		"http://127.0.0.1:18790/hooks/wake":               false,
		"https://127.0.0.1:18789/hooks/wake":              false,
		"http://127.0.0.1/hooks/wake":                     false,
		"http://127.0.0.1:18789.evil.example/hooks":       false,
		"https://hooks.example.com.evil.example/bgtask/x": false,
		"https://hooks.example.com:443/bgtask/x":          false,
		"http://127.0.0.1:18789/hooks/../admin":           false,
		"http://127.0.0.1:18789/hooks/%2e%2e/admin":       false,
		"http://127.0.0.1:18789/hooks%2F..%2Fadmin":       false,
		"http://127.0.0.1:18789/hooks%2Fwake":             false,
		`http://127.0.0.1:18789/hooks/..\admin`:           false,
		"http://127.0.0.1:18789/hooks/..;/admin":          false,
		"http://x@127.0.0.1:18789/hooks/wake":             false,
		"http://127.0.0.1:18789@evil.example/hooks/wake":  false,
	} {
		if got := b.Allows(url); got != allowed {
			t.Errorf("Allows(%s) = %v, want %v", url, got, allowed)
		}
	}
}

// TestBearersAreCheckedAtRegistration: a spec may name only a bearer the server
// declares, by a flag or in its home, and only for a URL under its prefixes, or
// its token would go where a client chose; a flag's bearer wins over the home's
// of the same name, and a home declaration that cannot be read is refused.
func TestBearersAreCheckedAtRegistration(t *testing.T) {
	t.Parallel()
	flags := engine.WebhookBearers{"openclaw": {Name: "openclaw", File: "/run/token", Prefixes: prefixes(t, "http://127.0.0.1:18789/hooks/")}}
	home := func(name string) (engine.WebhookBearer, bool, error) {
		switch name {
		case "gateway", "openclaw":
			return engine.WebhookBearer{Name: name, Held: "tok", Prefixes: prefixes(t, "http://127.0.0.1:18800/hooks/agent")}, true, nil
		case "damaged":
			return engine.WebhookBearer{}, false, errors.New("its declaration in the server's home is damaged")
		}
		return engine.WebhookBearer{}, false, nil
	}
	bearers := engine.Bearers{Flags: flags, Home: home}
	sink := func(url, bearer string) engine.Spec {
		return mustSpec(t, `{"command":"x","deliver":[{"type":"exec","argv":["true"]},{"type":"webhook","url":"`+url+`","bearer":"`+bearer+`"}]}`)
	}
	for _, tc := range []struct {
		bearers     engine.Bearers
		spec        engine.Spec
		field, want string
	}{
		{bearers, sink("http://127.0.0.1:18789/hooks/wake", "other"), "deliver[1].bearer", `"other": this server declares no such bearer token (server --webhook-bearer, or a setup such as 'bgtask setup openclaw'; declared by flags: openclaw)`},
		{engine.Bearers{}, sink("http://127.0.0.1:18789/hooks/wake", "openclaw"), "deliver[1].bearer", "declared by flags: none"},
		{bearers, sink("https://attacker.example/collect", "openclaw"), "deliver[1].url", `not under a URL prefix of bearer "openclaw" (http://127.0.0.1:18789/hooks/)`},
		{bearers, sink("http://127.0.0.1:18800/hooks/agent", "openclaw"), "deliver[1].url", `not under a URL prefix of bearer "openclaw" (http://127.0.0.1:18789/hooks/)`},
		{bearers, sink("http://127.0.0.1:18800/hooks/wake", "gateway"), "deliver[1].url", `not under a URL prefix of bearer "gateway" (http://127.0.0.1:18800/hooks/agent)`},
		{bearers, sink("http://127.0.0.1:18800/hooks/agent", "damaged"), "deliver[1].bearer", `"damaged": its declaration in the server's home is damaged`},
	} {
		err := tc.bearers.Check(tc.spec)
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.want) {
			t.Errorf("Check(%s with %s) = %v, want %s: ...%s...", tc.spec.Deliver[1].URL, tc.spec.Deliver[1].Bearer, err, tc.field, tc.want)
		}
	}
	for _, spec := range []engine.Spec{
		sink("http://127.0.0.1:18789/hooks/wake", "openclaw"),
		sink("http://127.0.0.1:18800/hooks/agent", "gateway"),
		mustSpec(t, `{"command":"x","deliver":[{"type":"webhook","url":"https://anywhere.example/"}]}`),
	} {
		if err := bearers.Check(spec); err != nil {
			t.Errorf("Check(%+v): %v", spec.Deliver, err)
		}
	}
}

func bodyWakeup(prompt string) events.Wakeup {
	code := 1
	return events.Wakeup{
		ID: "t1", Status: "failed", ExitCode: &code, Prompt: prompt, Kind: "build", Command: "make",
		Tail: []string{"a", "b"}, Origin: json.RawMessage(`{"chat":9007199254740993,"name":"x\"y"}`),
	}
}

// TestRenderBodyIsJSONWhateverThePromptHolds: the values are written as JSON
// strings, so quotes, newlines, control bytes and invalid UTF-8 in a prompt leave
// the body valid, and the template's other values and order stay as written.
func TestRenderBodyIsJSONWhateverThePromptHolds(t *testing.T) {
	t.Parallel()
	prompt := "He said \"done\"\nnext line\t\x00\x01\x1b[31m \\ </script> \u2028 end \xff"
	tmpl := json.RawMessage(`{"text": "Task {{task_id}}: {{prompt}}", "mode": "now", "n": 9007199254740993, "ok": true, "none": null,
		"meta": {"exit": "{{exit_code}}", "chat": "{{origin.chat}}", "name": "{{origin.name}}", "lines": ["{{tail}}", 1.50]}, "{{prompt}}": "key"}`)
	body, err := engine.RenderBody(tmpl, bodyWakeup(prompt), false)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(body) {
		t.Fatalf("body is not JSON: %s", body)
	}
	var got struct {
		Text, Mode string
		N          json.Number
		OK         bool
		None       *string
		Meta       struct {
			Exit, Chat, Name string
			Lines            []any
		}
		Key string `json:"{{prompt}}"`
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := "Task t1: " + strings.ToValidUTF8(prompt, "\uFFFD")
	if got.Text != want || got.Mode != "now" || got.N != "9007199254740993" || !got.OK || got.None != nil ||
		got.Meta.Exit != "1" || got.Meta.Chat != "9007199254740993" || got.Meta.Name != `x"y` || got.Meta.Lines[0] != "a\nb" ||
		got.Meta.Lines[1] != json.Number("1.50") || got.Key != "key" {
		t.Fatalf("body decodes to %+v\nfrom %s", got, body)
	}
	if i, j := strings.Index(string(body), `"text"`), strings.Index(string(body), `"mode"`); i < 0 || j < i {
		t.Errorf("keys out of the template's order: %s", body)
	}
}

// TestRenderBodyStaysWithinTheBudget: a template that repeats a wake-up-sized
// prompt is cut to MaxWakeupBytes with the budget's markers, never rendered whole.
func TestRenderBodyStaysWithinTheBudget(t *testing.T) {
	t.Parallel()
	prompt := strings.Repeat("line of output \"quoted\"\n", 10_000) // ≈ 260 KB as JSON
	for _, tmpl := range []string{
		`{"text":"{{prompt}}","mode":"now"}`,
		`{"a":"{{prompt}}","b":"{{prompt}}","c":["{{prompt}} {{prompt}}"]}`,
		`"` + strings.Repeat("{{prompt}}", 500) + `"`,
	} {
		body, err := engine.RenderBody(json.RawMessage(tmpl), bodyWakeup(prompt), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(body) > engine.MaxWakeupBytes || !json.Valid(body) || !utf8.Valid(body) {
			t.Fatalf("%.40s: %d bytes (budget %d), valid JSON %v", tmpl, len(body), engine.MaxWakeupBytes, json.Valid(body))
		}
		if !strings.Contains(string(body), "to fit bgtask's byte budget]") {
			t.Errorf("%.40s: cut without the budget's marker", tmpl)
		}
	}
}

// TestRegisterRefusesABearerTheServerDoesNotAllow: a registration that names an
// undeclared bearer, or a declared one for a URL outside its prefixes, is refused
// with the field and appends nothing; a service with no bearers refuses them all.
func TestRegisterRefusesABearerTheServerDoesNotAllow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register(t, `{"command":"true"}`)
	declared := engine.NewService(b.store, engineWriter, engine.Base{})
	declared.DeclareBearers(engine.Bearers{Flags: engine.WebhookBearers{"openclaw": {Name: "openclaw", Env: "OPENCLAW_TOKEN", Prefixes: prefixes(t, "http://127.0.0.1:18789/hooks/")}}})
	none := engine.NewService(b.store, engineWriter, engine.Base{})
	hook := func(url, bearer string) string {
		return `{"command":"true","deliver":[{"type":"webhook","url":"` + url + `","bearer":"` + bearer + `","body":{"text":"{{prompt}}","mode":"now"}}]}`
	}
	for _, tc := range []struct {
		svc         *engine.Service
		spec, field string
	}{
		{declared, hook("http://127.0.0.1:18789/hooks/wake", "github"), "deliver[0].bearer"},
		{declared, hook("https://attacker.example/hooks/wake", "openclaw"), "deliver[0].url"},
		{declared, hook("http://127.0.0.1:18789/admin", "openclaw"), "deliver[0].url"},
		{none, hook("http://127.0.0.1:18789/hooks/wake", "openclaw"), "deliver[0].bearer"},
	} {
		before := b.lastSeq(t)
		id, _, err := tc.svc.Register(context.Background(), []byte(tc.spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || id != "" {
			t.Errorf("Register(%s) = %q, %v; want a FieldError on %s", tc.spec, id, err, tc.field)
		}
		if got := b.lastSeq(t); got != before {
			t.Fatalf("stream LastSeq moved from %d to %d", before, got)
		}
	}
	if _, _, err := declared.Register(context.Background(), []byte(hook("http://127.0.0.1:18789/hooks/wake", "openclaw"))); err != nil {
		t.Fatalf("under the prefix: %v", err)
	}
}
