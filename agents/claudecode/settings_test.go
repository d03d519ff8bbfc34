package claudecode

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

const prefix = "'/usr/local/bin/bgtask' --home '/h'"

// theirs is a user's settings: keys in their own order, a Stop hook of theirs, a
// PostToolUse group that mixes their handler with an old one of bgtask's, and a
// command with characters JSON encoders like to escape.
const theirs = `{
  "permissions": {"allow": ["Bash"]},
  "model": "opus",
  "hooks": {
    "Stop": [{"hooks": [{"type": "command", "command": "notify-send done && echo <ok>", "timeout": 5}]}],
    "PostToolUse": [{"matcher": "Edit", "hooks": [{"type": "command", "command": "./fmt.sh"}, {"type": "command", "command": "/old/bgtask hook claude-code wake"}]}]
  },
  "env": {"A": "1"}
}`

type settings struct {
	Hooks map[string][]struct {
		Matcher string `json:"matcher"`
		Hooks   []struct {
			Type        string `json:"type"`
			Command     string `json:"command"`
			AsyncRewake bool   `json:"asyncRewake"`
			Timeout     int    `json:"timeout"`
		} `json:"hooks"`
	} `json:"hooks"`
}

func read(t *testing.T, data []byte) settings {
	t.Helper()
	var s settings
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, data)
	}
	return s
}

// commands lists every command of an event, ours marked.
func commands(t *testing.T, data []byte, event string) []string {
	t.Helper()
	var out []string
	for _, g := range read(t, data).Hooks[event] {
		for _, h := range g.Hooks {
			out = append(out, h.Command)
		}
	}
	return out
}

func TestInstallKeepsTheirsAndIsIdempotent(t *testing.T) {
	once, err := Install([]byte(theirs), prefix, ScopeUser)
	if err != nil {
		t.Fatal(err)
	}
	twice, err := Install(once, prefix, ScopeUser)
	if err != nil {
		t.Fatal(err)
	}
	if string(twice) != string(once) {
		t.Fatalf("a second install changed the settings:\n%s\n---\n%s", once, twice)
	}
	// Settings the user reformatted, bgtask's hooks in them as installed: untouched.
	var compact bytes.Buffer
	if err := json.Compact(&compact, once); err != nil {
		t.Fatal(err)
	}
	if again, err := Install(compact.Bytes(), prefix, ScopeUser); err != nil || string(again) != compact.String() {
		t.Fatalf("an install over installed hooks rewrote the file (%v):\n%s", err, again)
	}
	s := string(once)
	for _, want := range []string{`"notify-send done && echo <ok>"`, `"./fmt.sh"`, `"A": "1"`, `"allow": [`} {
		if !strings.Contains(s, want) {
			t.Errorf("lost %s:\n%s", want, s)
		}
	}
	if strings.Contains(s, "/old/bgtask") {
		t.Errorf("the old bgtask hook is still there:\n%s", s)
	}
	if p, m, e := strings.Index(s, `"permissions"`), strings.Index(s, `"model"`), strings.Index(s, `"env"`); p >= m || m >= e {
		t.Errorf("the user's keys changed order:\n%s", s)
	}
	stop := commands(t, once, "Stop")
	if len(stop) != 3 || stop[0] != "notify-send done && echo <ok>" || stop[1] != prefix+" hook claude-code Stop" || stop[2] != prefix+" hook claude-code wake" {
		t.Errorf("Stop hooks: %q", stop)
	}
	if post := commands(t, once, "PostToolUse"); len(post) != 2 || post[0] != "./fmt.sh" || post[1] != prefix+" hook claude-code wake" {
		t.Errorf("PostToolUse hooks: %q", post)
	}
	waiters := 0
	for event, groups := range read(t, once).Hooks {
		for _, g := range groups {
			for _, h := range g.Hooks {
				if !IsOurs(h.Command) {
					continue
				}
				if strings.HasSuffix(h.Command, " "+Wake) {
					waiters++
					if !h.AsyncRewake || h.Timeout != WakeTimeoutSeconds {
						t.Errorf("%s: the waiter is not asyncRewake with the long timeout: %+v", event, h)
					}
				} else if h.AsyncRewake || h.Timeout != HookTimeoutSeconds {
					t.Errorf("%s: a quick hook runs in the background or unbounded: %+v", event, h)
				}
			}
		}
	}
	if waiters != 4 {
		t.Errorf("%d waiters in the user scope, want 4 (SessionStart, UserPromptSubmit, PostToolUse, Stop)", waiters)
	}
}

func TestInstallOnNothingAndRemoveLeavesNoTrace(t *testing.T) {
	for _, scope := range []Scope{ScopeUser, ScopeProject} {
		data, err := Install(nil, "bgtask", scope)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "bgtask hook claude-code UserPromptSubmit") {
			t.Fatalf("%s: %s", scope, data)
		}
		if scope == ScopeProject && strings.Contains(strings.Join(commands(t, data, "SessionStart"), "\n"), Wake) {
			t.Errorf("a project's SessionStart cannot wake the session, yet it has a waiter:\n%s", data)
		}
		out, err := Remove(data)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(out)) != "{}" {
			t.Errorf("%s: after remove: %s", scope, out)
		}
	}
}

func TestRemoveTakesOutExactlyOurs(t *testing.T) {
	installed, err := Install([]byte(theirs), prefix, ScopeUser)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Remove(installed)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "claude-code") {
		t.Fatalf("bgtask's hooks are left:\n%s", out)
	}
	if got := commands(t, out, "Stop"); len(got) != 1 || got[0] != "notify-send done && echo <ok>" {
		t.Errorf("Stop: %q", got)
	}
	if got := commands(t, out, "PostToolUse"); len(got) != 1 || got[0] != "./fmt.sh" {
		t.Errorf("PostToolUse: %q", got)
	}
	for _, event := range []string{"SessionStart", "UserPromptSubmit", "SessionEnd"} {
		if _, ok := read(t, out).Hooks[event]; ok {
			t.Errorf("an empty %s is left:\n%s", event, out)
		}
	}
	again, err := Remove(out)
	if err != nil || string(again) != string(out) {
		t.Errorf("a second remove changed the settings (%v):\n%s", err, again)
	}
}

func TestBadSettingsAreRefused(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"not JSON", `{"model": `, "not JSON"},
		{"an array", `[1]`, "not a JSON object"},
		{"two documents", `{} {}`, "more after"},
		{"hooks not an object", `{"hooks": []}`, "hooks: not a JSON object"},
		{"key twice", `{"a": 1, "a": 2}`, `key "a" twice`},
		{"event not an array", `{"hooks": {"Stop": {}}}`, "hooks.Stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Install([]byte(tc.data), prefix, ScopeUser)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("install: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := ParseScope("global"); err == nil || !strings.Contains(err.Error(), "user or project") {
		t.Errorf("scope global: %v", err)
	}
}
