package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

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

// claudeWaiterEnv is the environment of a waiting hook of session sid in a live
// interactive Claude Code (this test process).
func claudeWaiterEnv(t *testing.T, sid string) {
	t.Setenv("CLAUDE_CODE_SESSION_ID", sid)
	t.Setenv("CLAUDE_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("CLAUDE_CODE_ENTRYPOINT", "cli")
}

// onWrite is a waiter's stderr that does something once when it is first written.
type onWrite struct {
	syncBuffer
	once sync.Once
	do   func()
}

func (w *onWrite) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	w.once.Do(w.do)
	return n, err
}

type hookOutcome struct {
	stderr string
	code   int
}

// runWaiter runs the session's waiting hook with stderr, and returns its outcome
// when it ends.
func runWaiter(ctx context.Context, t *testing.T, home string, stderr *onWrite) <-chan hookOutcome {
	done := make(chan hookOutcome, 1)
	go func() {
		err := Run(ctx, []string{"--home", home, "hook", "claude-code", "wake"}, io.Discard, stderr)
		code := 0
		if exit, ok := err.(*exitError); ok {
			code = exit.code
		} else if err != nil {
			code = -1
		}
		done <- hookOutcome{stderr.String(), code}
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

func TestClaudeWakeHookWhoseAckFailsHandsTheWakeUpOverOnce(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	srv := startServer(t, home)
	claudeWaiterEnv(t, "s4")
	id := addTask(t, home, "--target", "claude-s4", "--prompt", "WAKE {{task_id}}", "--", "true")
	bgtask(t, home, "wait", id).must(t, 0, "wait")

	// The server is gone as soon as the prompt is written: its ack cannot be made.
	o := awaitWaiter(t, runWaiter(context.Background(), t, home, &onWrite{do: srv.stop}), "the waiter whose server stopped")
	if o.code != 2 || strings.TrimSpace(o.stderr) != "WAKE "+id {
		t.Fatalf("the waiter: exit %d, stderr %q; want exit 2 and the prompt once", o.code, o.stderr)
	}
	sessions := filepath.Join(home, claudeSessionsDir)
	if _, err := os.Stat(filepath.Join(sessions, "s4.lock")); err == nil {
		t.Errorf("the waiter left its lock file")
	}

	// The next waiter gets the wake-up again, acknowledges it and hands nothing over.
	startServer(t, home)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next := runWaiter(ctx, t, home, &onWrite{do: func() {}})
	eventually(t, 40*time.Second, "the handed wake-up acknowledged", func() bool {
		p, a := inboxState(t, home, "claude-s4")
		_, err := os.Stat(filepath.Join(sessions, "s4.handed"))
		return p == 0 && a == 0 && errors.Is(err, fs.ErrNotExist)
	})
	cancel()
	if o := awaitWaiter(t, next, "the next waiter"); o.code != 0 || o.stderr != "" {
		t.Fatalf("the next waiter: exit %d, stderr %q; want exit 0, nothing handed over again", o.code, o.stderr)
	}
}

func TestClaudeWakeHookStoppedAfterWritingGivesTheWakeUpBack(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startServer(t, home)
	claudeWaiterEnv(t, "s5")
	id := addTask(t, home, "--target", "claude-s5", "--prompt", "WAKE {{task_id}}", "--", "true")
	bgtask(t, home, "wait", id).must(t, 0, "wait")

	// Claude Code stops the hook just after it wrote: it drops what the hook wrote.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := awaitWaiter(t, runWaiter(ctx, t, home, &onWrite{do: cancel}), "the stopped waiter")
	if o.code == 2 {
		t.Fatalf("the stopped waiter exited 2 (stderr %q)", o.stderr)
	}
	o = awaitWaiter(t, runWaiter(context.Background(), t, home, &onWrite{do: func() {}}), "the next waiter")
	if o.code != 2 || strings.TrimSpace(o.stderr) != "WAKE "+id {
		t.Fatalf("the next waiter: exit %d, stderr %q; want the wake-up handed over again", o.code, o.stderr)
	}
	if p, a := inboxState(t, home, "claude-s5"); p != 0 || a != 0 {
		t.Fatalf("after the hand-over the inbox has %d unread, %d unacknowledged", p, a)
	}
}

func TestClaudeWakeHookStoppedWhileItsAckFailsGivesTheWakeUpBack(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	srv := startServer(t, home)
	claudeWaiterEnv(t, "s6")
	id := addTask(t, home, "--target", "claude-s6", "--prompt", "WAKE {{task_id}}", "--", "true")
	bgtask(t, home, "wait", id).must(t, 0, "wait")

	// The server goes as the prompt is written, and Claude Code stops the hook while
	// it retries the ack (claudeAckBound): the stop is what counts.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := func() {
		srv.stop()
		time.AfterFunc(claudeAckBound/10, cancel)
	}
	o := awaitWaiter(t, runWaiter(ctx, t, home, &onWrite{do: stop}), "the stopped waiter")
	if o.code == 2 {
		t.Fatalf("the stopped waiter exited 2 (stderr %q)", o.stderr)
	}
	startServer(t, home)
	o = awaitWaiter(t, runWaiter(context.Background(), t, home, &onWrite{do: func() {}}), "the next waiter")
	if o.code != 2 || strings.TrimSpace(o.stderr) != "WAKE "+id {
		t.Fatalf("the next waiter: exit %d, stderr %q; want the wake-up handed over again", o.code, o.stderr)
	}
}

func TestClaudeWakeHookPanicsQuietly(t *testing.T) {
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, claudeSessionsDir), 0o700); err != nil {
		t.Fatal(err)
	}
	err := func() (err error) {
		defer quietPanic(home, &err)
		panic("boom")
	}()
	if exit, ok := err.(*exitError); !ok || exit.code != 1 || exit.err != nil {
		t.Fatalf("a panic in the waiter: %#v; want exit status 1 and nothing said", err)
	}
	if log, _ := os.ReadFile(filepath.Join(home, claudeSessionsDir, "panic.log")); !strings.Contains(string(log), "boom") {
		t.Errorf("the panic was not logged in the home: %q", log)
	}
}

func TestClaudeWakeHookConnectionSaysNothingOnStderr(t *testing.T) {
	quietHome(t)
	home := t.TempDir()
	startServer(t, home)
	g := &globals{home: home, timeout: 10 * time.Second, ctx: context.Background()}
	nc, err := g.claudeConnect()
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	stderr := os.Stderr
	os.Stderr = errFile
	defer func() { os.Stderr = stderr }()

	// A subscription the identity may not have is refused asynchronously, which
	// nats.go reports to the connection's error handler.
	if _, err := nc.SubscribeSync("bgtask-test.denied"); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	eventually(t, 10*time.Second, "the subscription refused", func() bool { return nc.LastError() != nil })
	nc.Close()
	<-closed // the handlers are called in order: the error's has run
	if data, _ := os.ReadFile(errFile.Name()); len(data) > 0 {
		t.Fatalf("the waiter's connection wrote to stderr: %q", data)
	}
}

func TestClaudeSessionFilesArePruned(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-claudeHandedKeep - time.Hour)
	for _, name := range []string{"gone.handed", "gone.lock", "live.handed", "live.lock"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("1 x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(name, "gone") {
			if err := os.Chtimes(filepath.Join(dir, name), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	pruneClaudeSessions(dir, time.Now())
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != "live.handed live.lock" {
		t.Fatalf("after pruning: %v", left)
	}

	h := handedFile{path: filepath.Join(dir, "s.handed")}
	if err := h.add("a", "b/stalled"); err != nil {
		t.Fatal(err)
	}
	if keys, _ := h.read(time.Now()); !keys["a"] || !keys["b/stalled"] || len(keys) != 2 {
		t.Fatalf("handed: %v", keys)
	}
	if keys, _ := h.read(time.Now().Add(claudeHandedKeep)); len(keys) != 0 {
		t.Fatalf("entries older than %v are kept: %v", claudeHandedKeep, keys)
	}
	if err := h.remove("a", "b/stalled"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an empty handed file is kept: %v", err)
	}
}
