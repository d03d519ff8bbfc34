package gemini

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/internal/testkit"
)

type outcome struct {
	status int
	took   time.Duration
}

// startWaiter runs the waiter of a shell call that ran command in the session,
// against home, with out as its output, until ctx ends.
func startWaiter(ctx context.Context, home, command string, out *syncBuffer) <-chan outcome {
	done := make(chan outcome, 1)
	go func() {
		start := time.Now()
		w := Waiter{Session: sid, Command: command, Config: client.Config{Home: home}, Home: home, Stdout: out, Stderr: out}
		status := w.Run(ctx)
		done <- outcome{status, time.Since(start)}
	}()
	return done
}

func await(t *testing.T, done <-chan outcome, what string) outcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(45 * time.Second):
		t.Fatalf("%s did not end", what)
		return outcome{}
	}
}

// The model's command runs in the session, on the waiter's home; one that
// fails ends the waiter with its status, once Gemini CLI has moved it to the
// background (so that the session is told).
func TestTheWaiterRunsTheCommandInTheSession(t *testing.T) {
	home := t.TempDir()
	t.Setenv("GEMINI_SESSION_ID", "")
	var out syncBuffer
	o := await(t, startWaiter(context.Background(), home, `echo "$GEMINI_SESSION_ID $BGTASK_HOME"; exit 3`, &out), "the waiter")
	if o.status != 3 || out.String() != sid+" "+home+"\n" {
		t.Errorf("status %d, output %q; want 3 and the session and home", o.status, out.String())
	}
	if o.took < backgroundAfter {
		t.Errorf("the waiter ended after %v, before Gemini CLI moves a command to the background", o.took)
	}
}

// A waiter hands over the session's next wake-up, once, and ends; the waiters
// of two calls hand over one wake-up each, one after the other.
func TestTheWaitersHandOverOneWakeUpEach(t *testing.T) {
	home := startServer(t).Home
	var out1, out2 syncBuffer
	first := startWaiter(context.Background(), home, "echo registered", &out1)
	testkit.Eventually(t, 20*time.Second, "the first waiter's command", func() bool { return out1.String() != "" })
	second := startWaiter(context.Background(), home, "echo registered", &out2)
	a := fire(t, home)
	o := await(t, first, "the first waiter")
	if o.status != 0 || out1.String() != "registered\nbgtask wake-up: WAKE "+a+"\n" {
		t.Fatalf("first waiter: status %d, output %q", o.status, out1.String())
	}
	b := fire(t, home)
	o = await(t, second, "the second waiter")
	if o.status != 0 || out2.String() != "registered\nbgtask wake-up: WAKE "+b+"\n" {
		t.Fatalf("second waiter: status %d, output %q", o.status, out2.String())
	}
	if n := unread(t, home); n != 0 {
		t.Errorf("%d wake-ups left in the inbox", n)
	}
}

// A wake-up that waited before the call is handed over only once Gemini CLI
// has moved the waiter to the background: an end before that is told nobody.
func TestTheWaiterLivesUntilItRunsInTheBackground(t *testing.T) {
	home := startServer(t).Home
	a := fire(t, home)
	var out syncBuffer
	o := await(t, startWaiter(context.Background(), home, "true", &out), "the waiter")
	if o.status != 0 || out.String() != "bgtask wake-up: WAKE "+a+"\n" || o.took < backgroundAfter {
		t.Errorf("status %d, output %q after %v", o.status, out.String(), o.took)
	}
}

// A waiter whose session ended hands nothing over: the wake-up stays in the
// inbox for the session's next turn.
func TestTheWaiterOfAnEndedSessionHandsNothingOver(t *testing.T) {
	home := startServer(t).Home
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := startWaiter(ctx, home, "true", &out)
	cancel()
	if o := await(t, done, "the waiter"); o.status == 0 {
		t.Errorf("a waiter stopped by its session ended with 0: %q", out.String())
	}
	fire(t, home)
	if n := unread(t, home); n != 1 || out.String() != "" {
		t.Errorf("%d wake-ups in the inbox, output %q; want the wake-up left there", n, out.String())
	}
}

func TestTheWaiterWaitsThroughARestartOfTheServer(t *testing.T) {
	home := t.TempDir()
	srv := clienttest.Run(t, home)
	var out syncBuffer
	done := startWaiter(context.Background(), home, "true", &out)
	testkit.Eventually(t, 20*time.Second, "the waiter holding the session's lock", func() bool {
		h := &client.Handoff{Target: target, Dir: filepath.Join(home, StateDir)}
		unlock, err := h.Lock(context.Background(), false)
		if err == nil {
			unlock()
		}
		return err != nil
	})
	srv.Stop()
	clienttest.Run(t, home)
	a := fire(t, home)
	if o := await(t, done, "the waiter"); o.status != 0 || out.String() != "bgtask wake-up: WAKE "+a+"\n" {
		t.Errorf("status %d, output %q", o.status, out.String())
	}
}

func TestShownCutsALongPrompt(t *testing.T) {
	if got := Shown(client.Wakeup{ID: "x", Prompt: "short\n"}); got != "short\n" {
		t.Errorf("a short prompt shown as %q", got)
	}
	long := strings.Repeat("é", 3*maxShown)
	got := Shown(client.Wakeup{ID: "0196f3", Prompt: long})
	if n := len([]rune(got)); n != maxShown || !strings.HasPrefix(got, "éé") || !strings.HasSuffix(got, "'bgtask wait 0196f3' prints all of it]") {
		t.Errorf("a long prompt shown as %d characters: ...%q", n, got[len(got)-120:])
	}
}

// A waiter ends with its Gemini CLI, handing nothing over: one that ended
// after a headless turn, or was killed, leaves its background commands running.
func TestTheWaiterEndsWithItsGeminiCLI(t *testing.T) {
	home := startServer(t).Home
	gemini := exec.Command("sleep", "600")
	if err := gemini.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan outcome, 1)
	var out syncBuffer
	go func() {
		w := Waiter{Session: sid, Command: "true", Gemini: gemini.Process.Pid, Config: client.Config{Home: home}, Home: home, Stdout: &out, Stderr: &out}
		done <- outcome{status: w.Run(context.Background())}
	}()
	_ = gemini.Process.Kill()
	_ = gemini.Wait()
	if o := await(t, done, "the waiter of a Gemini CLI that is gone"); o.status == 0 {
		t.Errorf("the waiter ended with 0: %q", out.String())
	}
	fire(t, home)
	if n := unread(t, home); n != 1 || out.String() != "" {
		t.Errorf("%d wake-ups in the inbox, output %q; want the wake-up left there", n, out.String())
	}
}

// failingWriter is the output of a waiter whose Gemini CLI is gone: a pipe that
// nobody reads.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// A waiter that cannot print the wake-up gives it back: the session's next turn
// gets it.
func TestTheWaiterThatCannotPrintGivesTheWakeUpBack(t *testing.T) {
	home := startServer(t).Home
	a := fire(t, home)
	w := Waiter{Session: sid, Command: "true", Config: client.Config{Home: home}, Home: home, Stdout: failingWriter{}, Stderr: failingWriter{}}
	if status := w.Run(context.Background()); status == 0 {
		t.Fatal("a waiter that could not print ended with 0")
	}
	if _, got, stderr := runHook(t, home, "BeforeAgent", sessionInput("")); got.Specific.Additional != "bgtask wake-up: WAKE "+a+"\n" {
		t.Errorf("the next turn got %q (%s), want the wake-up", got.Specific.Additional, stderr)
	}
}
