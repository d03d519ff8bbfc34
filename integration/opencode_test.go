package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// TestOpencodeSessionIsWokenByItsTasks drives a real opencode 1.18.33, with the
// plugin 'bgtask setup opencode' wrote, against a scripted model on loopback,
// and counts the turns the model receives. In the TUI (under tmux), turn 1 runs
// 'bgtask add' for tasks A and C with its shell tool and ends. The bgtask
// server is killed with SIGKILL and restarted while they run. Then:
//   - idle: A ends while the session is idle: one new turn holds its prompt;
//   - busy: turn 2, typed, registers B, which ends while the turn's shell call
//     still runs: one new turn holds B's prompt, after turn 2, and none of turn
//     2's requests does;
//   - closed: the user closes the TUI, C ends, and `opencode run -s ID` resumes
//     the session: its one turn holds the message and C's prompt.
//
// The session's last request holds each prompt exactly once, and its target
// followed its turns (busy in turn 1, idle after).
func TestOpencodeSessionIsWokenByItsTasks(t *testing.T) {
	opencodeBin, tmuxBin := opencodeTools(t)
	root := t.TempDir()
	home := filepath.Join(root, "bg")
	userHome := filepath.Join(root, "user")
	proj := filepath.Join(root, "proj")
	for _, d := range []string{home, userHome, proj} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	server := startServer(t, home)
	model := startChatModel(t, home)
	writeFile(t, filepath.Join(proj, "opencode.json"), fmt.Sprintf(`{
  "$schema": "https://opencode.ai/config.json",
  "provider": {"scripted": {"npm": "@ai-sdk/openai-compatible", "name": "scripted",
    "options": {"baseURL": "http://%s/v1", "apiKey": "not-a-key"}, "models": {"m1": {"name": "m1"}}}},
  "model": "scripted/m1",
  "small_model": "scripted/m1",
  "permission": {"bash": "allow"},
  "autoupdate": false,
  "share": "disabled"
}
`, model.addr))
	ocEnv := []string{"HOME=" + userHome, "XDG_CONFIG_HOME=" + filepath.Join(userHome, ".config"),
		"XDG_DATA_HOME=" + filepath.Join(userHome, ".local", "share"), "XDG_STATE_HOME=" + filepath.Join(userHome, ".local", "state"),
		"XDG_CACHE_HOME=" + filepath.Join(userHome, ".cache"), "BGTASK_HOME=" + home,
		"OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_AUTOUPDATE=1",
		"TERM=xterm-256color", "LANG=C.UTF-8",
		"PATH=" + strings.Join([]string{filepath.Dir(bin), filepath.Dir(opencodeBin), "/usr/local/bin", "/usr/bin", "/bin"}, ":")}
	setup := runBin(t, 30*time.Second, append(childEnv(home), ocEnv...), "--home", home, "setup", "opencode")
	if setup.code != 0 {
		t.Fatalf("bgtask setup opencode: exit %d: %s%s", setup.code, setup.stdout, setup.stderr)
	}

	// The session, as a user's terminal keeps it: a tmux pane, a clean environment.
	sock := filepath.Join(root, "tmux.sock")
	tmux := func(args ...string) (string, error) {
		out, err := exec.Command(tmuxBin, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if t.Failed() {
			screen, _ := tmux("capture-pane", "-p")
			t.Logf("the opencode screen:\n%s", screen)
			t.Logf("the model's requests:\n%s", model.dump())
			log, _ := os.ReadFile(filepath.Join(home, "opencode", "opencode.log"))
			t.Logf("the helpers' log:\n%s", log)
		}
		_, _ = tmux("kill-server")
	})
	for _, name := range []string{"gate-a", "gate-c"} {
		makeGate(t, proj, name)
	}
	turn1 := "RUN:" + shq(bin) + " add --json -- " + shq(gate(filepath.Join(proj, "gate-a"))+"echo a-done") +
		" && " + shq(bin) + " add --json -- " + shq(gate(filepath.Join(proj, "gate-c"))+"echo c-done")
	session := "cd " + shq(proj) + " && exec env -i"
	for _, kv := range ocEnv {
		session += " " + shq(kv)
	}
	session += " " + shq(opencodeBin) + " --prompt " + shq(turn1)
	if out, err := tmux("new-session", "-d", "-x", "200", "-y", "50", session+"; sleep 600"); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}

	// Turn 1 registers A and C, in the session's target.
	var ids []string
	testkit.Eventually(t, 120*time.Second, "two tasks registered from the opencode session", func() bool {
		ids = model.registered()
		return len(ids) == 2
	})
	a, c := ids[0], ids[1]
	target := waitShow(t, home, a)
	if !strings.HasPrefix(target, "opencode-ses_") || waitShow(t, home, c) != target {
		t.Fatalf("targets %q and %q, want the session's, opencode-ses_…", target, waitShow(t, home, c))
	}
	sid := strings.TrimPrefix(target, "opencode-")
	if st := model.stateAtFirstRequest(target); st != events.TargetBusy {
		t.Errorf("target %s was %q while turn 1 ran, want busy", target, st)
	}
	testkit.Eventually(t, 60*time.Second, target+" idle after turn 1", func() bool {
		return targetState(t, home, target) == events.TargetIdle
	})

	// The server dies with SIGKILL while the commands run, and comes back.
	server.stop(syscall.SIGKILL)
	startServer(t, home)

	// Idle: A ends; one new turn holds its prompt.
	openGate(t, proj, "gate-a")
	prompts := map[string]string{a: wakePromptOf(t, home, a)}
	testkit.Eventually(t, 90*time.Second, "the session's turn for task A", func() bool {
		return model.turnsWith(prompts[a]) == 1
	})

	// Busy: turn 2 registers B, which ends while the turn's shell call sleeps.
	before := model.count()
	turn2 := "RUN:" + shq(bin) + " add --json -- echo b-done && sleep 8"
	if out, err := tmux("send-keys", "-l", turn2); err != nil {
		t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
	testkit.Eventually(t, 30*time.Second, "turn 2 typed", func() bool {
		screen, _ := tmux("capture-pane", "-p")
		return strings.Contains(screen, "b-done && sleep 8")
	})
	if out, err := tmux("send-keys", "Enter"); err != nil {
		t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
	var b string
	testkit.Eventually(t, 90*time.Second, "task B registered by turn 2", func() bool {
		if ids := model.registeredSince(before); len(ids) == 1 {
			b = ids[0]
		}
		return b != ""
	})
	prompts[b] = wakePromptOf(t, home, b)
	testkit.Eventually(t, 90*time.Second, "the session's turn for task B", func() bool {
		return model.turnsWith(prompts[b]) == 1
	})
	if n := model.turn2HeldB(before, prompts[b]); n != 0 {
		t.Errorf("%d requests of turn 2 (the busy one) hold B's prompt, want none: it comes after the turn", n)
	}

	// Closed: the user closes the TUI, C ends, and `opencode run -s` resumes the session.
	pane, err := tmux("list-panes", "-F", "#{pane_pid}")
	if err != nil {
		t.Fatalf("tmux list-panes: %v: %s", err, pane)
	}
	var tui int
	if _, err := fmt.Sscan(pane, &tui); err != nil {
		t.Fatalf("the pane's pid %q: %v", pane, err)
	}
	if out, err := tmux("kill-server"); err != nil {
		t.Fatalf("tmux kill-server: %v: %s", err, out)
	}
	testkit.Eventually(t, 60*time.Second, "the TUI gone with its terminal", func() bool { return processGone(tui) })
	// Closed means its helper gone too: one still ending when C's wake-up comes
	// may take it and give it back only at its end (docs/opencode.md).
	testkit.Eventually(t, 60*time.Second, "the session's helper gone with its TUI", func() bool { return !helperRuns(sid) })
	openGate(t, proj, "gate-c")
	prompts[c] = wakePromptOf(t, home, c)
	if n := model.turnsWith(prompts[c]); n != 0 {
		t.Fatalf("%d turns for task C while the session was closed", n)
	}
	resume := exec.Command(opencodeBin, "run", "-s", sid, "go on")
	resume.Dir, resume.Env = proj, ocEnv
	out, err := resumeWithin(resume, 3*time.Minute)
	if err != nil {
		t.Fatalf("opencode run -s %s: %v\n%s", sid, err, out)
	}
	if n := model.turnsWith(prompts[c]); n != 1 {
		t.Errorf("%d turns hold task C's prompt after the resume, want 1", n)
	}
	if last := model.last(); !strings.Contains(last.newUser, "go on") || !strings.Contains(last.newUser, prompts[c]) {
		t.Errorf("the resumed turn's message %q, want the message typed and C's prompt in one", last.newUser)
	}

	last := model.last()
	for id, prompt := range prompts {
		if n := strings.Count(strings.Join(last.userTexts, "\n"), prompt); n != 1 {
			t.Errorf("task %s: its prompt is %d times in the session's last request, want once", id, n)
		}
	}
	if left := ok(t, home, "inbox", "--target", target, "--json"); strings.TrimSpace(left) != "" {
		t.Errorf("wake-ups left in the inbox of %s: %s", target, left)
	}
}

// wakePromptOf is task id's wake-up prompt, once it ended, as the session gets
// it: without the newlines it ends with.
func wakePromptOf(t *testing.T, home, id string) string {
	t.Helper()
	return strings.TrimRight(waitFor(t, home, id).Prompt, "\n")
}

// resumeWithin runs cmd, killing it after within.
func resumeWithin(cmd *exec.Cmd, within time.Duration) (string, error) {
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	timer := time.AfterFunc(within, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	return out.String(), err
}

// opencodeTools finds opencode 1.18.33 and tmux on PATH: missing, the test
// skips, and in CI (which installs them) it fails.
func opencodeTools(t *testing.T) (opencodeBin, tmuxBin string) {
	t.Helper()
	var missing []string
	opencodeBin, err := exec.LookPath("opencode")
	if err != nil {
		missing = append(missing, "opencode (npm install opencode-ai@1.18.33)")
	} else if out, err := exec.Command(opencodeBin, "--version").Output(); err != nil || strings.TrimSpace(string(out)) != "1.18.33" {
		missing = append(missing, fmt.Sprintf("opencode 1.18.33 (found %q)", strings.TrimSpace(string(out))))
	}
	tmuxBin, err = exec.LookPath("tmux")
	if err != nil {
		missing = append(missing, "tmux")
	}
	if len(missing) > 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("not on PATH: %s (.ci/run installs them)", strings.Join(missing, ", "))
		}
		t.Skipf("not on PATH: %s", strings.Join(missing, ", "))
	}
	return opencodeBin, tmuxBin
}

// chatModel is an OpenAI-compatible chat completions API (streamed) as
// opencode's @ai-sdk/openai-compatible provider calls it: a request whose new
// user message says RUN:CMD gets a bash tool call running CMD, every other a
// short text; it records the requests of the session (those with tools: the
// title opencode asks for has none).
type chatModel struct {
	addr string
	home string

	mu        sync.Mutex
	reqs      []chatRequest
	busyFirst string
}

type chatRequest struct {
	lastRole  string
	newUser   string   // the text of the last message, when a user's
	userTexts []string // the text of every user message
	toolOuts  []string
}

func startChatModel(t *testing.T, home string) *chatModel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &chatModel{addr: ln.Addr().String(), home: home}
	srv := &http.Server{Handler: http.HandlerFunc(m.serve)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
		<-done
	})
	return m
}

// chatText is a message's content: a string, or a list of text parts.
func chatText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct{ Text string }
	_ = json.Unmarshal(raw, &parts)
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.Text
	}
	return strings.Join(texts, "\n")
}

func (m *chatModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var rec chatRequest
	for _, msg := range req.Messages {
		switch msg.Role {
		case "user":
			rec.userTexts = append(rec.userTexts, chatText(msg.Content))
		case "tool":
			rec.toolOuts = append(rec.toolOuts, chatText(msg.Content))
		}
	}
	lastMsg := req.Messages[len(req.Messages)-1]
	rec.lastRole = lastMsg.Role
	if rec.lastRole == "user" {
		rec.newUser = chatText(lastMsg.Content)
	}
	var cmd string
	if len(req.Tools) > 0 {
		if _, after, found := strings.Cut(rec.newUser, "RUN:"); found {
			cmd = strings.Trim(after, "\"")
		}
		m.record(rec, cmd != "")
	}
	m.answer(w, cmd)
}

// record keeps a request of the session; for the first that runs a command, the
// state of the target of the session (the plugin marked it as the turn began).
func (m *chatModel) record(rec chatRequest, first bool) {
	m.mu.Lock()
	first = first && len(m.reqs) == 0
	m.reqs = append(m.reqs, rec)
	m.mu.Unlock()
	if !first {
		return
	}
	out, err := exec.Command(bin, "--home", m.home, "target", "list", "--json").Output()
	if err != nil {
		return
	}
	for name, st := range targetStates(out) {
		if strings.HasPrefix(name, "opencode-") {
			m.mu.Lock()
			m.busyFirst = name + " " + st
			m.mu.Unlock()
		}
	}
}

// answer streams a bash call running cmd, or, without one, a short text.
func (m *chatModel) answer(w http.ResponseWriter, cmd string) {
	id := fmt.Sprintf("chatcmpl-%d", time.Now().UnixNano())
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": "m1",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	var chunks []map[string]any
	if cmd != "" {
		args, _ := json.Marshal(map[string]string{"command": cmd, "description": "run it"})
		call := map[string]any{"index": 0, "id": "call_" + id, "type": "function",
			"function": map[string]any{"name": "bash", "arguments": string(args)}}
		chunks = append(chunks, chunk(map[string]any{"role": "assistant", "tool_calls": []any{call}}, nil), chunk(map[string]any{}, "tool_calls"))
	} else {
		end := chunk(map[string]any{}, "stop")
		end["usage"] = map[string]any{"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
		chunks = append(chunks, chunk(map[string]any{"role": "assistant", "content": "Noted."}, nil), end)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, c := range chunks {
		data, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\n", data)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (m *chatModel) stateAtFirstRequest(target string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	name, st, _ := strings.Cut(m.busyFirst, " ")
	if name != target {
		return ""
	}
	return st
}

func (m *chatModel) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.reqs)
}

func (m *chatModel) last() chatRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reqs[len(m.reqs)-1]
}

// registered is the ids that turn 1's shell call printed ('add --json').
func (m *chatModel) registered() []string { return m.registeredSince(0) }

// registeredSince is the ids that the first shell call's output after request
// from holds.
func (m *chatModel) registeredSince(from int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.reqs[min(from, len(m.reqs)):] {
		if r.lastRole != "tool" {
			continue
		}
		var ids []string
		for _, part := range strings.Split(r.toolOuts[len(r.toolOuts)-1], `{"id":"`)[1:] {
			id, _, _ := strings.Cut(part, `"`)
			ids = append(ids, id)
		}
		return ids
	}
	return nil
}

// turnsWith counts the turns whose new user message holds prompt.
func (m *chatModel) turnsWith(prompt string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.reqs {
		if r.lastRole == "user" && strings.Contains(r.newUser, prompt) {
			n++
		}
	}
	return n
}

// turn2HeldB counts the requests of the turn that began at request from (up to
// the next turn) that hold prompt.
func (m *chatModel) turn2HeldB(from int, prompt string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for i, r := range m.reqs[from:] {
		if i > 0 && r.lastRole == "user" {
			break
		}
		if strings.Contains(strings.Join(r.userTexts, "\n")+strings.Join(r.toolOuts, "\n"), prompt) {
			n++
		}
	}
	return n
}

func (m *chatModel) dump() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for i, r := range m.reqs {
		fmt.Fprintf(&b, "%d: last %s, new %.200q\n", i, r.lastRole, r.newUser)
	}
	return b.String()
}

// A helper whose opencode is gone (its stdout a pipe nobody reads) and that
// offers a wake-up gives the offer back to the inbox, rather than being killed
// by SIGPIPE in the middle of its hand-off (which left it handing); once its
// stdin ends too, it ends.
func TestOpencodeHelperWhoseReaderIsGoneGivesTheOfferBack(t *testing.T) {
	home := t.TempDir()
	startServer(t, home)
	const session = "ses_gonereader0001"
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // nobody reads the helper's offers
	stdin, keep, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	helper := exec.Command(bin, "--home", home, "hook", "opencode", "session", session, "--live")
	helper.Env, helper.Stdin, helper.Stdout = childEnv(home), stdin, w
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	w.Close()
	ended := make(chan error, 1)
	go func() { ended <- helper.Wait() }()
	id := add(t, home, "--target", "opencode-"+session, "--", "echo gone-reader")
	waitFor(t, home, id)
	killedBy := func(err error) (syscall.Signal, bool) {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled() {
			return exit.Sys().(syscall.WaitStatus).Signal(), true
		}
		return 0, false
	}
	log := filepath.Join(home, "opencode", "opencode.log")
	testkit.Eventually(t, 60*time.Second, "the helper's offer given back", func() bool {
		select {
		case err := <-ended:
			if sig, ok := killedBy(err); ok {
				t.Fatalf("the helper was killed by %v, in the middle of its offer", sig)
			}
			t.Fatalf("the helper ended (%v) before it offered the wake-up", err)
		default:
		}
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), "hand over:")
	})
	keep.Close() // opencode gone: the helper's stdin ends too
	select {
	case err := <-ended:
		if sig, ok := killedBy(err); ok {
			t.Fatalf("the helper was killed by %v", sig)
		}
	case <-time.After(60 * time.Second):
		_ = helper.Process.Kill()
		t.Fatal("the helper did not end with its stdin")
	}
}

// helperRuns reports whether a process runs the helper of session sid.
func helperRuns(sid string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, _ := os.ReadFile(p)
		if strings.Contains(string(cmdline), "\x00hook\x00opencode\x00session\x00"+sid) {
			return true
		}
	}
	return false
}
