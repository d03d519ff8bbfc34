package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/agents/openclaw"
	"github.com/bgtask/bgtask/internal/serverhome"
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

// TestAddInAnOpenClawSessionWakesThatSession: in a command of an OpenClaw agent
// (bgtask's plugin set the session key and the gateway's URL), the task's target
// is the session's, its origin names the session, and its sink posts to the
// gateway's /hooks/agent with the bearer the home declares; a home that declares
// none refuses it, naming the bearer.
func TestAddInAnOpenClawSessionWakesThatSession(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	startServer(t, home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_THREAD_ID", "")
	t.Setenv(openclaw.SessionEnv, "agent:main:main")
	const url = "http://127.0.0.1:18789/hooks/agent"
	t.Setenv(openclaw.URLEnv, url)

	r := bgtask(t, home, "add", "--json", "--", "true")
	if said := r.stdout + r.stderr; r.code == 0 || !strings.Contains(said, "deliver[0].bearer") || !strings.Contains(said, "declares no such bearer token") {
		t.Fatalf("with no bearer declared: exit %d, %q; want deliver[0].bearer refused", r.code, said)
	}
	if err := serverhome.WriteBearer(home, openclaw.BearerName, serverhome.Bearer{Token: "hook-token", URLPrefixes: []string{url}}); err != nil {
		t.Fatal(err)
	}
	r = bgtask(t, home, "add", "--json", "--", "true").must(t, 0, "add")
	out := bgtask(t, home, "show", decode[struct{ ID string }](t, r.stdout).ID, "--json").must(t, 0, "show").stdout
	got := decode[struct {
		Spec struct {
			Target  string            `json:"target"`
			Origin  map[string]string `json:"origin"`
			Deliver []struct {
				Type, URL, Bearer string
				Body              map[string]any
			} `json:"deliver"`
		} `json:"spec"`
	}](t, out)
	s := got.Spec
	if s.Target != "openclaw-agent_main_main" || s.Origin["runtime"] != "openclaw" || s.Origin["session"] != "agent:main:main" ||
		len(s.Deliver) != 1 || s.Deliver[0].URL != url || s.Deliver[0].Bearer != openclaw.BearerName ||
		s.Deliver[0].Body["sessionKey"] != "{{origin.session}}" || s.Deliver[0].Body["waitForCompletion"] != true {
		t.Fatalf("spec: %s", out)
	}
	if strings.Contains(out, "hook-token") {
		t.Fatalf("show prints the token: %s", out)
	}
}
