package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestAddWaitFiresExactlyOnceWithExitCodeAndTail(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)

	id := add(t, home, "--kind", "build", "--origin", `{"chat":"c-1"}`, "--", "echo one; echo two >&2; exit 3")
	w := waitFor(t, home, id)
	if w.ID != id || w.Status != "failed" || w.ExitCode == nil || *w.ExitCode != 3 {
		t.Fatalf("wake-up = %+v, want id %s, failed, exit 3", w, id)
	}
	// stdout and stderr come through two pipes: both lines, in the order read.
	if got := w.Tail; len(got) != 2 || !slices.Contains(got, "one") || !slices.Contains(got, "two") {
		t.Fatalf("tail = %q, want one and two", got)
	}
	if !strings.Contains(w.Prompt, "exit code 3") || !strings.Contains(w.Prompt, id) {
		t.Fatalf("default prompt lacks the exit code or id:\n%s", w.Prompt)
	}
	if origin, _ := json.Marshal(w.Origin); string(origin) != `{"chat":"c-1"}` {
		t.Fatalf("origin = %s, want it echoed back", origin)
	}

	h := history(t, home, id)
	n := countTypes(h)
	for _, typ := range []string{"armed", "spawned", "exited", "completion-persisted", "fired"} {
		if n[typ] != 1 {
			t.Fatalf("history has %d %s events, want 1: %v", n[typ], typ, n)
		}
	}
	var order []string
	for i, e := range h {
		if e.Type != "tick" {
			order = append(order, e.Type)
		}
		if i > 0 && e.Seq <= h[i-1].Seq {
			t.Fatalf("history not in sequence order at %d", i)
		}
		if e.Time.IsZero() {
			t.Fatalf("event %d has no time", i)
		}
	}
	if want := []string{"armed", "spawned", "exited", "completion-persisted", "fired"}; !slices.Equal(order, want) {
		t.Fatalf("history order = %v, want %v", order, want)
	}

	// The inbox holds exactly one wake-up, and reading acknowledges it.
	first := strings.TrimSpace(ok(t, home, "inbox", "--json"))
	lines := strings.Split(first, "\n")
	if len(lines) != 1 {
		t.Fatalf("inbox printed %d wake-ups, want 1:\n%s", len(lines), first)
	}
	if got := decodeJSON[wakeup](t, lines[0]); got.ID != id || got.Prompt != w.Prompt {
		t.Fatalf("inbox wake-up = %+v, want the one wait printed", got)
	}
	if again := ok(t, home, "inbox", "--json"); again != "" {
		t.Fatalf("inbox read twice gave a wake-up again:\n%s", again)
	}
}

func TestWakeupGoesToTheSpecsTargetWithARenderedPrompt(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	id := add(t, home, "--target", "agent-7", "--prompt", "{{task_id}} {{status}} {{exit_code}}: {{tail}} ({{origin.session}})",
		"--origin", `{"session":"s-9"}`, "--", "echo done")
	w := waitFor(t, home, id)
	if want := id + " succeeded 0: done (s-9)"; w.Prompt != want {
		t.Fatalf("prompt = %q, want %q", w.Prompt, want)
	}
	if out := ok(t, home, "inbox", "--json"); out != "" {
		t.Fatalf("default inbox got a wake-up meant for agent-7:\n%s", out)
	}
	if out := ok(t, home, "inbox", "--json", "--target", "agent-7"); !strings.Contains(out, id) {
		t.Fatalf("inbox agent-7 lacks %s:\n%s", id, out)
	}
}

func TestCancelKillsTheProcessTreeAndDeliversNothing(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	dir := t.TempDir()
	// The command starts a child that starts a grandchild; each writes its pid.
	script := `sh -c 'sleep 600 & echo $! > grandchild; wait' & echo $! > child; echo $$ > leader; wait`
	id := add(t, home, "--cwd", dir, "--", script)

	pids := map[string]int{}
	testkit.Eventually(t, 30*time.Second, "the command tree started", func() bool {
		for _, name := range []string{"leader", "child", "grandchild"} {
			data, err := os.ReadFile(filepath.Join(dir, name))
			pid, perr := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil || perr != nil {
				return false
			}
			pids[name] = pid
		}
		return true
	})
	if got := decodeJSON[struct{ State string }](t, ok(t, home, "show", id, "--json")).State; got != "running" {
		t.Fatalf("state before cancel = %s, want running", got)
	}

	ok(t, home, "cancel", id, "--reason", "test")
	for name, pid := range pids {
		testkit.Eventually(t, 30*time.Second, name+" gone after cancel", func() bool { return processGone(pid) })
	}
	w := waitFor(t, home, id)
	if w.Status != "cancelled" {
		t.Fatalf("wait after cancel: status %q, want cancelled", w.Status)
	}
	n := countTypes(history(t, home, id))
	if n["cancelled"] != 1 || n["exited"] != 0 || n["fired"] != 0 || n["completion-persisted"] != 0 {
		t.Fatalf("history after cancel: %v, want one cancelled and no exit or delivery", n)
	}
	if out := ok(t, home, "inbox", "--json"); out != "" {
		t.Fatalf("a cancelled task was delivered:\n%s", out)
	}
	again := run(t, home, "cancel", id)
	if again.code == 0 || !strings.Contains(again.stderr, "already finished") {
		t.Fatalf("second cancel: exit %d, stderr %q; want a clear no-op error", again.code, again.stderr)
	}
}

func TestUnknownTaskIDIsAnErrorInEveryCommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	for _, cmd := range [][]string{
		{"show", "no-such-id"}, {"history", "no-such-id"}, {"wait", "no-such-id"}, {"cancel", "no-such-id"},
		{"show", "01a22a60-c563-7096-9a88-ac2479fc52d0"}, {"wait", "abc.def", "--timeout", "1s"},
	} {
		r := run(t, home, cmd...)
		if r.code == 0 || !strings.Contains(r.stderr, "no such task") {
			t.Errorf("bgtask %s: exit %d, stderr %q; want non-zero and 'no such task'", strings.Join(cmd, " "), r.code, r.stderr)
		}
	}
	// Fewer than 6 characters could name many tasks: a usage error, not a lookup.
	if r := run(t, home, "wait", "a.b", "--timeout", "1s"); r.code != 2 || !strings.Contains(r.stderr, "too short") {
		t.Errorf("bgtask wait a.b: exit %d, stderr %q; want exit 2 and 'too short'", r.code, r.stderr)
	}
}

func TestIdempotencyKeyArmsOnce(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	first := add(t, home, "--idempotency-key", "deploy-42", "--", "echo once")
	second := add(t, home, "--idempotency-key", "deploy-42", "--", "echo once")
	if first != second {
		t.Fatalf("same key gave ids %s and %s", first, second)
	}
	other := add(t, home, "--idempotency-key", "deploy-43", "--", "echo once")
	if other == first {
		t.Fatal("a different key gave the same id")
	}
	waitFor(t, home, first)
	if n := countTypes(history(t, home, first)); n["armed"] != 1 || n["spawned"] != 1 || n["fired"] != 1 {
		t.Fatalf("history of the keyed task: %v, want one armed, spawned and fired", n)
	}
}

// badSpecs are rejected registrations: each must name the field that is wrong.
var badSpecs = []struct {
	name, spec, field string
}{
	{"unknown field", `{"command":"true","colour":"red"}`, "colour"},
	{"empty command", `{"command":"  "}`, "command"},
	{"no command", `{}`, "command"},
	{"command and argv", `{"command":"true","argv":["true"]}`, "argv"},
	{"relative cwd", `{"command":"true","cwd":"relative/dir"}`, "cwd"},
	{"missing cwd", `{"command":"true","cwd":"/nonexistent-bgtask-dir"}`, "cwd"},
	{"argv not an array", `{"argv":"true"}`, "argv"},
	{"bad target", `{"command":"true","target":"a.b"}`, "target"},
	{"bad env name", `{"command":"true","env":{"A=B":"c"}}`, "env"},
	{"unknown placeholder", `{"command":"true","prompt":"{{nope}}"}`, "prompt"},
	{"not JSON", `command=true`, "spec"},
	{"oversized", `{"command":"true","kind":"` + strings.Repeat("x", 70<<10) + `"}`, "spec"},
}

func TestBadSpecsAreRejectedOverNATSAndAppendNothing(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	nc, js := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	before, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range badSpecs {
		msg, err := nc.RequestWithContext(ctx, "bgtask.register", []byte(tc.spec))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var reply struct {
			ID    string `json:"id"`
			Error *struct {
				Code    int    `json:"code"`
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			t.Fatalf("%s: reply is not JSON: %s", tc.name, msg.Data)
		}
		if reply.Error == nil || reply.ID != "" {
			t.Errorf("%s: accepted: %s", tc.name, msg.Data)
			continue
		}
		if reply.Error.Field != tc.field || reply.Error.Code != 400 || !strings.Contains(reply.Error.Message, tc.field) {
			t.Errorf("%s: error %+v, want code 400 naming field %q", tc.name, reply.Error, tc.field)
		}
		if msg.Header.Get(micro.ErrorCodeHeader) != "400" {
			t.Errorf("%s: micro error header = %q, want 400", tc.name, msg.Header.Get(micro.ErrorCodeHeader))
		}
	}
	after, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("rejected specs appended events: last seq %d -> %d", before.State.LastSeq, after.State.LastSeq)
	}

	// The CLI says the same and exits non-zero.
	r := run(t, home, "add", "--cwd", "/nonexistent-bgtask-dir", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "cwd") {
		t.Fatalf("add with a missing cwd: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestTheAPIIsAMicroServiceWithItsEndpoints(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	nc, _ := connect(t, home)
	msg, err := nc.Request("$SRV.INFO.bgtask", nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	subjects := map[string]bool{}
	for _, ep := range info.Endpoints {
		subjects[ep.Subject] = true
	}
	for _, s := range []string{"bgtask.register", "bgtask.cancel", "bgtask.get", "bgtask.list", "bgtask.history"} {
		if !subjects[s] {
			t.Errorf("service bgtask lacks endpoint %s: %+v", s, info.Endpoints)
		}
	}
}

func TestServerIsLoopbackOnlyAuthenticatedAndAloneOnItsHome(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)

	for _, f := range []string{"credentials.json", "server.json"} {
		info, err := os.Stat(filepath.Join(home, f))
		if err != nil {
			t.Fatal(err)
		}
		if mode := info.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %o, want 600", f, mode)
		}
	}
	second := start(t, home, "server")
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatal("a second server on the same home did not refuse")
	}
	if second.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(second.out.String(), "already running") {
		t.Fatalf("second server: exit %d, output %q", second.cmd.ProcessState.ExitCode(), second.out.String())
	}

	var d struct{ URL string }
	data, _ := os.ReadFile(filepath.Join(home, "server.json"))
	_ = json.Unmarshal(data, &d)
	if !strings.HasPrefix(d.URL, "nats://127.0.0.1:") {
		t.Fatalf("server listens on %s, want loopback", d.URL)
	}
	// Without the credentials nothing gets in.
	r := run(t, t.TempDir(), "--nats", d.URL, "list")
	if r.code == 0 || !strings.Contains(strings.ToLower(r.stderr), "authorization") {
		t.Fatalf("unauthenticated list: exit %d, stderr %q", r.code, r.stderr)
	}

	other := run(t, t.TempDir(), "server", "--listen", "0.0.0.0:0")
	if other.code == 0 || !strings.Contains(other.stderr, "loopback") {
		t.Fatalf("server --listen 0.0.0.0: exit %d, stderr %q", other.code, other.stderr)
	}
}

func TestServerStopsCleanlyOnSIGTERMAndSIGINT(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		home := t.TempDir()
		srv := startServer(t, home)
		srv.stop(sig)
		if code := srv.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("exit status after %v = %d:\n%s", sig, code, srv.out.String())
		}
		if _, err := os.Stat(filepath.Join(home, "server.json")); !os.IsNotExist(err) {
			t.Fatalf("server.json left behind after %v", sig)
		}
		if r := run(t, home, "list", "--timeout", "1s"); r.code == 0 || !strings.Contains(r.stderr, "no bgtask server") {
			t.Fatalf("list with no server: exit %d, stderr %q", r.code, r.stderr)
		}
	}
}
