package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/agents/codex"
	"github.com/bgtask/bgtask/events"
)

func TestSetupCodexInstallsItsHooksOnceAndRemovesThem(t *testing.T) {
	home := t.TempDir()
	codexHome := filepath.Join(t.TempDir(), "codex")
	t.Setenv("CODEX_HOME", codexHome)
	hooks := filepath.Join(codexHome, "hooks.json")

	// No Codex home yet: setup makes it.
	bgtask(t, home, "setup", "codex").must(t, 0, "setup")
	fresh, err := os.ReadFile(hooks)
	if err != nil || !strings.Contains(string(fresh), "bgtask") {
		t.Fatalf("no bgtask hook in %s: %v %s", hooks, err, fresh)
	}
	bgtask(t, home, "setup", "codex", "--remove").must(t, 0, "remove")
	if _, err := os.Stat(hooks); !os.IsNotExist(err) {
		t.Errorf("the hooks file setup made is still there after --remove: %v", err)
	}

	mine := `{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]}}`
	if err := os.WriteFile(hooks, []byte(mine), 0o640); err != nil {
		t.Fatal(err)
	}
	bgtask(t, home, "setup", "codex").must(t, 0, "setup")
	once, _ := os.ReadFile(hooks)
	r := bgtask(t, home, "setup", "codex").must(t, 0, "setup again")
	twice, _ := os.ReadFile(hooks)
	if string(once) != string(twice) || !strings.Contains(r.stdout, "already") {
		t.Errorf("a second setup changed the file or said so: %s\n%s\n---\n%s", r.stdout, once, twice)
	}
	if !strings.Contains(string(once), "notify-send done") {
		t.Errorf("the user's hook is gone:\n%s", once)
	}
	if st, _ := os.Stat(hooks); st.Mode().Perm() != 0o640 {
		t.Errorf("the file's mode changed to %v", st.Mode().Perm())
	}
	var doc struct {
		Hooks map[string][]struct {
			Hooks []struct{ Command string } `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(once, &doc); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	want := shellQuote(exe) + " --home " + shellQuote(home) + codex.HookCommandSuffix
	for _, event := range codex.HookEvents {
		groups := doc.Hooks[event]
		if len(groups) == 0 || groups[len(groups)-1].Hooks[0].Command != want {
			t.Errorf("%s: %+v, want the command %s", event, groups, want)
		}
	}

	bgtask(t, home, "setup", "codex", "--remove").must(t, 0, "remove")
	left, _ := os.ReadFile(hooks)
	if strings.Contains(string(left), "bgtask") || !strings.Contains(string(left), "notify-send done") {
		t.Errorf("after --remove:\n%s", left)
	}

	// A file Codex could not read either is left as it is.
	bad := `{"hooks": [1]}`
	if err := os.WriteFile(hooks, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	r = bgtask(t, home, "setup", "codex")
	if r.code == 0 || !strings.Contains(r.stderr, "field hooks") || !strings.Contains(r.stderr, hooks) {
		t.Errorf("setup on a bad file: exit %d, stderr %q", r.code, r.stderr)
	}
	if got, _ := os.ReadFile(hooks); string(got) != bad {
		t.Errorf("the bad file was changed: %s", got)
	}
}

func TestCodexHooksFollowTheThreadsTurns(t *testing.T) {
	home := t.TempDir()
	startServer(t, home)
	hook := func(input string) string {
		t.Helper()
		var stderr syncBuffer
		g := &globals{home: home, stdout: io.Discard, stderr: &stderr, ctx: context.Background(), timeout: defaultTimeout}
		if err := codexHook(context.Background(), g, strings.NewReader(input)); err != nil {
			t.Fatalf("hook %s: %v", input, err)
		}
		type row struct {
			Name string `json:"name"`
			Busy bool   `json:"busy"`
		}
		rows := decode[[]row](t, bgtask(t, home, "target", "list", "--json").must(t, 0, "target list").stdout)
		i := slices.IndexFunc(rows, func(r row) bool { return r.Name == "codex-019a-77" })
		switch {
		case i < 0:
			return "none"
		case rows[i].Busy:
			return events.TargetBusy
		}
		return events.TargetIdle
	}
	// A new session's start writes nothing: it has no wake-up yet.
	if got := hook(`{"session_id":"019a-77","hook_event_name":"SessionStart","source":"startup"}`); got != "none" {
		t.Errorf("after SessionStart: %s", got)
	}
	if got := hook(`{"session_id":"019a-77","hook_event_name":"UserPromptSubmit","prompt":"x"}`); got != events.TargetBusy {
		t.Errorf("after UserPromptSubmit: %s", got)
	}
	if got := hook(`{"session_id":"019a-77","hook_event_name":"Stop"}`); got != events.TargetIdle {
		t.Errorf("after Stop: %s", got)
	}
	var stderr syncBuffer
	g := &globals{home: home, stdout: io.Discard, stderr: &stderr, ctx: context.Background(), timeout: time.Second}
	if err := codexHook(context.Background(), g, strings.NewReader(`{"session_id":"no good","hook_event_name":"Stop"}`)); err == nil || !strings.Contains(err.Error(), "session_id") {
		t.Errorf("a session id that names no target: %v", err)
	}
}

func TestAddInACodexSessionPushesToItsThread(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("BGTASK_HOME", "") // the sink takes add's --home, not the default
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	t.Setenv("CODEX_HOME", "/somewhere/.codex")
	startServer(t, home)
	deliver := func(env, id string, flags ...string) []struct {
		Type string   `json:"type"`
		Argv []string `json:"argv"`
	} {
		t.Helper()
		t.Setenv("CODEX_THREAD_ID", "")
		t.Setenv("CLAUDE_CODE_SESSION_ID", "")
		t.Setenv(env, id)
		r := bgtask(t, home, append(append([]string{"add", "--json"}, flags...), "--", "true")...).must(t, 0, "add")
		id = decode[struct{ ID string }](t, r.stdout).ID
		return decode[struct {
			Spec struct {
				Deliver []struct {
					Type string   `json:"type"`
					Argv []string `json:"argv"`
				} `json:"deliver"`
			} `json:"spec"`
		}](t, bgtask(t, home, "show", id, "--json").must(t, 0, "show").stdout).Spec.Deliver
	}
	got := deliver("CODEX_THREAD_ID", "019a-77")
	exe, _ := os.Executable()
	want := []string{exe, "--home", home, "setup", "codex", "deliver", "--thread", "019a-77", "--codex-home", "/somewhere/.codex"}
	if len(got) != 1 || got[0].Type != "exec" || len(got[0].Argv) < len(want) || !slices.Equal(got[0].Argv[:len(want)], want) {
		t.Errorf("a Codex session's task pushes with %+v, want an exec sink %q", got, want)
	}
	if got := deliver("CODEX_THREAD_ID", "019a-77", "--exec-json", `["notify"]`); len(got) != 1 || !slices.Equal(got[0].Argv, []string{"notify"}) {
		t.Errorf("a sink given on the command line does not win: %+v", got)
	}
	if got := deliver("CLAUDE_CODE_SESSION_ID", "s1"); len(got) != 0 {
		t.Errorf("a Claude Code session's task got sinks %+v", got)
	}
}
