package gemini

import (
	"encoding/json"
	"strings"
	"testing"
)

const prefix = "'/usr/local/bin/bgtask' --home '/h'"

// theirs is a user's settings: keys in their own order, steering turned off by
// hand, a shell setting beside the one setup sets, a BeforeTool hook of theirs,
// an AfterAgent group that mixes their handler with an old one of bgtask's,
// and a command with characters JSON encoders like to escape.
const theirs = `{
  "theme": "keep-me",
  "experimental": {"modelSteering": false, "plan": true},
  "tools": {"shell": {"enableInteractiveShell": true}},
  "hooks": {
    "BeforeTool": [{"matcher": "write_file", "hooks": [{"type": "command", "command": "./lint.sh && echo <ok>", "timeout": 5000}]}],
    "AfterAgent": [{"hooks": [{"type": "command", "command": "./log.sh"}, {"type": "command", "command": "/old/bgtask hook gemini AfterAgent"}]}]
  },
  "security": {"auth": {"selectedType": "gemini-api-key"}}
}`

type settingsDoc struct {
	Experimental map[string]any `json:"experimental"`
	Tools        struct {
		Shell map[string]any `json:"shell"`
	} `json:"tools"`
	Hooks map[string][]struct {
		Matcher string `json:"matcher"`
		Hooks   []struct {
			Name    string `json:"name"`
			Type    string `json:"type"`
			Command string `json:"command"`
			Timeout int    `json:"timeout"`
		} `json:"hooks"`
	} `json:"hooks"`
}

func read(t *testing.T, data []byte) settingsDoc {
	t.Helper()
	var s settingsDoc
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, data)
	}
	return s
}

// commands lists every command of an event, with its group's matcher.
func commands(t *testing.T, data []byte, event string) []string {
	t.Helper()
	var out []string
	for _, g := range read(t, data).Hooks[event] {
		for _, h := range g.Hooks {
			out = append(out, g.Matcher+": "+h.Command)
		}
	}
	return out
}

func TestInstallKeepsTheirsAndIsIdempotent(t *testing.T) {
	once, err := Install([]byte(theirs), prefix)
	if err != nil {
		t.Fatal(err)
	}
	s := read(t, once)
	if s.Experimental["modelSteering"] != true || s.Experimental["plan"] != true {
		t.Errorf("experimental: %v", s.Experimental)
	}
	if s.Tools.Shell["backgroundCompletionBehavior"] != "inject" || s.Tools.Shell["enableInteractiveShell"] != true {
		t.Errorf("tools.shell: %v", s.Tools.Shell)
	}
	want := map[string][]string{
		"BeforeTool":   {"write_file: ./lint.sh && echo <ok>", "run_shell_command: " + prefix + " hook gemini BeforeTool"},
		"AfterAgent":   {": ./log.sh", ": " + prefix + " hook gemini AfterAgent"},
		"BeforeAgent":  {": " + prefix + " hook gemini BeforeAgent"},
		"SessionStart": {": " + prefix + " hook gemini SessionStart"},
		"SessionEnd":   {": " + prefix + " hook gemini SessionEnd"},
	}
	for event, w := range want {
		if got := commands(t, once, event); strings.Join(got, "\n") != strings.Join(w, "\n") {
			t.Errorf("%s: %q, want %q", event, got, w)
		}
	}
	if !strings.Contains(string(once), "echo <ok>") {
		t.Errorf("a command's characters were escaped:\n%s", once)
	}
	if i, j := strings.Index(string(once), `"theme"`), strings.Index(string(once), `"security"`); i < 0 || j < i {
		t.Errorf("the user's keys lost their order:\n%s", once)
	}
	twice, err := Install(once, prefix)
	if err != nil || string(twice) != string(once) {
		t.Errorf("a second install changed the settings (%v):\n%s", err, twice)
	}
	moved, err := Install(once, "'/new/bgtask' --home '/h'")
	if err != nil {
		t.Fatal(err)
	}
	if got := commands(t, moved, "SessionEnd"); len(got) != 1 || !strings.Contains(got[0], "/new/bgtask") {
		t.Errorf("a setup with bgtask moved left: %q", got)
	}
}

// Remove gives each setting the value the user had before setup, takes out
// what setup alone had put, and keeps what the user changed since.
func TestRemoveTakesOutExactlyWhatInstallPutIn(t *testing.T) {
	installed, err := Install([]byte(theirs), prefix)
	if err != nil {
		t.Fatal(err)
	}
	out, empty, err := Remove(installed, []byte(theirs))
	if err != nil || empty {
		t.Fatalf("remove: %v (empty %v)", err, empty)
	}
	// The old handler of bgtask's goes too.
	want := strings.Replace(theirs, `, {"type": "command", "command": "/old/bgtask hook gemini AfterAgent"}`, "", 1)
	if !sameJSON(t, out, want) {
		t.Errorf("after remove:\n%s\nwant the value of\n%s", out, want)
	}
	again, _, err := Remove(out, []byte(theirs))
	if err != nil || string(again) != string(out) {
		t.Errorf("a second remove changed the settings (%v):\n%s", err, again)
	}

	// Nothing before setup, and the user set a setting of their own since.
	installed, err = Install(nil, prefix)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(installed), `"backgroundCompletionBehavior": "inject"`, `"backgroundCompletionBehavior": "notify"`, 1)
	out, empty, err = Remove([]byte(changed), nil)
	if err != nil || empty {
		t.Fatalf("remove: %v (empty %v)", err, empty)
	}
	if !sameJSON(t, out, `{"tools": {"shell": {"backgroundCompletionBehavior": "notify"}}}`) {
		t.Errorf("after remove: %s", out)
	}
	out, empty, err = Remove(installed, nil)
	if err != nil || !empty || !sameJSON(t, out, `{}`) {
		t.Errorf("remove of a setup over nothing: %s (empty %v, %v)", out, empty, err)
	}
}

// Objects that the original had stay, even empty; those setup made go.
func TestRemoveKeepsTheUsersEmptyObjects(t *testing.T) {
	const mine = `{"tools": {}, "hooks": {}}`
	installed, err := Install([]byte(mine), prefix)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := Remove(installed, []byte(mine))
	if err != nil || !sameJSON(t, out, mine) {
		t.Errorf("after remove: %s (%v), want the value of %s", out, err, mine)
	}
}

func TestBadSettingsAreRefused(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"not JSON", `{"theme": `, "not JSON"},
		{"an array", `[1]`, "not a JSON object"},
		{"a line comment", "{\n  // mine\n  \"theme\": \"x\"\n}", "has comments"},
		{"a block comment", `{"theme": /* dark */ "x"}`, "has comments"},
		{"hooks not an object", `{"hooks": []}`, "hooks: not a JSON object"},
		{"experimental not an object", `{"experimental": true}`, "experimental: not a JSON object"},
		{"tools.shell not an object", `{"tools": {"shell": "bash"}}`, "tools.shell: not a JSON object"},
		{"key twice", `{"a": 1, "a": 2}`, `key "a" twice`},
		{"event not an array", `{"hooks": {"AfterAgent": {}}}`, "hooks.AfterAgent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Install([]byte(tc.data), prefix); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("install: %v, want an error with %q", err, tc.want)
			}
		})
	}
	// Slashes in strings are no comments.
	if _, err := Install([]byte(`{"url": "http://x/*y*/", "p": "a\"//b"}`), prefix); err != nil {
		t.Errorf("install over slashes in strings: %v", err)
	}
	if _, _, err := Remove([]byte(`{"a": 1} // x`), nil); err == nil || !strings.Contains(err.Error(), "has comments") {
		t.Errorf("remove over comments: %v", err)
	}
}

func TestHooksDisabled(t *testing.T) {
	for data, want := range map[string]bool{
		`{}`:                                             false,
		`{"hooksConfig": {"enabled": true}}`:             false,
		`{"hooksConfig": {"enabled": false}}`:            true,
		`{"hooksConfig": {"disabled": ["bgtask"]}}`:      true,
		`{"hooksConfig": {"disabled": ["lint"]}}`:        false,
		`{"hooksConfig": {"enabled": "yes, of course"}}`: false,
	} {
		if got := HooksDisabled([]byte(data)); got != want {
			t.Errorf("%s: %v, want %v", data, got, want)
		}
	}
}

func sameJSON(t *testing.T, a []byte, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, a)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatal(err)
	}
	xs, _ := json.Marshal(x)
	ys, _ := json.Marshal(y)
	return string(xs) == string(ys)
}
