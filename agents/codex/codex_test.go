package codex

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

const ours = "'/usr/local/bin/bgtask' --home '/h'" + HookCommandSuffix

// theirs is a user's hooks file: a Stop hook of their own, a PreToolUse group, a
// description, and a group that mixes their handler with an old one of bgtask's.
const theirs = `{
  "description": "mine",
  "hooks": {
    "Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 5}]}],
    "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./check.sh"}]}],
    "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "./log.sh"}, {"type": "command", "command": "/old/bgtask setup codex hook"}]}]
  }
}`

func decode(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, data)
	}
	return v
}

func commands(t *testing.T, data []byte, event string) []string {
	t.Helper()
	var doc struct {
		Hooks map[string][]struct {
			Hooks []struct{ Command string } `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range doc.Hooks[event] {
		for _, h := range g.Hooks {
			out = append(out, h.Command)
		}
	}
	return out
}

func TestInstallHooksKeepsTheUsersAndIsIdempotent(t *testing.T) {
	for _, start := range []string{"", theirs} {
		once, err := InstallHooks([]byte(start), ours)
		if err != nil {
			t.Fatal(err)
		}
		twice, err := InstallHooks(once, ours)
		if err != nil {
			t.Fatal(err)
		}
		if string(once) != string(twice) {
			t.Errorf("a second install changed the file:\n%s\n---\n%s", once, twice)
		}
		for _, event := range HookEvents {
			n := 0
			for _, c := range commands(t, once, event) {
				if strings.HasSuffix(c, HookCommandSuffix) {
					n++
					if c != ours {
						t.Errorf("%s: an old bgtask hook %q is left", event, c)
					}
				}
			}
			if n != 1 {
				t.Errorf("%s: %d hooks of bgtask's, want 1:\n%s", event, n, once)
			}
		}
		if start == "" {
			continue
		}
		if got := commands(t, once, "Stop"); got[0] != "notify-send done" {
			t.Errorf("the user's Stop hook is gone: %q", got)
		}
		if got := commands(t, once, "UserPromptSubmit"); got[0] != "./log.sh" {
			t.Errorf("the user's handler in a mixed group is gone: %q", got)
		}
		if got := commands(t, once, "PreToolUse"); !reflect.DeepEqual(got, []string{"./check.sh"}) {
			t.Errorf("PreToolUse: %q", got)
		}
		if decode(t, once)["description"] != "mine" {
			t.Error("the description is gone")
		}
	}
}

func TestRemoveHooksLeavesTheUsersOnly(t *testing.T) {
	installed, err := InstallHooks([]byte(theirs), ours)
	if err != nil {
		t.Fatal(err)
	}
	out, empty, err := RemoveHooks(installed)
	if err != nil || empty {
		t.Fatalf("remove: empty %v err %v", empty, err)
	}
	if has, _ := HasHooks(out); has {
		t.Errorf("bgtask hooks left:\n%s", out)
	}
	want, _, _ := RemoveHooks([]byte(theirs))
	if !reflect.DeepEqual(decode(t, out), decode(t, want)) {
		t.Errorf("remove after install is not the user's file:\n%s\nwant\n%s", out, want)
	}
	if _, ok := decode(t, out)["hooks"].(map[string]any)["SessionStart"]; ok {
		t.Error("an event left with no group stays")
	}

	fresh, _ := InstallHooks(nil, ours)
	if _, empty, _ := RemoveHooks(fresh); !empty {
		t.Error("a file that only held bgtask's hooks is not reported empty")
	}
}

func TestHooksRefuseADocumentTheyCannotRead(t *testing.T) {
	for _, bad := range []string{`[1]`, `{"hooks": [1]}`, `{"hooks": {"Stop": {"hooks": []}}}`, `{`} {
		if _, err := InstallHooks([]byte(bad), ours); err == nil {
			t.Errorf("InstallHooks(%s): no error", bad)
		}
		if _, _, err := RemoveHooks([]byte(bad)); err == nil {
			t.Errorf("RemoveHooks(%s): no error", bad)
		}
	}
	_, err := InstallHooks([]byte(`{"hooks": [1]}`), ours)
	if err == nil || !strings.Contains(err.Error(), "field hooks") {
		t.Errorf("the error does not name the field: %v", err)
	}
}

func TestParseQueueOutput(t *testing.T) {
	// What codex 0.169.0 printed in each case (warnings first, on stderr).
	for _, c := range []struct {
		out  string
		want QueueResult
	}{
		{"Queued message 01a2-885f for thread 01a2-4eb1.\n", Queued},
		{"Warning: message was queued, but could not resume thread 01a2-4eb1: start a local daemon or specify a server with --remote\nQueued message 01a2-553c for thread 01a2-4eb1.\n", QueuedNotResumed},
		{"Warning: message was queued, but could not resume thread 01a2-7c42: thread/resume failed: thread 01a2-7c42 already has an active writer (code -32600)\nQueued message 01a2-87b2 for thread 01a2-7c42.\n", HeldElsewhere},
	} {
		if got := ParseQueueOutput(c.out); got != c.want {
			t.Errorf("%q: %v, want %v", c.out, got, c.want)
		}
	}
}
