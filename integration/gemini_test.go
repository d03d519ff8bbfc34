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

// TestGeminiSessionIsWokenByItsTasks drives a real interactive Gemini CLI 0.61.0
// session under tmux against a scripted Gemini API on loopback, with the
// settings and hooks 'bgtask setup gemini' installed. The session's first turn
// runs 'bgtask add' four times with the shell tool (four calls in one answer of
// the model); each call is handed to a waiter in the background, and the turn
// ends. Then, with nobody typing:
//
//   - idle: task A ends, and the session gets one new turn holding its wake-up;
//   - the bgtask server is killed with SIGKILL and started again; task B ends:
//     one new turn;
//   - busy: the user's prompt makes the model run a shell command that blocks,
//     and task C ends meanwhile: the session gets C's wake-up once, in that turn
//     or right after it;
//   - closed: the user quits Gemini CLI, task D ends, and 'gemini --resume ID -p'
//     gets D's wake-up in its one turn.
//
// Each wake-up must reach the model in exactly one request as new content, and
// be in the conversation's last request exactly once; the session's target must
// have followed its turns, busy and idle.
func TestGeminiSessionIsWokenByItsTasks(t *testing.T) {
	geminiBin, tmuxBin := geminiTools(t)
	root := t.TempDir()
	home := filepath.Join(root, "bg")
	userHome := filepath.Join(root, "user")
	proj := filepath.Join(root, "proj")
	for _, d := range []string{home, filepath.Join(userHome, ".gemini"), proj} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	server := startServer(t, home)
	adds := map[string]string{}
	var calls []string
	for _, name := range []string{"a", "b", "c", "d", "busy"} {
		makeGate(t, proj, "gate-"+name)
		adds[name] = "bgtask add -- " + shq(gate("gate-"+name)+"echo "+name+"-done")
		if name != "busy" {
			calls = append(calls, adds[name])
		}
	}
	model := startGeminiModel(t, home, map[string][]string{
		"RUN:tasks": calls,
		"RUN:busy":  {gate("gate-busy") + "echo busy-done"},
	})

	// The user's own settings (a key, no prompts at start), which setup keeps.
	writeFile(t, filepath.Join(userHome, ".gemini", "settings.json"), `{"security": {"auth": {"selectedType": "gemini-api-key"}},
 "privacy": {"usageStatisticsEnabled": false}, "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false}}`)
	setup := runBin(t, 30*time.Second, append(childEnv(home), "HOME="+userHome), "--home", home, "setup", "gemini")
	if setup.code != 0 {
		t.Fatalf("bgtask setup gemini: exit %d: %s%s", setup.code, setup.stdout, setup.stderr)
	}

	node, _ := exec.LookPath("node")
	path := strings.Join([]string{filepath.Dir(bin), filepath.Dir(geminiBin), filepath.Dir(node), "/usr/local/bin", "/usr/bin", "/bin"}, ":")
	geminiEnv := []string{"HOME=" + userHome, "PATH=" + path, "LANG=C.UTF-8", "GEMINI_API_KEY=scripted",
		"GOOGLE_GEMINI_BASE_URL=http://" + model.addr, "GEMINI_CLI_TRUST_WORKSPACE=true"}
	sock := filepath.Join(root, "tmux.sock")
	tmux := func(args ...string) (string, error) {
		out, err := exec.Command(tmuxBin, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	session := "cd " + shq(proj) + " && env -i TERM=xterm-256color"
	for _, kv := range geminiEnv {
		session += " " + shq(kv)
	}
	session += " " + shq(geminiBin) + " -m gemini-2.5-flash --yolo -i 'RUN:tasks'"
	if out, err := tmux("new-session", "-d", "-x", "200", "-y", "50", session+"; sleep 600"); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			screen, _ := tmux("capture-pane", "-p")
			t.Logf("the Gemini CLI screen:\n%s", screen)
			for i, r := range model.mainRequests() {
				t.Logf("request %d: %q", i, r.lastUser())
			}
		}
		_, _ = tmux("kill-server")
		killWaiters(home)
	})

	// Turn 1: the four shell calls register a task each, and the turn ends.
	var ids map[string]string
	testkit.Eventually(t, 90*time.Second, "four tasks registered from the Gemini CLI session", func() bool {
		ids = geminiTasks(t, home)
		return len(ids) == 4
	})
	target := waitShow(t, home, ids["a"])
	for name, id := range ids {
		if got := waitShow(t, home, id); got != target || !strings.HasPrefix(target, "gemini-") {
			t.Fatalf("task %s: target %q, want the session's, gemini-ID", name, got)
		}
	}
	sessionID := strings.TrimPrefix(target, "gemini-")
	if st := model.stateAtFirstRequest(target); st != events.TargetBusy {
		t.Errorf("target %s was %q while turn 1 ran, want busy (BeforeAgent)", target, st)
	}
	testkit.Eventually(t, 30*time.Second, "four waiters, and "+target+" idle after turn 1 (AfterAgent)", func() bool {
		return waiters(home) == 4 && targetState(t, home, target) == events.TargetIdle
	})

	prompts := map[string]string{}
	wake := func(name, what string) {
		t.Helper()
		openGate(t, proj, "gate-"+name)
		prompts[name] = waitFor(t, home, ids[name]).Prompt
		testkit.Eventually(t, 60*time.Second, what, func() bool { return model.received(prompts[name]) > 0 })
	}

	// Idle: A's wake-up opens a turn of its own.
	wake("a", "the session's turn for task A's wake-up")
	if r := model.receiving(prompts["a"]); r.lastResponses != 0 {
		t.Errorf("task A's wake-up came with a tool's result, not as a turn of its own")
	}
	testkit.Eventually(t, 30*time.Second, target+" idle after A's turn", func() bool {
		return targetState(t, home, target) == events.TargetIdle
	})

	// The server dies with SIGKILL while the commands run, and comes back; the
	// waiters wait through it.
	server.stop(syscall.SIGKILL)
	startServer(t, home)
	wake("b", "the session's turn for task B's wake-up")
	testkit.Eventually(t, 30*time.Second, target+" idle after B's turn", func() bool {
		return targetState(t, home, target) == events.TargetIdle
	})

	// Busy: the user's prompt runs a command that blocks; C ends meanwhile.
	typePrompt(t, tmux, "RUN:busy")
	testkit.Eventually(t, 60*time.Second, "the busy turn's shell call running", func() bool {
		return model.received("RUN:busy") == 1 && model.calls() == len(calls)+1
	})
	if st := targetState(t, home, target); st != events.TargetBusy {
		t.Errorf("target %s is %q during the busy turn, want busy", target, st)
	}
	before := waiters(home)
	openGate(t, proj, "gate-c")
	prompts["c"] = waitFor(t, home, ids["c"]).Prompt
	testkit.Eventually(t, 30*time.Second, "C's waiter ending, its wake-up printed", func() bool { return waiters(home) == before-1 })
	if n := model.received(prompts["c"]); n != 0 {
		t.Errorf("task C's wake-up reached the model while its turn's shell call still ran (%d)", n)
	}
	openGate(t, proj, "gate-busy")
	testkit.Eventually(t, 60*time.Second, "task C's wake-up in or right after the busy turn", func() bool {
		return model.received(prompts["c"]) > 0
	})
	testkit.Eventually(t, 30*time.Second, target+" idle after the busy turn", func() bool {
		return targetState(t, home, target) == events.TargetIdle
	})

	// Closed: the user quits; D's waiter ends with the session, and D ends.
	typePrompt(t, tmux, "/quit")
	testkit.Eventually(t, 30*time.Second, "the waiters gone with the session", func() bool { return waiters(home) == 0 })
	openGate(t, proj, "gate-d")
	prompts["d"] = waitFor(t, home, ids["d"]).Prompt
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	resume := exec.CommandContext(ctx, geminiBin, "-m", "gemini-2.5-flash", "--yolo", "--resume", sessionID, "-p", "go on")
	resume.Dir, resume.Env = proj, geminiEnv
	if out, err := resume.CombinedOutput(); err != nil {
		t.Fatalf("gemini --resume %s -p: %v\n%s", sessionID, err, out)
	}

	for _, name := range []string{"a", "b", "c", "d"} {
		n := model.received(prompts[name])
		if n != 1 {
			t.Errorf("task %s: its wake-up reached the model as new content in %d requests, want 1", name, n)
		}
		t.Logf("task %s: its wake-up reached the model in %d request(s), with %d tool result(s)", name, n, model.receiving(prompts[name]).lastResponses)
	}
	last := model.mainRequests()
	history := last[len(last)-1].all()
	for name, prompt := range prompts {
		if n := strings.Count(history, normalSpace(prompt)); n != 1 {
			t.Errorf("task %s: its wake-up is %d times in the conversation's last request, want once", name, n)
		}
	}
	if !strings.Contains(last[len(last)-1].lastUser(), "go on") {
		t.Errorf("the last request is not the resumed session's turn: %q", last[len(last)-1].lastUser())
	}
	if left := ok(t, home, "inbox", "--target", target, "--json"); strings.TrimSpace(left) != "" {
		t.Errorf("wake-ups left in the inbox of %s: %s", target, left)
	}
}

// geminiTools finds the gemini CLI and tmux on PATH: missing, the test skips, and
// in CI (which installs them) it fails.
func geminiTools(t *testing.T) (geminiBin, tmuxBin string) {
	t.Helper()
	var missing []string
	geminiBin, err := exec.LookPath("gemini")
	if err != nil {
		missing = append(missing, "gemini (npm install @google/gemini-cli@0.61.0)")
	} else if out, err := exec.Command(geminiBin, "--version").Output(); err != nil || strings.TrimSpace(string(out)) != "0.61.0" {
		missing = append(missing, fmt.Sprintf("gemini 0.61.0 (found %q)", strings.TrimSpace(string(out))))
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
	return geminiBin, tmuxBin
}

// typePrompt types text into the TUI, once no turn runs there, and submits it.
// Keys sent with Enter in one go are taken for a paste, whose Enter is a
// newline: Enter goes on its own, once the screen shows the text, and not
// within fastReturn of it.
// fastReturn is more than the time within which the TUI takes an Enter read
// after a typed key for a newline, not a submission (the Gemini CLI's
// FAST_RETURN_TIMEOUT, 30 ms): the screen shows the text as soon as the TUI has
// read it, and an Enter sent then may be read within that time.
const fastReturn = 200 * time.Millisecond

func typePrompt(t *testing.T, tmux func(...string) (string, error), text string) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "no turn running in the TUI", func() bool {
		screen, _ := tmux("capture-pane", "-p")
		return !strings.Contains(screen, "esc to cancel")
	})
	if out, err := tmux("send-keys", "-l", text); err != nil {
		t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
	testkit.Eventually(t, 20*time.Second, "the TUI showing "+text, func() bool {
		screen, _ := tmux("capture-pane", "-p")
		return strings.Contains(screen, "* "+text) || strings.Contains(screen, "> "+text)
	})
	time.Sleep(fastReturn)
	if out, err := tmux("send-keys", "Enter"); err != nil {
		t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
}

// geminiTasks maps the tasks registered from the session, by the name their
// command echoes (a-done: a).
func geminiTasks(t *testing.T, home string) map[string]string {
	var list struct {
		Tasks []struct {
			ID   string `json:"id"`
			Spec struct {
				Command string `json:"command"`
				Target  string `json:"target"`
			} `json:"spec"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(ok(t, home, "list", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, task := range list.Tasks {
		if _, rest, ok := strings.Cut(task.Spec.Command, "echo "); ok && strings.HasSuffix(rest, "-done") {
			ids[strings.TrimSuffix(rest, "-done")] = task.ID
		}
	}
	return ids
}

// waiters counts the waiters on home that run ('bgtask hook gemini attach').
func waiters(home string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		argv := strings.Split(readOrEmpty(p), "\x00")
		if len(argv) > 6 && argv[0] == bin && argv[2] == home && argv[3] == "hook" && argv[4] == "gemini" && argv[5] == "attach" {
			n++
		}
	}
	return n
}

// killWaiters kills the waiters on home that are left.
func killWaiters(home string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		argv := strings.Split(readOrEmpty(p), "\x00")
		if len(argv) > 5 && argv[0] == bin && argv[2] == home && argv[5] == "attach" {
			var pid int
			if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// geminiModel is the Gemini API (generateContent, streamed or not) as Gemini CLI
// 0.61.0 calls it with an API key and GOOGLE_GEMINI_BASE_URL. A request of the
// session's loop (one that offers tools) whose new user content holds one of
// script's triggers gets the shell calls the script names for it, once; every
// other request gets a short text. Every request is recorded.
type geminiModel struct {
	addr   string
	home   string
	script map[string][]string

	mu       sync.Mutex
	reqs     []geminiRequest
	answered map[string]bool
	nCalls   int
	first    map[string]string // the targets' states as the first request of the loop came
}

type geminiRequest struct {
	main     bool
	contents []geminiContent
}

type geminiContent struct {
	Role  string `json:"role"`
	Parts []struct {
		Text             string          `json:"text"`
		FunctionCall     json.RawMessage `json:"functionCall"`
		FunctionResponse json.RawMessage `json:"functionResponse"`
	} `json:"parts"`
}

func (c geminiContent) text() string {
	var texts []string
	for _, p := range c.Parts {
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n")
}

// lastUser is the text of the request's last content: what is new in it.
func (r geminiRequest) lastUser() string {
	if len(r.contents) == 0 {
		return ""
	}
	return r.contents[len(r.contents)-1].text()
}

// all is the text of the whole conversation, its spaces as Gemini CLI leaves them
// in what it injects.
func (r geminiRequest) all() string {
	var texts []string
	for _, c := range r.contents {
		texts = append(texts, normalSpace(c.text()))
	}
	return strings.Join(texts, "\n")
}

// normalSpace is s as the model may be given it: each run of white space one
// space, as Gemini CLI gives it the output of a background command, and < and >
// unescaped, as it escapes them in what a hook adds to a turn.
func normalSpace(s string) string {
	s = strings.NewReplacer("&lt;", "<", "&gt;", ">").Replace(s)
	return strings.Join(strings.Fields(s), " ")
}

func startGeminiModel(t *testing.T, home string, script map[string][]string) *geminiModel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &geminiModel{addr: ln.Addr().String(), home: home, script: script, answered: map[string]bool{}}
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

func (m *geminiModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	_, method, _ := strings.Cut(r.URL.Path, ":")
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1beta/models/") || (method != "generateContent" && method != "streamGenerateContent") {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Contents []geminiContent  `json:"contents"`
		Tools    []map[string]any `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rec := geminiRequest{main: len(req.Tools) > 0, contents: req.Contents}
	parts := []map[string]any{}
	m.mu.Lock()
	m.reqs = append(m.reqs, rec)
	n := len(m.reqs)
	if rec.main && len(rec.contents) > 0 && rec.contents[len(rec.contents)-1].Role == "user" {
		last := rec.contents[len(rec.contents)-1].text()
		for trigger, cmds := range m.script {
			// A prompt typed while a turn ends comes as a steering hint, wrapped.
			if !strings.Contains(last, trigger) || m.answered[trigger] {
				continue
			}
			m.answered[trigger] = true
			for _, cmd := range cmds {
				m.nCalls++
				parts = append(parts, map[string]any{"functionCall": map[string]any{"name": "run_shell_command", "args": map[string]any{"command": cmd}}})
			}
		}
	}
	first := rec.main && m.first == nil
	if first {
		m.first = map[string]string{}
	}
	m.mu.Unlock()
	if first {
		// The BeforeAgent hook ran before this request was made.
		out, err := exec.Command(bin, "--home", m.home, "target", "list", "--json").Output()
		if err == nil {
			m.mu.Lock()
			m.first = targetStates(out)
			m.mu.Unlock()
		}
	}
	if len(parts) == 0 {
		parts = append(parts, map[string]any{"text": fmt.Sprintf("Noted (%d).", n)})
	}
	resp, _ := json.Marshal(map[string]any{
		"candidates":    []any{map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]int{"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
	})
	if method == "generateContent" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(resp)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: %s\r\n\r\n", resp)
}

func (m *geminiModel) mainRequests() []geminiRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []geminiRequest
	for _, r := range m.reqs {
		if r.main {
			out = append(out, r)
		}
	}
	return out
}

// calls is how many shell calls the model asked for.
func (m *geminiModel) calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nCalls
}

// received counts the requests of the session's loop that bring text as new
// content: the turns that text reached the model in.
func (m *geminiModel) received(text string) int {
	n := 0
	for _, r := range m.mainRequests() {
		if strings.Contains(normalSpace(r.lastUser()), normalSpace(text)) {
			n++
		}
	}
	return n
}

// receiving is the first request that brought text, with how many tool results
// came with it.
func (m *geminiModel) receiving(text string) (r struct{ lastResponses int }) {
	for _, req := range m.mainRequests() {
		if strings.Contains(normalSpace(req.lastUser()), normalSpace(text)) {
			for _, p := range req.contents[len(req.contents)-1].Parts {
				if len(p.FunctionResponse) > 0 {
					r.lastResponses++
				}
			}
			return r
		}
	}
	return r
}

// stateAtFirstRequest is the target's state as the session's first request came.
func (m *geminiModel) stateAtFirstRequest(target string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.first[target]
}

// TestGeminiWaiterWhoseReaderIsGoneGivesTheWakeUpBack runs a waiter as Gemini CLI
// does, its output a pipe, and closes the pipe's reading end as a Gemini CLI that
// ended would: the waiter's print fails, it gives the wake-up back to the inbox,
// and the session's next turn (BeforeAgent) gets it. A waiter killed by SIGPIPE
// in the middle of its hand-over would have left it "handing", for the next
// hand-off to acknowledge without showing it.
func TestGeminiWaiterWhoseReaderIsGoneGivesTheWakeUpBack(t *testing.T) {
	home := t.TempDir()
	startServer(t, home)
	const session = "6b1ffa89-8a2d-453b-9f68-b0d7306e393b"
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // nobody reads the waiter's output
	waiter := exec.Command(bin, "--home", home, "hook", "gemini", "attach", session, "--", "true")
	waiter.Env, waiter.Stdout, waiter.Stderr = childEnv(home), w, w
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	ended := make(chan error, 1)
	go func() { ended <- waiter.Wait() }()
	id := add(t, home, "--target", "gemini-"+session, "--", "echo gone-reader")
	prompt := waitFor(t, home, id).Prompt
	select {
	case err := <-ended:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("the waiter ended with %v, want exit status 1 (its print failed)", err)
		}
	case <-time.After(60 * time.Second):
		_ = waiter.Process.Kill()
		t.Fatal("the waiter did not end")
	}
	hook := exec.Command(bin, "--home", home, "hook", "gemini", "BeforeAgent")
	hook.Env, hook.Stdin = childEnv(home), strings.NewReader(`{"session_id": "`+session+`", "prompt": "go on"}`)
	out, err := hook.Output()
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Specific struct {
			Additional string `json:"additionalContext"`
		} `json:"hookSpecificOutput"`
	}
	if err := json.Unmarshal(out, &answer); err != nil || !strings.Contains(answer.Specific.Additional, strings.TrimSpace(prompt)) {
		t.Errorf("the next turn got %s (%v), want the wake-up %q", out, err, prompt)
	}
}
