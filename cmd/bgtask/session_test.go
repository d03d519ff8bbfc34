package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestAddInAnAgentSessionWakesThatSession(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	type shown struct {
		Spec struct {
			Target string          `json:"target"`
			Origin json.RawMessage `json:"origin"`
		} `json:"spec"`
	}
	show := func(id string) shown {
		return decode[shown](t, bgtask(t, home, "show", id, "--json").must(t, 0, "show").stdout)
	}
	for _, c := range []struct {
		env, id, target, origin string
		flags                   []string
	}{
		{"CLAUDE_CODE_SESSION_ID", "0b5c2a4e-1f", "claude-0b5c2a4e-1f", `{"runtime":"claude-code","session_id":"0b5c2a4e-1f"}`, nil},
		{"CODEX_THREAD_ID", "019a-77", "codex-019a-77", `{"runtime":"codex","thread_id":"019a-77"}`, nil},
		{"OPENCODE_SESSION_ID", "ses_db93e3684ffe", "opencode-ses_db93e3684ffe", `{"runtime":"opencode","session_id":"ses_db93e3684ffe"}`, nil},
		{"GEMINI_SESSION_ID", "6b1ffa89-8a2d", "gemini-6b1ffa89-8a2d", `{"runtime":"gemini","session_id":"6b1ffa89-8a2d"}`, nil},
		{"CLAUDE_CODE_SESSION_ID", "s1", "agent-7", `{"mine":1}`, []string{"--target", "agent-7", "--origin", `{"mine":1}`}},
		{"CLAUDE_CODE_SESSION_ID", "not a token", "default", "", nil},
	} {
		t.Run(c.env+"="+c.id, func(t *testing.T) {
			t.Setenv("CLAUDE_CODE_SESSION_ID", "")
			t.Setenv("CODEX_THREAD_ID", "")
			t.Setenv("OPENCODE_SESSION_ID", "")
			t.Setenv("GEMINI_SESSION_ID", "")
			t.Setenv(c.env, c.id)
			r := bgtask(t, home, append(append([]string{"add", "--json"}, c.flags...), "--", "true")...).must(t, 0, "add")
			got := show(decode[struct{ ID string }](t, r.stdout).ID)
			target := got.Spec.Target
			if target == "" {
				target = "default"
			}
			var origin bytes.Buffer
			if len(got.Spec.Origin) > 0 {
				if err := json.Compact(&origin, got.Spec.Origin); err != nil {
					t.Fatal(err)
				}
			}
			if target != c.target || origin.String() != c.origin {
				t.Errorf("target %q origin %s; want %q %s", target, got.Spec.Origin, c.target, c.origin)
			}
			if c.target == "default" && !strings.Contains(r.stderr, "cannot name a target") {
				t.Errorf("an id that cannot name a target was not reported: stderr %q", r.stderr)
			}
		})
	}
}
