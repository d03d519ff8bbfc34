package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// openclawInstall says how .ci/run installs what the OpenClaw test drives.
const openclawInstall = "npm install node@24 (into a prefix of its own) and, with that node first on PATH, openclaw@2026.9.6; " +
	"put openclaw's node_modules/.bin on PATH and set BGTASK_TEST_NODE to the node binary"

// openclawOutageEnv sets how long the gateway stays down around a task's exit
// (a Go duration; the scenario is 3m). The default keeps the test short;
// the server's --retry-base is small so that the first attempt after the
// gateway is back comes soon.
const openclawOutageEnv = "BGTASK_OPENCLAW_OUTAGE"

// TestOpenClawSessionIsWokenByItsTasks drives a real OpenClaw gateway, set up by
// `bgtask setup openclaw`, whose agent runs on a scripted model: the agent
// registers a task with `bgtask add` from its exec tool, and the test counts the
// turns that carry the task's wake-up into that session. One turn per task: when
// the session is idle at the exit; when the task ends while the turn that
// registered it still runs (the wake-up waits for its end, and that turn ends
// well); when the bgtask server is killed with SIGKILL while the command runs;
// when it is killed between the gateway's answer and its record of it (the
// re-post with the same Idempotency-Key is replayed by the gateway, not run
// again); and when the gateway is down around the exit.
func TestOpenClawSessionIsWokenByItsTasks(t *testing.T) {
	oc := startOpenClaw(t)
	// The scenarios share the gateway and the server, one after another.
	for _, s := range []struct {
		name, mark string
		run        func(mark string)
	}{
		{"the session idle at the exit", "MARK-IDLE", oc.idle},
		{"the exit during the turn that registered the task", "MARK-BUSY", oc.busy},
		{"the server killed (SIGKILL) while the command runs", "MARK-KILL", oc.serverKilled},
		{"the server killed between the gateway's answer and its record", "MARK-REPOST", oc.serverKilledAfterThePush},
		{"the gateway down around the exit", "MARK-DOWN", oc.gatewayDown},
	} {
		t.Logf("scenario: %s", s.name)
		s.run(s.mark)
	}
	// Each wake-up ran one turn: those of the first scenarios had the later ones'
	// minutes to show a second.
	for _, mark := range []string{"MARK-IDLE", "MARK-BUSY", "MARK-KILL", "MARK-REPOST", "MARK-DOWN"} {
		n := len(oc.model.wakeTurns(mark))
		t.Logf("%s: %d turns", mark, n)
		if n != 1 {
			t.Errorf("%s: %d turns, want 1", mark, n)
		}
	}
	auditClean(t, oc.home)
}

func (oc *openclawGateway) idle(mark string) {
	oc.turn("RUN:bgtask add -- echo " + mark)
	oc.awaitWakeTurn(mark)
	oc.awaitDelivered(oc.task(mark))
}

// busy: the task ends at once, and the exec goes on for 6 s (less than the 10 s
// after which OpenClaw backgrounds it), so the turn runs when the wake-up is
// ready. That turn must end well, and the wake-up's come after it.
func (oc *openclawGateway) busy(mark string) {
	out := oc.turn("RUN:bgtask add -- echo " + mark + "; sleep 6")
	if strings.Contains(out, "failed") {
		oc.t.Fatalf("the turn that registered the task failed: %s", out)
	}
	turnEnded := oc.model.lastRequest()
	if wake := oc.awaitWakeTurn(mark); !wake.at.After(turnEnded) {
		oc.t.Fatalf("the wake-up's turn (%s) did not wait for the end of the turn that ran (%s)", wake.at, turnEnded)
	}
	oc.awaitDelivered(oc.task(mark))
}

func (oc *openclawGateway) serverKilled(mark string) {
	makeGate(oc.t, oc.workspace, "kill")
	oc.turn("RUN:bgtask add -- sh -c '" + gate("kill") + "echo " + mark + "'")
	id := oc.task(mark)
	oc.server.stop(syscall.SIGKILL)
	oc.server = oc.startBgtask()
	openGate(oc.t, oc.workspace, "kill")
	waitFor(oc.t, oc.home, id)
	oc.awaitWakeTurn(mark)
	// The gateway answers once the turn has run: the next scenario restarts the
	// server, which must not find this push in flight.
	oc.awaitDelivered(id)
}

// serverKilledAfterThePush: the server dies right after the gateway's 200 (a
// crash point); the one started after it posts again, with the same
// Idempotency-Key.
func (oc *openclawGateway) serverKilledAfterThePush(mark string) {
	oc.server.stop(syscall.SIGTERM)
	crashing := startServerEnv(oc.t, oc.home, []string{"BGTASK_CRASH_AT=pusher-after-push"}, oc.serverArgs...)
	oc.server = crashing
	oc.turn("RUN:bgtask add -- echo " + mark)
	select {
	case <-crashing.done:
	case <-time.After(5 * time.Minute):
		oc.t.Fatal("the server did not die after its push")
	}
	oc.server = oc.startBgtask()
	id := oc.task(mark)
	oc.awaitDelivered(id)
	if n := countTypes(history(oc.t, oc.home, id))["delivery-attempt"]; n != 2 {
		oc.t.Fatalf("%d attempts; want the one the crash cut and its repeat", n)
	}
	oc.awaitWakeTurn(mark)
}

// gatewayDown: the gateway is stopped before the command exits, and started
// again once the outage ($BGTASK_OPENCLAW_OUTAGE, 15 s by default) has passed
// since the exit.
func (oc *openclawGateway) gatewayDown(mark string) {
	outage := 15 * time.Second
	if v := os.Getenv(openclawOutageEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			oc.t.Fatalf("%s=%q: %v", openclawOutageEnv, v, err)
		}
		outage = d
	}
	makeGate(oc.t, oc.workspace, "down")
	oc.turn("RUN:bgtask add -- sh -c '" + gate("down") + "echo " + mark + "'")
	id := oc.task(mark)
	oc.stopGateway()
	openGate(oc.t, oc.workspace, "down")
	waitFor(oc.t, oc.home, id)
	testkit.Eventually(oc.t, outage+time.Minute, "an attempt refused by the gateway that is down", func() bool {
		return strings.Contains(ok(oc.t, oc.home, "show", id), "connection refused")
	})
	time.Sleep(outage) // the outage is the scenario's length, not a wait for an event
	oc.startGateway()
	oc.awaitDelivered(id)
	oc.t.Logf("the push across the outage: %s", pushLine(ok(oc.t, oc.home, "show", id)))
	oc.awaitWakeTurn(mark)
}

// openclawGateway is a real OpenClaw gateway on loopback, with a scripted model,
// set up by `bgtask setup openclaw` for a bgtask server of its own.
type openclawGateway struct {
	t          *testing.T
	model      *openclawModel
	home       string // bgtask's
	server     *proc
	serverArgs []string
	user       string // the gateway's HOME, with its state in .openclaw
	workspace  string // the agent's, where its exec commands run
	env        []string
	openclaw   string
	port       int
	gateway    *exec.Cmd
	exited     chan struct{}
	log        *syncBuffer
}

// openclawTools finds the openclaw CLI and a Node.js it runs on (24.16 or later):
// $BGTASK_TEST_NODE, else node on PATH.
func openclawTools(t *testing.T) (openclaw, node string) {
	t.Helper()
	openclaw = needClaudeTool(t, "openclaw", openclawInstall)
	node = os.Getenv("BGTASK_TEST_NODE")
	if node == "" {
		node = needClaudeTool(t, "node", openclawInstall)
	}
	out, err := exec.Command(node, "--version").Output()
	var major, minor int
	if _, scan := fmt.Sscanf(string(out), "v%d.%d", &major, &minor); err != nil || scan != nil || major < 24 || major == 24 && minor < 16 || major == 25 {
		msg := fmt.Sprintf("OpenClaw needs Node 24.16 or later; %s is %q (%v): %s", node, strings.TrimSpace(string(out)), err, openclawInstall)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return openclaw, node
}

func startOpenClaw(t *testing.T) *openclawGateway {
	t.Helper()
	openclaw, node := openclawTools(t)
	oc := &openclawGateway{t: t, model: newOpenClawModel(t), home: t.TempDir(), user: t.TempDir(), workspace: t.TempDir(), openclaw: openclaw}
	oc.serverArgs = []string{"--retry-base", "250ms"}
	oc.server = oc.startBgtask()
	oc.port = testkit.FreePort(t)
	state := filepath.Join(oc.user, ".openclaw")
	writeClaudeJSON(t, filepath.Join(state, "openclaw.json"), map[string]any{
		"gateway": map[string]any{"mode": "local", "port": oc.port, "bind": "loopback", "auth": map[string]any{"mode": "token", "token": "gateway-token-0123456789"}},
		"hooks":   map[string]any{"enabled": true, "token": "hook-token-0123456789", "path": "/hooks"},
		"models": map[string]any{"mode": "merge", "providers": map[string]any{"scripted": map[string]any{
			"baseUrl": oc.model.srv.URL, "apiKey": "anything", "api": "anthropic-messages", "models": []any{map[string]any{"id": "m1", "name": "M1"}}}}},
		"agents": map[string]any{"defaults": map[string]any{"model": map[string]any{"primary": "scripted/m1"}, "workspace": oc.workspace}},
	})
	oc.env = []string{
		"HOME=" + oc.user, "OPENCLAW_STATE_DIR=" + state, "TMPDIR=" + t.TempDir(),
		// The gateway, its CLI and the agent's exec commands: OpenClaw on Node 24, and this bgtask.
		"PATH=" + strings.Join([]string{filepath.Dir(node), filepath.Dir(openclaw), filepath.Dir(bin), "/usr/local/bin", "/usr/bin", "/bin"}, ":"),
		"OPENCLAW_SKIP_CHANNELS=1", "OPENCLAW_DISABLE_BONJOUR=1",
		"GORACE=atexit_sleep_ms=0 halt_on_error=1",
	}
	if r := runBin(t, time.Minute, append(oc.env, "BGTASK_HOME="+oc.home), "setup", "openclaw"); r.code != 0 {
		t.Fatalf("setup openclaw: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() {
		if oc.gateway != nil {
			_ = syscall.Kill(-oc.gateway.Process.Pid, syscall.SIGKILL)
			<-oc.exited
		}
		if t.Failed() && oc.log != nil {
			t.Logf("the gateway's output:\n%s", oc.log.String())
		}
	})
	oc.startGateway()
	return oc
}

// startBgtask starts the bgtask server, for the whole test: one a
// scenario starts serves the next ones.
func (oc *openclawGateway) startBgtask() *proc {
	oc.t.Helper()
	return startServer(oc.t, oc.home, oc.serverArgs...)
}

// startGateway starts the gateway, in a process group of its own, and returns
// once its hooks answer. Its start can fail under load (a startup deadline of
// its own); it is tried again then.
func (oc *openclawGateway) startGateway() {
	oc.t.Helper()
	for try := 1; ; try++ {
		oc.log = &syncBuffer{}
		cmd := exec.Command(oc.openclaw, "gateway", "run")
		cmd.Env, cmd.Dir = oc.env, oc.user
		cmd.Stdout, cmd.Stderr = oc.log, oc.log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			oc.t.Fatal(err)
		}
		oc.gateway, oc.exited = cmd, make(chan struct{})
		go func(done chan struct{}) {
			_ = cmd.Wait()
			close(done)
		}(oc.exited)
		if oc.awaitHooks() {
			return
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-oc.exited
		if try == 2 {
			oc.t.Fatalf("the gateway did not start, twice:\n%s", oc.log.String())
		}
		oc.t.Logf("the gateway did not start; again. Its output:\n%s", oc.log.String())
	}
}

// awaitHooks waits until the gateway answers on its hooks path (405 to a GET),
// and reports false if it exits first.
func (oc *openclawGateway) awaitHooks() bool {
	url := fmt.Sprintf("http://127.0.0.1:%d/hooks/agent", oc.port)
	up := false
	testkit.Eventually(oc.t, 5*time.Minute, "the gateway's hooks answering", func() bool {
		select {
		case <-oc.exited:
			return true
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		up = resp.StatusCode == http.StatusMethodNotAllowed
		return up
	})
	return up
}

// stopGateway stops the gateway as its service manager would (SIGTERM), and
// waits for the whole group to be gone.
func (oc *openclawGateway) stopGateway() {
	oc.t.Helper()
	pgid := oc.gateway.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-oc.exited:
	case <-time.After(2 * time.Minute):
		oc.t.Logf("the gateway did not stop on SIGTERM; killed")
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-oc.exited
	oc.gateway = nil
}

// turn runs one turn of the agent's main session, as a user's message would
// (openclaw agent, through the gateway), and returns what it printed.
func (oc *openclawGateway) turn(message string) string {
	oc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, oc.openclaw, "agent", "--session-key", "agent:main:main", "--message", message)
	cmd.Env, cmd.Dir = oc.env, oc.user
	out, err := cmd.CombinedOutput()
	if err != nil {
		oc.t.Fatalf("openclaw agent %q: %v\n%s", message, err, out)
	}
	return string(out)
}

// task is the id of the one task whose command holds mark.
func (oc *openclawGateway) task(mark string) string {
	oc.t.Helper()
	tasks := decodeJSON[struct {
		Tasks []struct{ ID, Command string }
	}](oc.t, ok(oc.t, oc.home, "list", "--json")).Tasks
	for _, task := range tasks {
		if strings.Contains(task.Command, mark) {
			return task.ID
		}
	}
	oc.t.Fatalf("no task runs %s: %+v", mark, tasks)
	return ""
}

// pushLine is the line of show's output that says where the push is.
func pushLine(show string) string {
	for _, line := range strings.Split(show, "\n") {
		if strings.HasPrefix(line, "push 0:") {
			return line
		}
	}
	return ""
}

// awaitDelivered waits until the task's push is delivered.
func (oc *openclawGateway) awaitDelivered(id string) {
	oc.t.Helper()
	testkit.Eventually(oc.t, 10*time.Minute, "the push of "+id+" delivered", func() bool {
		return strings.Contains(ok(oc.t, oc.home, "show", id), "delivered")
	})
}

// awaitWakeTurn waits for the turn that carries the wake-up of the task whose
// output holds mark.
func (oc *openclawGateway) awaitWakeTurn(mark string) openclawRequest {
	oc.t.Helper()
	testkit.Eventually(oc.t, 10*time.Minute, "the turn of "+mark+"'s wake-up", func() bool {
		return len(oc.model.wakeTurns(mark)) > 0
	})
	return oc.model.wakeTurns(mark)[0]
}
