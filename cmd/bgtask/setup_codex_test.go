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
	"unicode/utf8"

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

// standInCodex is a `codex` program that parses `queue` as codex 0.169.0 does
// (clap: an argument after --message that starts with '-' is refused), and
// appends each message it takes to dir/queued, NUL-terminated. While dir/hold
// exists it waits after taking one, and says so with dir/holding.
const standInCodex = `#!/bin/sh
d=$(dirname "$0")
case "$1" in
app-server) exit 0 ;;
queue) shift ;;
*) echo "error: unrecognized subcommand '$1'" >&2; exit 2 ;;
esac
have=
while [ $# -gt 0 ]; do
	case "$1" in
	--message=*) msg=${1#--message=}; have=1 ;;
	--message)
		case "$2" in -*) echo "error: unexpected argument '$2' found" >&2; exit 2 ;; esac
		msg=$2; have=1; shift ;;
	--thread) shift ;;
	--resume) ;;
	*) echo "error: unexpected argument '$1' found" >&2; exit 2 ;;
	esac
	shift
done
[ -n "$have" ] || { echo "error: --message <TEXT> is required" >&2; exit 2; }
printf '%s\0' "$msg" >> "$d/queued"
if [ -e "$d/hold" ]; then
	: > "$d/holding"
	while [ -e "$d/hold" ]; do sleep 0.05; done
	rm -f "$d/holding"
fi
echo "Queued message m1 for thread t."
`

// codexWorld is a server, a stand-in codex and a thread's inbox.
type codexWorld struct {
	home, codex, dir, thread string
	server                   *testServer
}

func newCodexWorld(t *testing.T) *codexWorld {
	t.Helper()
	t.Setenv("CODEX_THREAD_ID", "")
	t.Setenv("CLAUDE_CODE_SESSION_ID", "")
	w := &codexWorld{home: t.TempDir(), dir: t.TempDir(), thread: "019a-t1"}
	w.codex = filepath.Join(w.dir, "codex")
	if err := os.WriteFile(w.codex, []byte(standInCodex), 0o755); err != nil {
		t.Fatal(err)
	}
	w.server = startServer(t, w.home)
	return w
}

// wake adds a task (args: add's flags and command, default `true`) whose
// wake-up, with prompt, goes to the thread's inbox and nowhere else, and waits
// for it there.
func (w *codexWorld) wake(t *testing.T, prompt string, args ...string) {
	t.Helper()
	if args == nil {
		args = []string{"--", "true"}
	}
	before := w.inboxed(t)
	addTask(t, w.home, append([]string{"--target", "codex-" + w.thread, "--prompt", prompt}, args...)...)
	eventually(t, 30*time.Second, "the wake-up in the inbox", func() bool { return w.inboxed(t) > before })
}

// inboxed is how many wake-ups the thread's inbox holds, read or not, unacked.
func (w *codexWorld) inboxed(t *testing.T) int {
	t.Helper()
	js := homeJetStream(t, w.home)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := events.InboxConsumer(ctx, js, "codex-"+w.thread)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.NumPending) + info.NumAckPending
}

func (w *codexWorld) deliver(t *testing.T) result {
	t.Helper()
	return bgtask(t, w.home, "setup", "codex", "deliver", "--thread", w.thread, "--codex", w.codex, "--codex-home", w.dir)
}

// queued is what the stand-in codex took, in order.
func (w *codexWorld) queued(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(w.dir, "queued"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
}

func TestCodexDeliverHandsOverPromptsThatLookLikeFlagsOrAreHuge(t *testing.T) {
	w := newCodexWorld(t)
	w.wake(t, "--- FAIL: TestX")
	// 200 lines of 1000 bytes: a prompt more than one argument carries.
	lines := filepath.Join(w.dir, "lines.awk")
	if err := os.WriteFile(lines, []byte(`BEGIN { for (i = 0; i < 200; i++) { s = ""; for (j = 0; j < 500; j++) s = s "é"; print s } }`), 0o600); err != nil {
		t.Fatal(err)
	}
	w.wake(t, "{{tail}}\n{{tail}}\n{{tail}}", "--result", "tail:1", "--", "awk", "-f", lines)
	w.wake(t, "after")
	r := w.deliver(t).must(t, 0, "deliver")
	got := w.queued(t)
	if len(got) != 3 || got[0] != "--- FAIL: TestX" || got[2] != "after" {
		t.Fatalf("Codex took %d messages %.80q, want the 3 prompts in order\n%s", len(got), got, r.stderr)
	}
	line := strings.Repeat("é", 500)
	if len(got[1]) >= codexMaxArg || len(got[1]) < codexMaxArg-200 || !strings.HasPrefix(got[1], line+"\n"+line) ||
		!strings.Contains(got[1], "[bgtask: prompt cut from ") || !utf8.ValidString(got[1]) {
		t.Errorf("the huge prompt was handed as %d bytes ending %q", len(got[1]), got[1][max(0, len(got[1])-120):])
	}
	if n := w.inboxed(t); n != 0 {
		t.Errorf("%d wake-ups left in the inbox", n)
	}
}

func TestCodexDeliverNeverQueuesAHandedWakeupAgain(t *testing.T) {
	w := newCodexWorld(t)
	w.wake(t, "only once")
	hold := filepath.Join(w.dir, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() { done <- w.deliver(t) }()
	eventually(t, 30*time.Second, "codex queue running", func() bool {
		_, err := os.Stat(filepath.Join(w.dir, "holding"))
		return err == nil
	})
	// Codex took it; the server goes away before the acknowledgement.
	w.server.stop()
	os.Remove(hold)
	if r := <-done; r.code == 0 {
		t.Fatalf("deliver acknowledged with the server down: %+v", r)
	}
	handed, err := os.ReadFile(filepath.Join(w.home, "codex", w.thread+".handed"))
	if err != nil || !strings.HasPrefix(string(handed), "handed ") {
		t.Fatalf("the handed file: %q %v", handed, err)
	}
	if st, _ := os.Stat(filepath.Join(w.home, "codex", w.thread+".handed")); st.Mode().Perm() != 0o600 {
		t.Errorf("the handed file's mode is %v", st.Mode().Perm())
	}
	w.server = startServer(t, w.home)
	// Redelivered after the ack wait: acknowledged, not queued again.
	eventually(t, 60*time.Second, "the inbox empty", func() bool {
		w.deliver(t).must(t, 0, "deliver after the restart")
		return w.inboxed(t) == 0
	})
	if got := w.queued(t); len(got) != 1 {
		t.Errorf("Codex took %q, want it once", got)
	}
	if handed, _ := os.ReadFile(filepath.Join(w.home, "codex", w.thread+".handed")); len(handed) != 0 {
		t.Errorf("the handed file still has %q after the acknowledgement", handed)
	}
}

func TestCodexDeliverRunsOneAtATimePerThread(t *testing.T) {
	w := newCodexWorld(t)
	w.wake(t, "first")
	w.wake(t, "second")
	hold := filepath.Join(w.dir, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	first := make(chan result, 1)
	go func() { first <- w.deliver(t) }()
	eventually(t, 30*time.Second, "codex queue running", func() bool {
		_, err := os.Stat(filepath.Join(w.dir, "holding"))
		return err == nil
	})
	type ended struct {
		r      result
		queued []string
	}
	second := make(chan ended, 1)
	go func() {
		r := w.deliver(t)
		second <- ended{r, w.queued(t)}
	}()
	// The second run waits for the first: ending now, it would leave its
	// wake-up with the first and be counted delivered.
	select {
	case e := <-second:
		t.Fatalf("a second deliver ended while the first handed over: %+v, Codex had %q", e.r, e.queued)
	case <-time.After(2 * time.Second):
	}
	os.Remove(hold)
	first1 := <-first
	first1.must(t, 0, "first deliver")
	e := <-second
	e.r.must(t, 0, "second deliver")
	if !slices.Equal(e.queued, []string{"first", "second"}) {
		t.Errorf("Codex took %q", e.queued)
	}
}

func TestCodexDeliverIsBoundedAndItsDetachedRunLogs(t *testing.T) {
	w := newCodexWorld(t)
	old := codexDeliverDeadline
	codexDeliverDeadline = time.Second
	t.Cleanup(func() { codexDeliverDeadline = old })
	dir := filepath.Join(w.home, "codex")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	unlock, err := lockThread(context.Background(), filepath.Join(dir, w.thread+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := w.deliver(t)
	unlock()
	if r.code == 0 || time.Since(start) > 10*time.Second || !strings.Contains(r.stderr, "other deliver") {
		t.Errorf("deliver behind a lock never let go: exit %d after %v: %s", r.code, time.Since(start), r.stderr)
	}

	// SessionStart's run, detached, writes what it did to the thread's log.
	t.Setenv(mcpRunMain, "1")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CODEX_HOME", t.TempDir())
	g := &globals{home: w.home, stdout: io.Discard, stderr: io.Discard, ctx: context.Background(), timeout: time.Second}
	if err := spawnCodexDeliver(g, "019a-t2", "SessionStart"); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "019a-t2.log")
	eventually(t, 30*time.Second, "the detached deliver's error in its log", func() bool {
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), "no codex program")
	})
	if st, _ := os.Stat(log); st.Mode().Perm() != 0o600 {
		t.Errorf("the log's mode is %v", st.Mode().Perm())
	}

	// A resume of a thread the daemon holds runs no SessionStart: the user's prompt
	// hands over what is pending.
	g.timeout = 10 * time.Second
	if err := codexHook(context.Background(), g, strings.NewReader(`{"session_id":"019a-t3","hook_event_name":"UserPromptSubmit"}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a deliver started by the user's prompt", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "019a-t3.log"))
		return strings.Contains(string(data), "UserPromptSubmit: deliver --thread 019a-t3")
	})
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
