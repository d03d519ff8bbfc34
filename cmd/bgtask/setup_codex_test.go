package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/agents/codex"
	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/internal/testkit"
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
	want := "'" + exe + "' --home '" + home + "'" + codex.HookCommandSuffix
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

// The deliver of a thread and Codex's hooks through the command line (they are
// agents/codex's, tested there): a deliver hands the wake-up to codex, and exits
// 1 when codex does not take it; a hook starts a deliver of the thread, which
// logs what it did.
func TestCodexDeliverAndHooksRunThroughTheCommandLine(t *testing.T) {
	testkit.FullOnly(t)
	home := t.TempDir()
	t.Setenv("CODEX_THREAD_ID", "")
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	startServer(t, home)
	dir := t.TempDir()
	program := filepath.Join(dir, "codex")
	// codex as far as deliver uses it; it takes no message while dir/refuse exists.
	script := "#!/bin/sh\nd=$(dirname \"$0\")\n[ \"$1\" = queue ] || exit 0\n[ -e \"$d/refuse\" ] && exit 1\nprintf '%s\\n' \"$*\" >> \"$d/queued\"\necho 'Queued message m1 for thread t.'\n"
	if err := os.WriteFile(program, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	deliver := func() result {
		return bgtask(t, home, "setup", "codex", "deliver", "--thread", "019a-t1", "--codex", program, "--codex-home", dir)
	}
	if err := os.WriteFile(filepath.Join(dir, "refuse"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	id := addTask(t, home, "--target", "codex-019a-t1", "--prompt", "WAKE {{task_id}}", "--", "true")
	bgtask(t, home, "wait", id).must(t, 0, "wait")
	deliver().must(t, 1, "deliver that codex refused")
	if p, a := inboxState(t, home, "codex-019a-t1"); p+a != 1 {
		t.Fatalf("after a refused deliver the inbox has %d unread, %d unacknowledged", p, a)
	}
	os.Remove(filepath.Join(dir, "refuse"))
	if r := deliver().must(t, 0, "deliver"); !strings.Contains(r.stdout, "wake-up "+id+" handed to Codex thread 019a-t1") {
		t.Errorf("deliver said %q", r.stdout)
	}
	if queued, _ := os.ReadFile(filepath.Join(dir, "queued")); string(queued) != "queue --thread 019a-t1 --message=WAKE "+id+" --resume\n" {
		t.Errorf("codex ran %q", queued)
	}
	bgtask(t, home, "setup", "codex", "deliver", "--thread", "no good").must(t, client.ExitUsage, "deliver of a thread that names no target")

	// The deliver a hook starts, detached, writes what it did to the thread's log.
	t.Setenv(mcpRunMain, "1")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CODEX_HOME", t.TempDir())
	var stderr syncBuffer
	hook := func(input string) {
		t.Helper()
		var stdout syncBuffer
		cmd := []string{"--home", home, "setup", "codex", "hook"}
		if err := runWithStdin(input, cmd, &stdout, &stderr); err != nil || stdout.String() != "" {
			t.Fatalf("hook %s: %v, stdout %q", input, err, stdout.String())
		}
	}
	hook(`{"session_id":"019a-t3","hook_event_name":"UserPromptSubmit"}`)
	log := filepath.Join(home, "codex", "019a-t3.log")
	testkit.Eventually(t, 30*time.Second, "the detached deliver's error in its log", func() bool {
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), "UserPromptSubmit: deliver --thread 019a-t3") && strings.Contains(string(data), "no codex program")
	})
	if got := strings.Join(strings.Fields(bgtask(t, home, "target", "list").must(t, 0, "target list").stdout), " "); !strings.Contains(got, "codex-019a-t3 busy") {
		t.Errorf("after UserPromptSubmit: %q", got)
	}
	hook(`not JSON`)
	if !strings.Contains(stderr.String(), "bgtask: codex hook: read the hook's input") {
		t.Errorf("a hook whose input is not JSON said %q", stderr.String())
	}
}

// runWithStdin runs the command line args with input on its stdin.
func runWithStdin(input string, args []string, stdout, stderr io.Writer) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	go func() { _, _ = io.WriteString(w, input); w.Close() }()
	defer r.Close()
	stdin := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = stdin }()
	return Run(context.Background(), args, stdout, stderr)
}

// Codex's shell tool runs the model's commands in the user's login shell:
// setup says so when that shell does not find bgtask, naming the directory to
// add, and says nothing when it does.
func TestSetupCodexWarnsWhenTheLoginShellLacksBgtask(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here")
	}
	home := t.TempDir()
	user := t.TempDir()
	t.Setenv("HOME", user)
	t.Setenv("SHELL", bash)
	t.Setenv("CODEX_HOME", filepath.Join(t.TempDir(), "codex"))
	profile := func(path string) {
		t.Helper()
		// After /etc/profile, which may set a PATH of its own.
		if err := os.WriteFile(filepath.Join(user, ".bash_profile"), []byte("echo welcome\nPATH="+path+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe, _ := os.Executable()

	profile(filepath.Join(user, "nothing-here"))
	r := bgtask(t, home, "setup", "codex").must(t, 0, "setup")
	if !strings.Contains(r.stderr, "does not find bgtask") || !strings.Contains(r.stderr, "Add "+filepath.Dir(exe)+" to PATH") {
		t.Errorf("setup with bgtask not on the login PATH: stderr %q", r.stderr)
	}

	bin := filepath.Join(user, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(bin, "bgtask")); err != nil {
		t.Fatal(err)
	}
	profile(bin)
	if r := bgtask(t, home, "setup", "codex").must(t, 0, "setup again"); r.stderr != "" {
		t.Errorf("setup with bgtask on the login PATH warned: %q", r.stderr)
	}
}
