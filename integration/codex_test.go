package integration

import (
	"context"
	"encoding/json"
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

// TestCodexSessionIsWokenByItsTasks drives a real interactive Codex 0.169.0 session
// under tmux against a scripted model on loopback. Turn 1 of the model runs, with
// Codex's shell tool, 'bgtask add' four times; the turn ends and nobody types
// anything again. The bgtask server is killed with SIGKILL and restarted while the
// commands run; then task A ends, and later B and C within the same instant; then
// the user closes the session and D ends; then E ends with no sink to hand it
// over, and the user resumes the session. Each wake-up must reach the thread as a
// turn of its own that Codex opened from its queue, and the thread's last request
// must hold each prompt exactly once. The thread's busy/idle state must have
// followed its turns through the hooks that 'bgtask setup codex' installed.
//
// It runs twice: as a user starts Codex, with the TUI's thread in Codex's shared
// app-server daemon; and with --dangerously-bypass-hook-trust, which keeps the
// thread in the TUI's own process, where 'codex queue --resume' cannot resume it
// ("already has an active writer") and the TUI takes the message itself.
func TestCodexSessionIsWokenByItsTasks(t *testing.T) {
	codexBin, tmuxBin := codexTools(t)
	t.Run("daemon", func(t *testing.T) { codexWakeups(t, codexBin, tmuxBin, false) })
	t.Run("in-process", func(t *testing.T) { codexWakeups(t, codexBin, tmuxBin, true) })
}

func codexWakeups(t *testing.T, codexBin, tmuxBin string, bypassTrust bool) {
	root := t.TempDir()
	home := filepath.Join(root, "bg")
	userHome := filepath.Join(root, "user")
	codexHome := filepath.Join(userHome, ".codex")
	proj := filepath.Join(root, "proj")
	for _, d := range []string{home, codexHome, proj} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	server := startServer(t, home)

	var adds []string
	for _, name := range []string{"a", "b", "c", "d"} {
		makeGate(t, proj, "gate-"+name)
		adds = append(adds, shq(bin)+" add --json -- "+shq(gate(filepath.Join(proj, "gate-"+name))+"echo "+name+"-done"))
	}
	model := startModel(t, strings.Join(adds, " && "), home)

	writeFile(t, filepath.Join(codexHome, "config.toml"), fmt.Sprintf(`model = "scripted"
model_provider = "scripted"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.scripted]
name = "scripted"
base_url = "http://%s/v1"
wire_api = "responses"

[projects.%q]
trust_level = "trusted"
`, model.addr, proj))
	codexEnv := []string{"HOME=" + userHome, "CODEX_HOME=" + codexHome, "BGTASK_HOME=" + home}
	setup := runBin(t, 30*time.Second, append(childEnv(home), codexEnv...), "--home", home, "setup", "codex")
	if setup.code != 0 {
		t.Fatalf("bgtask setup codex: exit %d: %s%s", setup.code, setup.stdout, setup.stderr)
	}

	// The session, as a user's terminal would keep it: a tmux pane. Its environment
	// is a clean one; Codex's own daemon, which runs the shell tool, inherits it.
	node, _ := exec.LookPath("node")
	path := strings.Join([]string{filepath.Dir(codexBin), filepath.Dir(node), "/usr/local/bin", "/usr/bin", "/bin"}, ":")
	sock := filepath.Join(root, "tmux.sock")
	tmux := func(args ...string) (string, error) {
		out, err := exec.Command(tmuxBin, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	startTUI := func(args ...string) {
		session := "env -i TERM=xterm-256color LANG=C.UTF-8 PATH=" + shq(path)
		for _, kv := range codexEnv {
			session += " " + shq(kv)
		}
		session += " " + shq(codexBin)
		if bypassTrust {
			session += " --dangerously-bypass-hook-trust"
		}
		for _, a := range args {
			session += " " + shq(a)
		}
		if out, err := tmux("new-session", "-d", "-x", "200", "-y", "50", session+"; sleep 600"); err != nil {
			t.Fatalf("tmux: %v: %s", err, out)
		}
	}
	stopDaemon := func() {
		stop := exec.Command(codexBin, "app-server", "daemon", "stop")
		stop.Env = append(os.Environ(), codexEnv...)
		if out, err := stop.CombinedOutput(); err != nil {
			t.Logf("codex app-server daemon stop: %v: %s", err, out)
		}
		// 'daemon stop' leaves the daemon's pid-update-loop running.
		killProgramsUnder(codexHome)
	}
	startTUI("-C", proj, "start the tasks")
	t.Cleanup(func() {
		if t.Failed() {
			screen, _ := tmux("capture-pane", "-p")
			t.Logf("the Codex screen:\n%s", screen)
		}
		_, _ = tmux("kill-server")
		stopDaemon()
	})

	var ids []string
	defer func() {
		if !t.Failed() {
			return
		}
		for _, id := range ids {
			for _, r := range payloads[events.DeliveryResult](t, history(t, home, id), "delivery-result") {
				t.Logf("task %s: push attempt %d ok=%v %s: %s", id, r.Attempt, r.OK, r.Error, r.Output)
			}
		}
		// What the deliver that the SessionStart hook starts did.
		logs, _ := filepath.Glob(filepath.Join(home, "codex", "*.log"))
		for _, name := range logs {
			data, _ := os.ReadFile(name)
			t.Logf("%s:\n%s", name, data)
		}
	}()

	keys := func(k string) {
		if out, err := tmux("send-keys", k); err != nil {
			t.Fatalf("tmux send-keys: %v: %s", err, out)
		}
	}
	var pressed time.Time
	if !bypassTrust {
		// The user trusts the hooks setup installed, once, as Codex asks at the first
		// start after it.
		testkit.Eventually(t, 60*time.Second, "Codex asking to review the new hooks", func() bool {
			screen, _ := tmux("capture-pane", "-p")
			return strings.Contains(screen, "Trust all and continue")
		})
		// A key that comes while the TUI still discards what was typed before it drew
		// the question is lost: it is pressed again until the screen shows it.
		testkit.Eventually(t, 20*time.Second, "the choice to trust the hooks selected", func() bool {
			screen, _ := tmux("capture-pane", "-p")
			if strings.Contains(screen, "› 2. Trust all and continue") {
				return true
			}
			if time.Since(pressed) > 500*time.Millisecond {
				keys("2")
				pressed = time.Now()
			}
			return false
		})
		keys("Enter")
	}

	// Turn 1: the model's shell call registers the tasks, and the turn ends.
	var thread string
	testkit.Eventually(t, 60*time.Second, "Codex's first request to the model", func() bool {
		thread = model.mainThread()
		return thread != ""
	})
	target := "codex-" + thread
	testkit.Eventually(t, 60*time.Second, "four tasks registered from the Codex session", func() bool {
		ids = model.registered()
		return len(ids) == 4
	})
	for _, id := range ids {
		if got := waitShow(t, home, id); got != target {
			t.Fatalf("task %s: target %q, want %q", id, got, target)
		}
	}
	if st := model.stateAtFirstRequest(); st != events.TargetBusy {
		t.Errorf("target %s was %q while turn 1 ran, want busy (UserPromptSubmit hook)", target, st)
	}
	testkit.Eventually(t, 30*time.Second, target+" idle after turn 1 (Stop hook)", func() bool {
		return targetState(t, home, target) == events.TargetIdle
	})

	// The server dies with SIGKILL while the commands run, and comes back.
	server.stop(syscall.SIGKILL)
	startServer(t, home)

	prompts := map[string]string{}
	openGate(t, proj, "gate-a")
	prompts[ids[0]] = waitFor(t, home, ids[0]).Prompt
	testkit.Eventually(t, 60*time.Second, "the thread's turn for task A's wake-up", func() bool {
		return model.queuedTurnsWith(thread, prompts[ids[0]]) == 1
	})
	openGate(t, proj, "gate-b")
	openGate(t, proj, "gate-c")
	for _, id := range ids[1:3] {
		prompts[id] = waitFor(t, home, id).Prompt
	}
	testkit.Eventually(t, 60*time.Second, "the thread's turns for tasks B and C", func() bool {
		return model.queuedTurnsWith(thread, prompts[ids[1]]) == 1 && model.queuedTurnsWith(thread, prompts[ids[2]]) == 1
	})
	// Every wake-up was acknowledged once handed over: nothing is left to hand
	// over again, so no later turn can bring one twice.
	for _, id := range ids[:3] {
		testkit.Eventually(t, 30*time.Second, "task "+id+"'s exec sink succeeded", func() bool {
			for _, r := range payloads[events.DeliveryResult](t, history(t, home, id), "delivery-result") {
				if r.OK {
					return true
				}
			}
			return false
		})
	}
	if left := ok(t, home, "inbox", "--target", target, "--json"); strings.TrimSpace(left) != "" {
		t.Errorf("wake-ups left in the inbox of %s: %s", target, left)
	}
	testkit.Eventually(t, 30*time.Second, target+" idle after the wake-ups' turns", func() bool {
		return targetState(t, home, target) == events.TargetIdle
	})

	// The user closes the session; task D ends. Codex's daemon resumes the thread
	// and runs the turn there, where 'codex resume' shows it.
	if out, err := tmux("kill-server"); err != nil {
		t.Fatalf("tmux kill-server: %v: %s", err, out)
	}
	openGate(t, proj, "gate-d")
	prompts[ids[3]] = waitFor(t, home, ids[3]).Prompt
	testkit.Eventually(t, 60*time.Second, "the closed thread's turn for task D", func() bool {
		return model.queuedTurnsWith(thread, prompts[ids[3]]) == 1
	})

	// A wake-up that nothing handed over (the spec's only sink does nothing) waits
	// in the inbox. The user resumes the session and types a prompt: Codex runs the
	// SessionStart hook (source resume) only as that first turn starts, and the hook
	// hands the wake-up over, for the turn after it.
	e := add(t, home, "--target", target, "--exec-json", `["true"]`, "--", "echo e-done")
	prompts[e] = waitFor(t, home, e).Prompt
	if bypassTrust {
		// D's turn left the thread in the daemon, and a TUI with an app server of its
		// own shows "This conversation is open in another app" for it: the user closes
		// it there, as that screen says.
		stopDaemon()
	}
	startTUI("resume", "-C", proj, thread)
	pressed = time.Time{}
	testkit.Eventually(t, 30*time.Second, "the resumed session taking a prompt", func() bool {
		screen, _ := tmux("capture-pane", "-p")
		if strings.Contains(screen, "› go on") {
			return true
		}
		if strings.Contains(screen, "Ask Codex to do anything") && time.Since(pressed) > time.Second {
			keys("go on")
			pressed = time.Now()
		}
		return false
	})
	keys("Enter")
	testkit.Eventually(t, 60*time.Second, "the resumed thread's turn for task E", func() bool {
		return model.queuedTurnsWith(thread, prompts[e]) == 1
	})

	last := model.lastRequest(thread)
	for id, prompt := range prompts {
		if n := strings.Count(strings.Join(last.userTexts, "\n"), prompt); n != 1 {
			t.Errorf("task %s: its wake-up prompt is %d times in the thread's last request, want once", id, n)
		}
	}
	for _, r := range model.requests(thread) {
		if r.trigger != "user" && r.trigger != "queue" {
			t.Errorf("a request of the thread opened by %q", r.trigger)
		}
	}
	userTurns := map[string]bool{}
	for _, r := range model.requests(thread) {
		if r.trigger == "user" {
			userTurns[r.turn] = true
		}
	}
	if len(userTurns) != 2 {
		t.Errorf("%d user turns, want 2: the first prompt and the one typed after the resume", len(userTurns))
	}
}

// codexTools finds the codex CLI and tmux on PATH: missing, the test skips, and in
// CI (which installs them) it fails.
func codexTools(t *testing.T) (codexBin, tmuxBin string) {
	t.Helper()
	var missing []string
	codexBin, err := exec.LookPath("codex")
	if err != nil {
		missing = append(missing, "codex (npm install @openai/codex@0.169.0)")
	} else if out, err := exec.Command(codexBin, "--version").Output(); err != nil || !strings.Contains(string(out), "0.169.0") {
		missing = append(missing, fmt.Sprintf("codex 0.169.0 (found %q)", strings.TrimSpace(string(out))))
	}
	tmuxBin, err = exec.LookPath("tmux")
	if err != nil {
		missing = append(missing, "tmux")
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing = append(missing, "node")
	}
	if len(missing) > 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("not on PATH: %s (.ci/run installs them)", strings.Join(missing, ", "))
		}
		t.Skipf("not on PATH: %s", strings.Join(missing, ", "))
	}
	return codexBin, tmuxBin
}

// scriptedModel is the OpenAI Responses API (streamed) as Codex 0.169.0 calls it
// for a custom provider: it answers the first request of a thread's user turn with
// a shell call running cmd, and everything else with a short message, and records
// every request.
type scriptedModel struct {
	addr string
	cmd  string
	home string

	mu        sync.Mutex
	reqs      []modelRequest
	busyFirst string
}

type modelRequest struct {
	thread, turn, trigger, source string
	userTexts                     []string // every input_text of the user messages, in order
	toolOutputs                   []string
}

func startModel(t *testing.T, cmd, home string) *scriptedModel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &scriptedModel{addr: ln.Addr().String(), cmd: cmd, home: home}
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

func (m *scriptedModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/responses" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Input []struct {
			Type    string `json:"type"`
			Role    string `json:"role"`
			Output  any    `json:"output"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"input"`
		Metadata struct {
			Turn string `json:"x-codex-turn-metadata"`
		} `json:"client_metadata"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var meta struct {
		Thread  string `json:"thread_id"`
		Turn    string `json:"turn_id"`
		Trigger string `json:"turn_trigger"`
		Source  string `json:"thread_source"`
	}
	_ = json.Unmarshal([]byte(req.Metadata.Turn), &meta)
	rec := modelRequest{thread: meta.Thread, turn: meta.Turn, trigger: meta.Trigger, source: meta.Source}
	for _, in := range req.Input {
		switch {
		case in.Type == "message" && in.Role == "user":
			for _, c := range in.Content {
				rec.userTexts = append(rec.userTexts, c.Text)
			}
		case in.Type == "function_call_output":
			out, _ := json.Marshal(in.Output)
			rec.toolOutputs = append(rec.toolOutputs, string(out))
		}
	}
	m.mu.Lock()
	first := rec.source == "user" && m.mainThreadLocked() == ""
	m.reqs = append(m.reqs, rec)
	m.mu.Unlock()

	if first {
		// The UserPromptSubmit hook ran before this request was made.
		out, err := exec.Command(bin, "--home", m.home, "target", "list", "--json").Output()
		if err == nil {
			m.mu.Lock()
			m.busyFirst = targetStates(out)["codex-"+rec.thread]
			m.mu.Unlock()
		}
	}
	id := fmt.Sprintf("resp_%d", time.Now().UnixNano())
	usage := map[string]any{"input_tokens": 10, "input_tokens_details": nil, "output_tokens": 5, "output_tokens_details": nil, "total_tokens": 15}
	item := map[string]any{"type": "message", "role": "assistant", "id": "msg_" + id,
		"content": []any{map[string]any{"type": "output_text", "text": "Noted."}}}
	if first {
		args, _ := json.Marshal(map[string]any{"cmd": m.cmd})
		item = map[string]any{"type": "function_call", "call_id": "call_" + id, "name": "exec_command", "arguments": string(args)}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []map[string]any{
		{"type": "response.created", "response": map[string]any{"id": id}},
		{"type": "response.output_item.done", "item": item},
		{"type": "response.completed", "response": map[string]any{"id": id, "usage": usage}},
	} {
		data, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], data)
	}
}

// mainThreadLocked is the thread of the user's session: the first one whose
// requests come from a user (not, say, the one Codex opens to title the session).
func (m *scriptedModel) mainThreadLocked() string {
	for _, r := range m.reqs {
		if r.source == "user" {
			return r.thread
		}
	}
	return ""
}

func (m *scriptedModel) mainThread() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mainThreadLocked()
}

func (m *scriptedModel) stateAtFirstRequest() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.busyFirst
}

func (m *scriptedModel) requests(thread string) []modelRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []modelRequest
	for _, r := range m.reqs {
		if r.thread == thread {
			out = append(out, r)
		}
	}
	return out
}

func (m *scriptedModel) lastRequest(thread string) modelRequest {
	reqs := m.requests(thread)
	return reqs[len(reqs)-1]
}

// registered is the ids of the tasks the shell call of turn 1 printed, once its
// output came back to the model.
func (m *scriptedModel) registered() []string {
	for _, r := range m.requests(m.mainThread()) {
		for _, out := range r.toolOutputs {
			var ids []string
			for _, part := range strings.Split(out, `{\"id\":\"`)[1:] {
				id, _, _ := strings.Cut(part, `\"`)
				ids = append(ids, id)
			}
			if len(ids) > 0 {
				return ids
			}
		}
	}
	return nil
}

// queuedTurnsWith counts the turns of thread that Codex opened from its queue with
// prompt as their new user message.
func (m *scriptedModel) queuedTurnsWith(thread, prompt string) int {
	turns := map[string]bool{}
	for _, r := range m.requests(thread) {
		if r.trigger == "queue" && len(r.userTexts) > 0 && r.userTexts[len(r.userTexts)-1] == prompt {
			turns[r.turn] = true
		}
	}
	return len(turns)
}

func waitShow(t *testing.T, home, id string) string {
	t.Helper()
	var shown struct {
		Spec struct{ Target string } `json:"spec"`
	}
	if err := json.Unmarshal([]byte(ok(t, home, "show", id, "--json")), &shown); err != nil {
		t.Fatal(err)
	}
	return shown.Spec.Target
}

func targetState(t *testing.T, home, target string) string {
	t.Helper()
	return targetStates([]byte(ok(t, home, "target", "list", "--json")))[target]
}

// targetStates reads 'bgtask target list --json': each target's busy or idle.
func targetStates(out []byte) map[string]string {
	var rows []struct {
		Name string `json:"name"`
		Busy bool   `json:"busy"`
	}
	_ = json.Unmarshal(out, &rows)
	states := map[string]string{}
	for _, r := range rows {
		states[r.Name] = events.TargetIdle
		if r.Busy {
			states[r.Name] = events.TargetBusy
		}
	}
	return states
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// killProgramsUnder kills the processes running a program from under dir: the
// copies of codex that Codex installs in its home for its daemon.
func killProgramsUnder(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		argv0, _, _ := strings.Cut(readOrEmpty(p), "\x00")
		if !strings.HasPrefix(argv0, dir+string(filepath.Separator)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func readOrEmpty(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// shq quotes s for a POSIX shell.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
