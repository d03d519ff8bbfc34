package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
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
	r := bgtask(t, home, "setup", "claude-code").must(t, client.ExitUsage, "setup over hooks that are not an object")
	if !strings.Contains(r.stderr, path) || !strings.Contains(r.stderr, "hooks: not a JSON object") {
		t.Errorf("the error does not name the file and the field: %s", r.stderr)
	}
	if data, _ := os.ReadFile(path); string(data) != string(bad) {
		t.Fatalf("a refused setup changed the file: %s", data)
	}
	bgtask(t, home, "setup", "claude-code", "--scope", "global").must(t, client.ExitUsage, "setup --scope global")

	theirs := `{"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}`
	if err := os.WriteFile(path, []byte(theirs), 0o640); err != nil {
		t.Fatal(err)
	}
	bgtask(t, home, "setup", "claude-code").must(t, 0, "setup")
	once, _ := os.ReadFile(path)
	exe, _ := os.Executable()
	if !strings.Contains(string(once), "'"+exe+"' --home '"+home+"' hook claude-code wake") {
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
func claudeHook(ctx context.Context, home, arg string) (stderr string, code int, err error) {
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
	js := homeJetStream(t, home)
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

// The hooks as Claude Code runs them, through the command line (the hooks
// themselves are agents/claudecode's, tested there): a turn marks the session's
// target, and the waiter hands a wake-up over with exit status 2.
func TestClaudeHooksRunThroughTheCommandLine(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startServer(t, home)
	claudeWaiterEnv(t, "s1")
	ctx := context.Background()
	if s, code, err := claudeHook(ctx, home, "UserPromptSubmit"); err != nil || code != 0 || s != "" {
		t.Fatalf("UserPromptSubmit: exit %d, %v, stderr %q", code, err, s)
	}
	if got := strings.Join(strings.Fields(bgtask(t, home, "target", "list").must(t, 0, "target list").stdout), " "); !strings.Contains(got, "claude-s1 busy") {
		t.Errorf("after UserPromptSubmit: %q", got)
	}
	id := addTask(t, home, "--target", "claude-s1", "--prompt", "WAKE {{task_id}}", "--", "true")
	bgtask(t, home, "wait", id).must(t, 0, "wait")
	if s, code, err := claudeHook(ctx, home, "wake"); err != nil || code != 2 || strings.TrimSpace(s) != "WAKE "+id {
		t.Fatalf("the waiter: exit %d, %v, stderr %q; want exit 2 and the prompt", code, err, s)
	}
	if p, a := inboxState(t, home, "claude-s1"); p != 0 || a != 0 {
		t.Fatalf("after the hand-over the inbox has %d unread, %d unacknowledged", p, a)
	}
	var stderr syncBuffer
	if err := Run(ctx, []string{"--home", home, "hook", "claude-code"}, io.Discard, &stderr); err != nil || !strings.Contains(stderr.String(), "want one EVENT") {
		t.Errorf("a hook with no event: %v, stderr %q; want exit 0 and why", err, stderr.String())
	}
}

// claudeWaiterEnv is the environment of a waiting hook of session sid in a live
// interactive Claude Code (this test process).
func claudeWaiterEnv(t *testing.T, sid string) {
	t.Setenv("CLAUDE_CODE_SESSION_ID", sid)
	t.Setenv("CLAUDE_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("CLAUDE_CODE_ENTRYPOINT", "cli")
}

type hookOutcome struct {
	stderr string
	code   int
}

// runWaiter runs the session's waiting hook, and returns its outcome when it
// ends.
func runWaiter(ctx context.Context, home string) <-chan hookOutcome {
	done := make(chan hookOutcome, 1)
	go func() {
		s, code, err := claudeHook(ctx, home, "wake")
		if err != nil {
			code = -1
		}
		done <- hookOutcome{s, code}
	}()
	return done
}

func awaitWaiter(t *testing.T, done <-chan hookOutcome, what string) hookOutcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(45 * time.Second):
		t.Fatalf("%s did not end", what)
		return hookOutcome{}
	}
}
