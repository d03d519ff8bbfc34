package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// watched is a process that bgtask does not start, for a task to watch: this
// test's child, until end kills and reaps it.
type watched struct {
	t   *testing.T
	cmd *exec.Cmd
	pid string
}

func startWatched(t *testing.T) *watched {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &watched{t: t, cmd: cmd, pid: strconv.Itoa(cmd.Process.Pid)}
	t.Cleanup(w.end)
	return w
}

func (w *watched) end() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

func (w *watched) alive() bool {
	return w.cmd.ProcessState == nil && syscall.Kill(w.cmd.Process.Pid, 0) == nil
}

// awaitWatching waits until a worker holds the watch of task id.
func awaitWatching(t *testing.T, home, id string) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "a worker took the watch", func() bool {
		return countTypes(history(t, home, id))["spawned"] == 1
	})
}

// checkWatchEnded checks the one wake-up of a watch whose process ended: no exit
// code (bgtask is not its parent), and a reason that says why.
func checkWatchEnded(t *testing.T, home, id, target, pid string) {
	t.Helper()
	w := waitFor(t, home, id)
	if w.Status != "succeeded" || w.ExitCode != nil || !strings.Contains(w.Reason, "exit status cannot be read") {
		t.Fatalf("wake-up of a watch: %+v", w)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(ok(t, home, "wait", id, "--json")), &raw); err != nil || string(raw["exit_code"]) != "null" {
		t.Fatalf("wait --json: exit_code %s, want null (%v)", raw["exit_code"], err)
	}
	h := history(t, home, id)
	if n := countTypes(h); n["spawned"] != 1 || n["exited"] != 1 || n["fired"] != 1 {
		t.Fatalf("history of the watch: %v", n)
	}
	for _, e := range h {
		var exited struct {
			WatchedPID int `json:"watched_pid"`
		}
		if e.Type == "exited" && (json.Unmarshal(e.Raw, &exited) != nil || strconv.Itoa(exited.WatchedPID) != pid) {
			t.Fatalf("exited names no watched PID %s: %s", pid, e.Raw)
		}
	}
	if got := inboxLines(t, home, target); len(got) != 1 {
		t.Fatalf("the inbox holds %d wake-ups of the watch, want 1", len(got))
	}
	if show := ok(t, home, "show", id); !strings.Contains(show, "pid "+pid) {
		t.Fatalf("show does not say what is watched:\n%s", show)
	}
	auditClean(t, home)
}

// A process bgtask did not start is watched to its end: one wake-up, with no exit
// code.
func TestAWatchedPIDFiresOnceWhenItEnds(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	p := startWatched(t)
	id := add(t, home, "--target", "pids", "--pid", p.pid)
	awaitWatching(t, home, id)
	p.end()
	checkWatchEnded(t, home, id, "pids", p.pid)
	var list struct {
		Tasks []struct {
			ExitCode *int `json:"exit_code"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(ok(t, home, "list", "--json")), &list); err != nil || len(list.Tasks) != 1 || list.Tasks[0].ExitCode != nil {
		t.Fatalf("list of a watch that ended: %+v (%v)", list, err)
	}
}

// A watched process that ends while the server (and its worker) is killed fires
// once after the restart.
func TestAWatchedPIDThatEndsWhileTheServerIsDownFiresOnce(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home)
	p := startWatched(t)
	id := add(t, home, "--target", "pids", "--pid", p.pid, "--deadline", "1h")
	awaitWatching(t, home, id)
	srv.stop(syscall.SIGKILL)
	p.end()
	startServer(t, home)
	checkWatchEnded(t, home, id, "pids", p.pid)
}

// A PID that names another process than the one registered (its start time
// differs: the PID was reused) is the registered process's end, at once, though a
// process runs under it.
func TestAReusedPIDIsTheEndOfTheWatch(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	nc, _ := connect(t, home)
	p := startWatched(t)
	stat, err := os.ReadFile("/proc/" + p.pid + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	start, err := strconv.ParseUint(strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	task := register(t, nc, map[string]any{
		"target":    "pids",
		"process":   map[string]any{"pid": p.cmd.Process.Pid, "start": start + 1, "boot": strings.TrimSpace(string(boot))},
		"placement": map[string]any{"labels": map[string]string{"host": host}},
	})
	checkWatchEnded(t, home, task, "pids", p.pid)
	if !p.alive() {
		t.Fatal("the process under the reused PID was touched")
	}
}

// A deadline ends a watch as timed_out, and a cancel ends one; neither touches
// the process.
func TestAWatchIsBoundedByItsDeadlineAndCancelled(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	p := startWatched(t)
	timed := add(t, home, "--target", "pids", "--pid", p.pid, "--deadline", "2s")
	if w := waitFor(t, home, timed); w.Status != "timed_out" || w.ExitCode != nil {
		t.Fatalf("wake-up of a watch at its deadline: %+v", w)
	}
	cancelled := add(t, home, "--target", "pids", "--pid", p.pid)
	// A watch ticks as a command does (the server's --tick is 200ms): the audit
	// takes a running task with no event of its run for a long time for a stuck one.
	testkit.Eventually(t, 30*time.Second, "the watch ticked twice", func() bool {
		return countTypes(history(t, home, cancelled))["tick"] >= 2
	})
	if show := ok(t, home, "show", cancelled); !strings.Contains(show, p.pid) {
		t.Fatalf("show of a watch does not name its PID:\n%s", show)
	}
	ok(t, home, "cancel", cancelled)
	if w := waitFor(t, home, cancelled); w.Status != "cancelled" {
		t.Fatalf("wake-up of a cancelled watch: %+v", w)
	}
	if !p.alive() {
		t.Fatal("the watched process was stopped")
	}
	testkit.Eventually(t, 10*time.Second, "the cancelled watch's run directory gone", func() bool {
		runs, _ := os.ReadDir(home + "/worker/runs")
		return len(runs) == 0
	})
	auditClean(t, home)
}

// A PID with no process is refused at registration, naming the flag, and so is a
// spec without the process's identity; nothing is registered.
func TestAMissingPIDIsRefused(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	max, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	beyond, _ := strconv.Atoi(strings.TrimSpace(string(max)))
	missing := strconv.Itoa(beyond + 1)
	r := run(t, home, "add", "--json", "--pid", missing)
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "--pid "+missing) || !strings.Contains(r.stdout+r.stderr, "does not exist") {
		t.Fatalf("add --pid of no process: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	nc, _ := connect(t, home)
	msg, err := nc.Request("bgtask.register", []byte(`{"process":{"pid":4242,"boot":"b"},"placement":{"labels":{"host":"h"}}}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(msg.Data), "process.start") {
		t.Fatalf("a spec without the start time: %s", msg.Data)
	}
	if list := ok(t, home, "list", "--json"); !strings.Contains(list, `"total": 0`) {
		t.Fatalf("a refused registration left tasks: %s", list)
	}
}

// A watch is placed on the host of its process: a worker of another host never
// takes it, one of this host does.
func TestAWatchedPIDRunsOnlyOnItsHost(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, "--no-worker")
	start(t, home, "worker", "--worker-id", "elsewhere", "--label", "host=elsewhere", "--tick", "200ms")
	p := startWatched(t)
	id := add(t, home, "--target", "pids", "--pid", p.pid)
	host, _ := os.Hostname()
	testkit.Eventually(t, 30*time.Second, "the watch waiting for a worker of its host", func() bool {
		var v struct{ Waiting string }
		return json.Unmarshal([]byte(ok(t, home, "show", id, "--json")), &v) == nil && strings.Contains(v.Waiting, "host="+host)
	})
	if n := countTypes(history(t, home, id)); n["spawned"] != 0 {
		t.Fatalf("a worker of another host took the watch: %v", n)
	}
	start(t, home, "worker", "--worker-id", "here", "--tick", "200ms")
	awaitWatching(t, home, id)
	for _, e := range history(t, home, id) {
		if e.Type == "spawned" && e.Writer != "here" {
			t.Fatalf("the watch was taken by %s, not the worker of its host", e.Writer)
		}
	}
	p.end()
	checkWatchEnded(t, home, id, "pids", p.pid)
}
