package gemini

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
)

const sid = "6b1ffa89-8a2d-453b-9f68-b0d7306e393b"

const target = TargetPrefix + sid

// syncBuffer is an output that a test reads while a hook or a waiter writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startServer(t *testing.T) *clienttest.Server {
	t.Helper()
	return clienttest.Run(t, t.TempDir())
}

// answer is a hook's answer, as Gemini CLI reads it.
type answer struct {
	Specific struct {
		Event      string `json:"hookEventName"`
		Additional string `json:"additionalContext"`
		ToolInput  struct {
			Command      string `json:"command"`
			IsBackground bool   `json:"is_background"`
		} `json:"tool_input"`
	} `json:"hookSpecificOutput"`
}

// runHook runs the hook of event with input against home, and returns its
// answer (raw and read) and what it said on stderr.
func runHook(t *testing.T, home, event, input string) (raw string, a answer, stderr string) {
	t.Helper()
	var stdout, errOut syncBuffer
	h := Hook{Config: client.Config{Home: home}, Home: home, Bgtask: "/bin/bgtask", Gemini: 4242, Stdin: strings.NewReader(input), Stdout: &stdout, Stderr: &errOut}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.Run(ctx, event)
	if err := json.Unmarshal([]byte(stdout.String()), &a); err != nil {
		t.Fatalf("%s answered no JSON (%v): %q", event, err, stdout.String())
	}
	return strings.TrimSpace(stdout.String()), a, errOut.String()
}

func sessionInput(extra string) string {
	return `{"session_id": "` + sid + `", "hook_event_name": "x"` + extra + `}`
}

func connect(t *testing.T, home string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// fire registers a timer whose wake-up, "WAKE ID", goes to the session's
// target, and returns its id once it fired.
func fire(t *testing.T, home string) string {
	t.Helper()
	c := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: "WAKE {{task_id}}", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, reg.ID); err != nil {
		t.Fatal(err)
	}
	return reg.ID
}

func unread(t *testing.T, home string) int {
	t.Helper()
	c := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inbox, err := c.Inbox(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	n, err := inbox.Unread(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func state(t *testing.T, home string) string {
	t.Helper()
	c := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Target(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

// A turn that starts marks the session busy and gets, once, the wake-ups that
// waited for it; the end of a turn and the session's start and end mark it
// idle.
func TestTheTurnHooksMarkTheSessionAndBeforeAgentHandsOverWhatWaited(t *testing.T) {
	home := startServer(t).Home
	id := fire(t, home)
	_, a, stderr := runHook(t, home, "BeforeAgent", sessionInput(`, "prompt": "go on"`))
	if a.Specific.Event != "BeforeAgent" || a.Specific.Additional != "bgtask wake-up: WAKE "+id+"\n" {
		t.Fatalf("BeforeAgent added %q (event %q), want the wake-up; stderr %q", a.Specific.Additional, a.Specific.Event, stderr)
	}
	if st := state(t, home); st != client.TargetBusy {
		t.Errorf("after BeforeAgent the target is %q, want busy", st)
	}
	if n := unread(t, home); n != 0 {
		t.Errorf("%d wake-ups left in the inbox after they were handed over", n)
	}
	if raw, _, _ := runHook(t, home, "BeforeAgent", sessionInput("")); raw != "{}" {
		t.Errorf("the next turn got %s, want nothing: the wake-up was handed over", raw)
	}
	for _, event := range []string{"AfterAgent", "SessionStart", "SessionEnd"} {
		runHook(t, home, "BeforeAgent", sessionInput(""))
		if raw, _, stderr := runHook(t, home, event, sessionInput("")); raw != "{}" || stderr != "" {
			t.Errorf("%s answered %s, said %q", event, raw, stderr)
		}
		if st := state(t, home); st != client.TargetIdle {
			t.Errorf("after %s the target is %q, want idle", event, st)
		}
	}
}

// While a waiter of the session holds its lock, the waiter hands the wake-ups
// over, as the end of its background command: BeforeAgent leaves them.
func TestBeforeAgentLeavesTheWakeUpsToTheWaiter(t *testing.T) {
	home := startServer(t).Home
	fire(t, home)
	waiter := &client.Handoff{Target: target, Dir: filepath.Join(home, StateDir)}
	unlock, err := waiter.Lock(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if raw, _, stderr := runHook(t, home, "BeforeAgent", sessionInput("")); raw != "{}" || stderr != "" {
		t.Errorf("BeforeAgent answered %s and said %q while a waiter held the lock", raw, stderr)
	}
	unlock()
	if n := unread(t, home); n != 1 {
		t.Errorf("%d wake-ups in the inbox, want the one left to the waiter", n)
	}
}

func TestBeforeToolHandsACallThatAddsToAWaiter(t *testing.T) {
	home := t.TempDir() // no server: BeforeTool needs none
	shell := func(command string) string {
		data, _ := json.Marshal(map[string]any{"command": command, "description": "x"})
		return sessionInput(`, "tool_name": "run_shell_command", "tool_input": ` + string(data))
	}
	_, a, _ := runHook(t, home, "BeforeTool", shell("cd app && bgtask add -- make"))
	want := "'/bin/bgtask' --home '" + home + "' hook gemini attach --pid 4242 " + sid + " -- 'cd app && bgtask add -- make'"
	if a.Specific.Event != "BeforeTool" || a.Specific.ToolInput.Command != want || !a.Specific.ToolInput.IsBackground {
		t.Errorf("BeforeTool answered %+v, want %q in the background", a.Specific, want)
	}
	for _, input := range []string{
		shell("make test"),
		sessionInput(`, "tool_name": "write_file", "tool_input": {"command": "bgtask add -- make"}`),
	} {
		if raw, _, stderr := runHook(t, home, "BeforeTool", input); raw != "{}" || stderr != "" {
			t.Errorf("%s: answered %s, said %q; want no change", input, raw, stderr)
		}
	}
}

// A hook answers "no change" whatever goes wrong, says why on stderr, and does
// not hold the session for long.
func TestTheHooksNeverFail(t *testing.T) {
	empty := t.TempDir() // no server ever ran here
	for _, tc := range []struct{ home, event, input, said string }{
		{empty, "BeforeAgent", sessionInput(""), "target busy"},
		{empty, "AfterAgent", sessionInput(""), "target idle"},
		{empty, "SessionStart", "not JSON", "not JSON"},
		{empty, "BeforeTool", `{"session_id": "a b"}`, "cannot name a target"},
		{empty, "Notification", sessionInput(""), `event "Notification"`},
	} {
		start := time.Now()
		raw, _, stderr := runHook(t, tc.home, tc.event, tc.input)
		if raw != "{}" || !strings.Contains(stderr, tc.said) {
			t.Errorf("%s %s: answered %s, said %q; want {} and %q", tc.event, tc.input, raw, stderr, tc.said)
		}
		if took := time.Since(start); took > 2*hookBound+time.Second {
			t.Errorf("%s took %v", tc.event, took)
		}
	}
}
