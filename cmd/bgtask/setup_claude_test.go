package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/events"
)

func TestSetupClaudeCodeIsIdempotentKeepsTheirsAndRemovesOurs(t *testing.T) {
	user := t.TempDir()
	t.Setenv("HOME", user)
	home := t.TempDir()
	path := filepath.Join(user, ".claude", "settings.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := []byte(`{"model": "opus", "hooks": []}`)
	if err := os.WriteFile(path, bad, 0o640); err != nil {
		t.Fatal(err)
	}
	r := bgtask(t, home, "setup", "claude-code").must(t, exitUsage, "setup over hooks that are not an object")
	if !strings.Contains(r.stderr, path) || !strings.Contains(r.stderr, "hooks: not a JSON object") {
		t.Errorf("the error does not name the file and the field: %s", r.stderr)
	}
	if data, _ := os.ReadFile(path); string(data) != string(bad) {
		t.Fatalf("a refused setup changed the file: %s", data)
	}
	bgtask(t, home, "setup", "claude-code", "--scope", "global").must(t, exitUsage, "setup --scope global")

	theirs := `{"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}`
	if err := os.WriteFile(path, []byte(theirs), 0o640); err != nil {
		t.Fatal(err)
	}
	bgtask(t, home, "setup", "claude-code").must(t, 0, "setup")
	once, _ := os.ReadFile(path)
	exe, _ := os.Executable()
	if !strings.Contains(string(once), claudeQuote(exe)+" --home "+claudeQuote(home)+" hook claude-code wake") {
		t.Fatalf("the hooks do not run this binary on this home:\n%s", once)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("setup changed the file's mode to %v", st.Mode().Perm())
	}
	r = bgtask(t, home, "setup", "claude-code").must(t, 0, "setup again")
	if twice, _ := os.ReadFile(path); string(twice) != string(once) || !strings.Contains(r.stdout, "already") {
		t.Fatalf("a second setup changed the file (%s):\n%s", r.stdout, twice)
	}
	bgtask(t, home, "setup", "claude-code", "--remove").must(t, 0, "setup --remove")
	removed, _ := os.ReadFile(path)
	if strings.Contains(string(removed), "bgtask") || !strings.Contains(string(removed), `"say done"`) || !strings.Contains(string(removed), `"opus"`) {
		t.Fatalf("--remove did not take out exactly bgtask's hooks:\n%s", removed)
	}
}

// claudeHook runs `bgtask hook claude-code ARG` of the session sid, in this process.
func claudeHook(ctx context.Context, home, sid, arg string) (stderr string, code int, err error) {
	var out, errOut syncBuffer
	err = Run(ctx, []string{"--home", home, "hook", "claude-code", arg}, &out, &errOut)
	if err == nil {
		return errOut.String(), 0, nil
	}
	if exit, ok := err.(*exitError); ok {
		return errOut.String(), exit.code, nil
	}
	return errOut.String(), -1, err
}

// inboxState is how many of the target's wake-ups are unread and unacknowledged.
func inboxState(t *testing.T, home, target string) (pending, ackPending int) {
	t.Helper()
	g := &globals{home: home, timeout: 10 * time.Second, ctx: context.Background()}
	c, js, err := g.streamClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.NumPending), info.NumAckPending
}

func TestClaudeWakeHookHandsOverOnceAndOnlyOneWaits(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startServer(t, home)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "s1")
	t.Setenv("CLAUDE_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("CLAUDE_CODE_ENTRYPOINT", "cli")

	type outcome struct {
		stderr string
		code   int
		err    error
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan outcome, 1)
	go func() {
		s, c, err := claudeHook(ctx, home, "s1", "wake")
		first <- outcome{s, c, err}
	}()
	eventually(t, 30*time.Second, "the waiter did not take the session's lock", func() bool {
		f, err := os.Open(filepath.Join(home, "claude-sessions", "s1.lock"))
		if err != nil {
			return false
		}
		defer f.Close()
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			return true
		}
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return false
	})
	s, code, err := claudeHook(ctx, home, "s1", "wake")
	if err != nil || code != 0 || s != "" {
		t.Fatalf("a second waiter of the session: exit %d, %v, stderr %q; want exit 0 at once", code, err, s)
	}

	id := addTask(t, home, "--target", "claude-s1", "--prompt", "WAKE {{task_id}}", "--", "true")
	var o outcome
	select {
	case o = <-first:
	case <-time.After(60 * time.Second):
		t.Fatal("the waiter did not hand the wake-up over")
	}
	if o.err != nil || o.code != 2 || strings.TrimSpace(o.stderr) != "WAKE "+id {
		t.Fatalf("the waiter: exit %d, %v, stderr %q; want exit 2 and the prompt", o.code, o.err, o.stderr)
	}
	if p, a := inboxState(t, home, "claude-s1"); p != 0 || a != 0 {
		t.Fatalf("after the hand-over the inbox has %d unread, %d unacknowledged", p, a)
	}
}

func TestClaudeWakeHookOfAGoneSessionLeavesTheWakeUpInTheInbox(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startServer(t, home)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CLAUDE_CODE_SESSION_ID", "s2")
	t.Setenv("CLAUDE_CODE_ENTRYPOINT", "cli")
	id := addTask(t, home, "--target", "claude-s2", "--prompt", "WAKE {{task_id}}", "--", "true")
	bgtask(t, home, "wait", id).must(t, 0, "wait")

	t.Setenv("CLAUDE_PID", strconv.Itoa(gone.Process.Pid))
	s, code, err := claudeHook(context.Background(), home, "s2", "wake")
	if err != nil || code != 0 || s != "" {
		t.Fatalf("the waiter of a gone session: exit %d, %v, stderr %q; want exit 0, nothing said", code, err, s)
	}
	t.Setenv("CLAUDE_PID", strconv.Itoa(os.Getpid()))
	s, code, err = claudeHook(context.Background(), home, "s2", "wake")
	if err != nil || code != 2 || strings.TrimSpace(s) != "WAKE "+id {
		t.Fatalf("the next session's waiter: exit %d, %v, stderr %q; want the wake-up", code, err, s)
	}
}

func TestClaudeHooksMarkTheTargetAndNeverFail(t *testing.T) {
	quietHome(t)
	t.Setenv("CLAUDE_CODE_SESSION_ID", "s3")
	t.Setenv("CLAUDE_CODE_ENTRYPOINT", "cli")
	t.Setenv("CLAUDE_PID", strconv.Itoa(os.Getpid()))

	// No server ever ran in the home: every hook exits 0 at once.
	none := t.TempDir()
	for _, arg := range []string{"UserPromptSubmit", "Stop", "wake", "NoSuchEvent"} {
		began := time.Now()
		if _, code, err := claudeHook(context.Background(), none, "s3", arg); err != nil || code != 0 {
			t.Errorf("%s without a server: exit %d, %v; want 0", arg, code, err)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Errorf("%s without a server took %v", arg, d)
		}
	}

	home := t.TempDir()
	startServer(t, home)
	state := func() string {
		out := bgtask(t, home, "target", "list").must(t, 0, "target list").stdout
		return strings.Join(strings.Fields(out), " ")
	}
	claudeHook(context.Background(), home, "s3", "UserPromptSubmit")
	// A Claude Code killed in its turn runs no Stop hook: the busy state ends by itself.
	states := decode[[]struct {
		Name, State string
		Until       *time.Time
	}](t, bgtask(t, home, "target", "list", "--json").must(t, 0, "target list").stdout)
	if len(states) != 1 || states[0].Name != "claude-s3" || states[0].State != "busy" || states[0].Until == nil ||
		time.Until(*states[0].Until) < claudeBusyTTL-time.Minute || time.Until(*states[0].Until) > claudeBusyTTL {
		t.Errorf("after UserPromptSubmit: %+v; want claude-s3 busy for %v", states, claudeBusyTTL)
	}
	claudeHook(context.Background(), home, "s3", "Stop")
	if got := state(); got != "claude-s3 idle" {
		t.Errorf("after Stop: %q", got)
	}
}

func TestClaudeHookReadsTheSessionOfALargeInput(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "input.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	big := strings.Repeat("x", 3<<20)
	if _, err := f.WriteString(`{"tool_response": "` + big + `", "session_id": "big"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = stdin }()
	var warn bytes.Buffer
	if in := readClaudeHookInput(&warn); in.SessionID != "big" || warn.Len() > 0 {
		t.Fatalf("session %q from an input of %d bytes; warned %q", in.SessionID, len(big), warn.String())
	}
}
