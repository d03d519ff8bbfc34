package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/events"
	osproc "github.com/bgtask/bgtask/internal/proc"
	"github.com/bgtask/bgtask/internal/testkit"
)

// needClaudeTool finds a program the agent tests drive, or skips the test saying why;
// in CI, where .ci/run installs them, it fails instead.
func needClaudeTool(t *testing.T, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not on PATH (.ci/run installs it: %s)", name, install)
		}
		t.Skipf("%s is not on PATH: %s", name, install)
	}
	return path
}

const claudeInstall = "npm install @anthropic-ai/claude-code@2.1.328, then put its node_modules/.bin on PATH"

// claudeSession is a real interactive Claude Code session under tmux, set up by
// `bgtask setup claude-code`, talking to a scripted model.
type claudeSession struct {
	t      *testing.T
	home   string // bgtask's
	dir    string // the project the session runs in
	model  *claudeModel
	tmux   []string
	launch []string // the command line of claude
	server *proc
}

// open starts claude, with more arguments, in the tmux session and returns once
// it shows its prompt.
func (s *claudeSession) open(args ...string) {
	s.t.Helper()
	s.run("new-session", "-d", "-s", "s", "-x", "200", "-y", "50", "-c", s.dir, strings.Join(append(s.launch, args...), " "))
	testkit.Eventually(s.t, 60*time.Second, "claude showing its prompt", func() bool {
		return strings.Contains(s.screen(), "for shortcuts")
	})
}

// close ends the session as its user would, with /exit, and waits for claude to be
// gone (its tmux session ends with it).
func (s *claudeSession) close() {
	s.t.Helper()
	s.run("send-keys", "-t", "s", "-l", "/exit")
	s.run("send-keys", "-t", "s", "Enter")
	testkit.Eventually(s.t, 30*time.Second, "claude exited", func() bool {
		cmd := exec.Command(s.tmux[0], append(s.tmux[1:], "has-session", "-t", "s")...)
		cmd.Env = withoutClaudeTMUX(os.Environ())
		return cmd.Run() != nil
	})
}

const claudeTrigger = "GO-TURN-1: start the background work"

// startClaudeSession starts the bgtask server, installs the hooks in a fresh user
// home, and starts `claude` in tmux; it returns once the session is idle at its
// prompt. Turn 1 (sent by send) gets a Bash call of bashCommand.
func startClaudeSession(t *testing.T, bashCommand string) *claudeSession {
	t.Helper()
	claude := needClaudeTool(t, "claude", claudeInstall)
	tmux := needClaudeTool(t, "tmux", "apt-get install tmux")
	s := &claudeSession{t: t, home: t.TempDir(), dir: t.TempDir()}
	s.server = startServer(t, s.home)
	s.model = newClaudeModel(t, claudeTrigger, bashCommand)

	user := t.TempDir()
	// First-run prompts: onboarding, the API key, the project's trust dialog.
	writeClaudeJSON(t, filepath.Join(user, ".claude.json"), map[string]any{
		"hasCompletedOnboarding": true,
		"customApiKeyResponses":  map[string]any{"approved": []string{"anything"}, "rejected": []string{}},
		"projects":               map[string]any{s.dir: map[string]any{"hasTrustDialogAccepted": true}},
	})
	// The user's own setting, which setup must keep: Bash runs without asking.
	writeClaudeJSON(t, filepath.Join(user, ".claude", "settings.json"), map[string]any{"permissions": map[string]any{"allow": []string{"Bash"}}})
	env := append(childEnv(s.home), "HOME="+user)
	if r := runBin(t, 30*time.Second, env, "--home", s.home, "setup", "claude-code"); r.code != 0 {
		t.Fatalf("setup claude-code: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	sock := fmt.Sprintf("bgtask-claude-%d-%d", os.Getpid(), time.Now().UnixNano())
	s.tmux = []string{tmux, "-L", sock}
	s.launch = []string{"env",
		"HOME=" + user, "BGTASK_HOME=" + s.home, "PATH=" + filepath.Dir(claude) + ":/usr/local/bin:/usr/bin:/bin",
		"ANTHROPIC_BASE_URL=" + s.model.srv.URL, "ANTHROPIC_API_KEY=anything", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		// The hooks' bgtask, built with -race when the tests are, fails on a race.
		"GORACE='atexit_sleep_ms=0 halt_on_error=1'",
		claude, "--permission-mode", "default"}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the session's screen:\n%s\nrequests other than /v1/messages: %q", s.screen(), s.model.otherRequests())
		}
		pids, _ := exec.Command(s.tmux[0], append(s.tmux[1:], "list-panes", "-a", "-F", "#{pane_pid}")...).Output()
		_ = exec.Command(s.tmux[0], append(s.tmux[1:], "kill-server")...).Run()
		// Claude Code writes its session files into HOME as it exits, after tmux is
		// gone: the temporary HOME is removed only once it has (killed, if it
		// lingers past 3s).
		for _, f := range strings.Fields(string(pids)) {
			if pid, _ := strconv.Atoi(f); pid > 0 && !ended(pid, 3*time.Second) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				ended(pid, 2*time.Second)
			}
		}
	})
	s.open()
	return s
}

func writeClaudeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, _ := json.Marshal(v)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (s *claudeSession) run(args ...string) string {
	s.t.Helper()
	cmd := exec.Command(s.tmux[0], append(s.tmux[1:], args...)...)
	cmd.Env = withoutClaudeTMUX(os.Environ())
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func withoutClaudeTMUX(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TMUX=") && !strings.HasPrefix(kv, "TMUX_PANE=") {
			out = append(out, kv)
		}
	}
	return out
}

func (s *claudeSession) screen() string {
	out, _ := exec.Command(s.tmux[0], append(s.tmux[1:], "capture-pane", "-p", "-t", "s")...).Output()
	return string(out)
}

var taskIDPattern = regexp.MustCompile(`\\?"id\\?":\s*\\?"([0-9a-f]{8}-[0-9a-f-]{27})`)

// turnOne types the trigger, waits for the model's Bash call to have registered
// its tasks and for the turn to end (the session's target idle again), and returns
// the tasks' ids and the target.
func (s *claudeSession) turnOne(tasks int) (ids []string, target string) {
	s.t.Helper()
	s.run("send-keys", "-t", "s", "-l", claudeTrigger)
	s.run("send-keys", "-t", "s", "Enter")
	testkit.Eventually(s.t, 60*time.Second, "the Bash call's result at the model", func() bool {
		for _, r := range s.model.mainRequests() {
			if strings.Contains(r.body, `"tool_result"`) {
				ids = nil
				for _, m := range taskIDPattern.FindAllStringSubmatch(r.body, -1) {
					if !slices.Contains(ids, m[1]) {
						ids = append(ids, m[1])
					}
				}
				return true
			}
		}
		return false
	})
	if len(ids) != tasks {
		s.t.Fatalf("the Bash call registered %d tasks (%q), want %d", len(ids), ids, tasks)
	}
	var shown struct {
		Spec struct {
			Target string          `json:"target"`
			Origin json.RawMessage `json:"origin"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(ok(s.t, s.home, "show", ids[0], "--json")), &shown); err != nil {
		s.t.Fatal(err)
	}
	target = shown.Spec.Target
	if !strings.HasPrefix(target, "claude-") || !strings.Contains(string(shown.Spec.Origin), `"claude-code"`) {
		s.t.Fatalf("the task's target %q, origin %s: not the session's", target, shown.Spec.Origin)
	}
	testkit.Eventually(s.t, 60*time.Second, "the session's turn ended (its target idle)", func() bool {
		return s.targetState(target) == events.TargetIdle && len(s.model.mainRequests()) >= 2
	})
	return ids, target
}

func (s *claudeSession) targetState(target string) string {
	r := run(s.t, s.home, "target", "list", "--json", "--timeout", "5s")
	var rows []struct {
		Name string `json:"name"`
		Busy bool   `json:"busy"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rows) != nil {
		return ""
	}
	for _, row := range rows {
		if row.Name == target {
			if row.Busy {
				return events.TargetBusy
			}
			return events.TargetIdle
		}
	}
	return ""
}

// wakeMark is in each wake-up's prompt, with the task's id.
const wakeMark = "WAKE-MARK"

func wakePrompt(id string) string { return wakeMark + " " + id + " exit 0" }

// awaitWakeUps waits for the session to send the model, unprompted, a request that
// holds the prompt of each task, and checks that each is there exactly once then and
// once the inbox is read.
func (s *claudeSession) awaitWakeUps(target string, ids []string) {
	s.t.Helper()
	s.awaitWakeUpsSince(len(s.model.mainRequests()), target, ids)
}

// awaitWakeUpsSince is awaitWakeUps for requests from the before'th on.
func (s *claudeSession) awaitWakeUpsSince(before int, target string, ids []string) {
	s.t.Helper()
	seen := map[string]bool{}
	testkit.Eventually(s.t, 90*time.Second, "the session woken with every prompt", func() bool {
		for i, r := range s.model.mainRequests()[before:] {
			for _, id := range ids {
				if !seen[id] && strings.Contains(r.body, wakePrompt(id)) {
					s.t.Logf("the wake-up of %s is in request %d of the session", id, before+i+1)
					if n := strings.Count(r.body, wakePrompt(id)); n != 1 {
						s.t.Fatalf("the request that woke the session holds the prompt of %s %d times", id, n)
					}
					seen[id] = true
				}
			}
		}
		return len(seen) == len(ids)
	})
	// Acknowledged, all of it, and the session idle again: nothing more to come.
	_, js := connect(s.t, s.home)
	testkit.Eventually(s.t, 60*time.Second, "every wake-up acknowledged and the session idle", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && s.targetState(target) == events.TargetIdle
	})
	reqs := s.model.mainRequests()
	last := reqs[len(reqs)-1]
	for _, id := range ids {
		if n := strings.Count(last.body, wakePrompt(id)); n != 1 {
			s.t.Errorf("the session's last request holds the prompt of %s %d times, want once", id, n)
		}
	}
	if n := last.typedByUser(claudeTrigger); n != 1 {
		s.t.Errorf("the session's last request holds %d typed prompts, want the one of turn 1", n)
	}
	s.t.Logf("%d requests to the model; others: %q", len(reqs), s.model.otherRequests())
}

// A task that ends while the turn that registered it still runs reaches the
// session once, in that turn or the next.
func TestClaudeCodeSessionGetsAWakeUpThatFiresDuringTheTurn(t *testing.T) {
	s := startClaudeSession(t, bin+` add --json --prompt '`+wakeMark+` {{task_id}} exit {{exit_code}}' -- true && `+bin+` wait --timeout 30s "$(`+bin+` list --json | grep -o '"id": *"[^"]*"' | head -1 | cut -d'"' -f4)" >/dev/null`)
	ids, target := s.turnOne(1)
	s.awaitWakeUpsSince(0, target, ids)
}

// bashAdds is the Bash command of turn 1: n tasks, each waiting on its gate (goI),
// each with a prompt that names it.
func bashAdds(n int) string {
	var adds []string
	for i := range n {
		adds = append(adds, bin+` add --json --prompt '`+wakeMark+` {{task_id}} exit {{exit_code}}' -- '`+gate(fmt.Sprintf("go%d", i))+`echo finished'`)
	}
	return strings.Join(adds, " && ")
}

func makeGates(t *testing.T, dir string, n int) {
	for i := range n {
		makeGate(t, dir, fmt.Sprintf("go%d", i))
	}
}

func openGates(t *testing.T, dir string, n int) {
	for i := range n {
		openGate(t, dir, fmt.Sprintf("go%d", i))
	}
}

// An idle Claude Code session is woken, with no user input, by the task its Bash
// tool registered: one new turn holding the wake-up's prompt once.
func TestClaudeCodeSessionIsWokenByItsTask(t *testing.T) {
	s := startClaudeSession(t, bashAdds(1))
	makeGates(t, s.dir, 1)
	ids, target := s.turnOne(1)
	openGates(t, s.dir, 1)
	s.awaitWakeUps(target, ids)
}

// The wake-up reaches the session although the bgtask server was killed with
// SIGKILL and started again while the command ran: the waiting hook waits through it.
func TestClaudeCodeSessionIsWokenAcrossAServerKill(t *testing.T) {
	s := startClaudeSession(t, bashAdds(1))
	makeGates(t, s.dir, 1)
	ids, target := s.turnOne(1)
	s.server.stop(syscall.SIGKILL)
	s.server = startServer(t, s.home)
	openGates(t, s.dir, 1)
	s.awaitWakeUps(target, ids)
}

// Two tasks that fire together both reach the session, each once.
func TestClaudeCodeSessionGetsTwoWakeUpsThatFireTogether(t *testing.T) {
	s := startClaudeSession(t, bashAdds(2))
	makeGates(t, s.dir, 2)
	ids, target := s.turnOne(2)
	openGates(t, s.dir, 2)
	s.awaitWakeUps(target, ids)
}

// A session that was closed when its task fired gets the wake-up when it is
// resumed: the session id stays, and the waiter started at SessionStart hands it over.
func TestClaudeCodeSessionClosedGetsItsWakeUpAtResume(t *testing.T) {
	s := startClaudeSession(t, bashAdds(1))
	makeGates(t, s.dir, 1)
	ids, target := s.turnOne(1)
	s.close()
	openGates(t, s.dir, 1)
	waitFor(t, s.home, ids[0])
	_, js := connect(t, s.home)
	testkit.Eventually(t, 30*time.Second, "the wake-up waiting in the inbox", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending+uint64(info.NumAckPending) == 1
	})
	s.open("--resume", strings.TrimPrefix(target, "claude-"))
	s.awaitWakeUps(target, ids)
}

// ended waits up to within for process pid, which this one did not start, to
// end, and reports whether it did.
func ended(pid int, within time.Duration) bool {
	id, err := osproc.Of(pid)
	if err != nil {
		return true // gone already
	}
	w, err := osproc.Start(id)
	if err != nil {
		return errors.Is(err, osproc.ErrGone)
	}
	defer w.Stop()
	select {
	case <-w.Ended:
		return true
	case <-time.After(within):
		return false
	}
}
