package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// Named faults, each in the window it is about. The randomised trials
// (trials_test.go) mix them; these pin each one down.

// A killed shim leaves its command running: the worker, a subreaper above the
// shim, records the command's exit when it ends, once, and its caller is woken
// once with it. A worker that was away when the shim died is no ancestor of the
// command: it reads the exit from the command's pidfd once whoever has the command
// reaps it (Linux 6.15); where nobody can, the task is lost, once, and says why,
// as it is without a subreaper (bgtask_portable, macOS).
func TestAKilledShimLeavesItsCommandRunningAndItsExitIsRecordedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		away bool // the server (and its worker) is down when the shim dies
	}{
		{name: "while its worker watches"},
		{name: "while no worker watches", away: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			home, dir := t.TempDir(), t.TempDir()
			srv := startServer(t, home)
			makeGate(t, dir, "end")
			id := add(t, home, "--cwd", dir, "--", `echo $$ $PPID >> pids; `+gate("end")+`echo ended; exit 5`)
			pid, shim := waitPIDPair(t, filepath.Join(dir, "pids"))
			// The command runs before its shim records its PID; a shim killed in
			// between loses the run (TestAShimKilledBeforeItRecordedThePIDLosesTheRun).
			testkit.Eventually(t, 30*time.Second, "the command's start recorded", func() bool { return show(t, home, id).PID == pid })
			if tc.away {
				srv.stop(syscall.SIGKILL)
			}
			if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 30*time.Second, "the shim gone", func() bool { return processGone(shim) })
			if !portableEnabled && processGone(pid) {
				t.Fatal("the command died with its shim")
			}
			if tc.away {
				startServer(t, home)
			}
			if portableEnabled {
				// No subreaper and no pidfd (bgtask_portable, as on macOS): nobody can
				// learn how the command ends, and the worker stops it, as soon as it
				// sees the shim gone, perhaps before this test looked above.
				testkit.Eventually(t, 30*time.Second, "the command stopped", func() bool { return processGone(pid) })
			}
			openGate(t, dir, "end")
			w := waitFor(t, home, id)
			n := countTypes(history(t, home, id))
			if portableEnabled || tc.away && !pidfdKeepsExits(t) {
				if !strings.Contains(w.Reason, "the shim of its run died") || w.ExitCode != nil {
					t.Fatalf("wake-up: %+v, want lost because the shim died", w)
				}
				if n["lost"] != 1 || n["exited"]+n["failed"] != 0 || n["fired"] != 1 {
					t.Fatalf("history: %v, want one lost, no other end, one fired", n)
				}
			} else {
				if w.Status != "failed" || w.ExitCode == nil || *w.ExitCode != 5 {
					t.Fatalf("wake-up: %+v, want the command's exit code 5", w)
				}
				if n["exited"] != 1 || n["lost"] != 0 || n["fired"] != 1 {
					t.Fatalf("history: %v, want one exited, no lost, one fired", n)
				}
			}
			inbox := strings.TrimSpace(ok(t, home, "inbox", "--json"))
			if strings.Count(inbox, "\n") != 0 || !strings.Contains(inbox, id) {
				t.Fatalf("inbox, want exactly one wake-up:\n%s", inbox)
			}
			auditClean(t, home)
		})
	}
}

// A worker killed, restarted, and killed again while it finds its runs again,
// then restarted: each command's exit is recorded exactly once, with its code,
// whether the command ended during the first absence, the second, or after.
func TestAWorkerKilledTwiceInARowRecordsEachExitOnce(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	startServer(t, home, "--no-worker")
	worker := func() *proc { return start(t, home, "worker", "--worker-id", "twice", "--tick", "200ms") }
	w := worker()
	const tasks = 6
	var ids []string
	for i := range tasks {
		makeGate(t, dir, "g"+strconv.Itoa(i))
		ids = append(ids, add(t, home, "--cwd", dir, "--", fmt.Sprintf(`echo $$ $PPID > pids.%d; %s exit %d`, i, gate("g"+strconv.Itoa(i)), 10+i)))
	}
	pid := make([]int, tasks)
	for i := range tasks {
		pid[i], _ = waitPIDPair(t, filepath.Join(dir, "pids."+strconv.Itoa(i)))
	}
	end := func(i int) {
		openGate(t, dir, "g"+strconv.Itoa(i))
		testkit.Eventually(t, 30*time.Second, "the command ended", func() bool { return processGone(pid[i]) })
	}

	w.stop(syscall.SIGKILL)
	end(0) // while it is away the first time
	end(1)
	w = worker()
	// Killed again the moment it watches a run again: it may have recorded some of
	// the exits, or none.
	testkit.Eventually(t, 30*time.Second, "the worker finding its runs again", func() bool {
		return strings.Contains(w.out.String(), "watching a run again")
	})
	w.stop(syscall.SIGKILL)
	end(2) // while it is away the second time
	end(3)
	worker()
	end(4) // after
	end(5)
	for i, id := range ids {
		wk := waitFor(t, home, id)
		if wk.ExitCode == nil || *wk.ExitCode != 10+i {
			t.Fatalf("task %d: wake-up %+v, want exit %d", i, wk, 10+i)
		}
		if n := countTypes(history(t, home, id)); n["spawned"] != 1 || n["exited"] != 1 || n["fired"] != 1 || n["lost"]+n["failed"] != 0 {
			t.Fatalf("task %d: history %v, want one spawned, exited and fired", i, n)
		}
	}
	auditClean(t, home)
}

// The whole server (its worker with it) is killed while 20 commands run; half of
// them end while it is down. After a restart all 20 fire exactly once, each with
// its command's exit code.
func TestTwentyCommandsSurviveAServerKill(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	const tasks = 20
	nc, _ := connect(t, home)
	var ids []string
	for i := range tasks {
		makeGate(t, dir, "g"+strconv.Itoa(i))
		command := fmt.Sprintf(`echo $$ $PPID > pids.%d; echo task %d; %s exit %d`, i, i, gate("g"+strconv.Itoa(i)), 100+i)
		ids = append(ids, register(t, nc, map[string]any{"command": command, "cwd": dir}))
	}
	nc.Close()
	var pids []int
	for i := range tasks {
		pid, _ := waitPIDPair(t, filepath.Join(dir, "pids."+strconv.Itoa(i)))
		pids = append(pids, pid)
	}

	srv.stop(syscall.SIGKILL)
	for i := 0; i < tasks; i += 2 {
		openGate(t, dir, "g"+strconv.Itoa(i))
		testkit.Eventually(t, 30*time.Second, "the command ended", func() bool { return processGone(pids[i]) })
	}
	for i := 1; i < tasks; i += 2 {
		if processGone(pids[i]) {
			t.Fatalf("command %d died with the server", i)
		}
	}
	startServer(t, home)
	for i := 1; i < tasks; i += 2 {
		openGate(t, dir, "g"+strconv.Itoa(i))
	}
	for i, id := range ids {
		w := waitFor(t, home, id)
		if w.ExitCode == nil || *w.ExitCode != 100+i || strings.Join(w.Tail, ",") != "task "+strconv.Itoa(i) {
			t.Fatalf("task %d: wake-up %+v, want exit %d", i, w, 100+i)
		}
		if n := countTypes(history(t, home, id)); n["spawned"] != 1 || n["exited"] != 1 || n["completion-persisted"] != 1 || n["fired"] != 1 {
			t.Fatalf("task %d: history %v", i, n)
		}
	}
	inbox := strings.TrimSpace(ok(t, home, "inbox", "--json"))
	if got := strings.Count(inbox, "\n") + 1; got != tasks {
		t.Fatalf("%d wake-ups in the inbox, want %d", got, tasks)
	}
	auditClean(t, home)
}

// A command that leaves a process behind in a session of its own: nothing holds
// its output open, so its exit is recorded at once, not when the sleeper ends in
// ten minutes; and the shim stops the sleeper once the exit is recorded.
func TestABackgroundGrandchildNeitherDelaysTheWakeupNorOutlivesIt(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	startServer(t, home)
	id := add(t, home, "--cwd", dir, "--", `setsid sleep 600 & echo $! > orphan; echo left; exit 3`)
	orphan := readPID(t, filepath.Join(dir, "orphan"))
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	w := waitFor(t, home, id) // its timeout (45s) is far below the sleeper's 600s
	if w.ExitCode == nil || *w.ExitCode != 3 || strings.Join(w.Tail, ",") != "left" {
		t.Fatalf("wake-up %+v, want exit 3 and its output", w)
	}
	// Without a subreaper (bgtask_portable, as on macOS) a session of the command's
	// own is out of the shim's reach and runs on (docs/platforms.md).
	if !portableEnabled {
		testkit.Eventually(t, 30*time.Second, "the sleeper gone with its command's shim", func() bool { return processGone(orphan) })
	}
	auditClean(t, home)
}

// kill -TERM $$ ends the command's shell by a signal: the exit code is 143 (128+15,
// as a shell reports it) and the signal is TERM, in the exited event, the wake-up,
// its prompt and show; a command that exits 143 by itself has no signal.
func TestACommandKilledByTERMReportsSignalTERM(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	killed := add(t, home, "--", `echo hi; kill -TERM $$; echo unreachable`)
	exits := add(t, home, "--", `exit 143`)

	w := waitFor(t, home, killed)
	if w.Status != "failed" || w.ExitCode == nil || *w.ExitCode != 143 || w.Signal != "TERM" || strings.Join(w.Tail, ",") != "hi" {
		t.Fatalf("wake-up %+v, want failed with exit 143 and signal TERM", w)
	}
	if !strings.Contains(w.Prompt, "exit code 143, signal TERM") {
		t.Fatalf("prompt does not name the signal:\n%s", w.Prompt)
	}
	var exited struct {
		ExitCode int    `json:"exit_code"`
		Signal   string `json:"signal"`
	}
	for _, e := range history(t, home, killed) {
		if e.Type == "exited" {
			if err := json.Unmarshal(e.Raw, &exited); err != nil {
				t.Fatal(err)
			}
		}
	}
	if exited.ExitCode != 143 || exited.Signal != "TERM" {
		t.Fatalf("exited event: %+v, want exit 143 and signal TERM", exited)
	}
	if s := show(t, home, killed); s.ExitCode == nil || *s.ExitCode != 143 {
		t.Fatalf("show: %+v", s)
	}
	if human := ok(t, home, "show", killed); !strings.Contains(human, "143 (signal TERM)") {
		t.Fatalf("show does not name the signal:\n%s", human)
	}

	if w := waitFor(t, home, exits); w.ExitCode == nil || *w.ExitCode != 143 || w.Signal != "" {
		t.Fatalf("a command that exits 143: %+v, want exit 143 and no signal", w)
	}
}

// A worker killed while it stops a command whose completion rule matched (the
// command ignores TERM, so the worker waits out its kill grace) did not record
// the end. Restarted, it finishes that stop and records the match, rather than
// watch again a command whose matched line is behind where the log stands.
func TestAWorkerKilledInTheKillGraceFinishesTheStopItDecided(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	startServer(t, home, "--no-worker")
	w := start(t, home, "worker", "--worker-id", "graceful", "--kill-grace", "60s")
	id := add(t, home, "--cwd", dir, "--complete-on-regex", "^MATCH$", "--",
		`trap 'echo TERM >> termed' TERM; echo $$ $PPID > pids; echo MATCH; while :; do sleep 0.05; done`)
	pid, _ := waitPIDPair(t, filepath.Join(dir, "pids"))
	testkit.Eventually(t, 30*time.Second, "the worker stopping the command", func() bool {
		_, err := os.Stat(filepath.Join(dir, "termed"))
		return err == nil
	})
	// The matched line is in the log: a worker watching the command again from
	// where the log stands would never see it.
	testkit.Eventually(t, 30*time.Second, "the matched line in the log", func() bool { return ok(t, home, "logs", "--stdout", id) == "MATCH\n" })
	w.stop(syscall.SIGKILL) // in its 60s grace

	start(t, home, "worker", "--worker-id", "graceful", "--kill-grace", "1s")
	wk := waitFor(t, home, id)
	if wk.Status != "succeeded" || wk.MatchedLine != "MATCH" {
		t.Fatalf("wake-up %+v, want succeeded with the matched line", wk)
	}
	testkit.Eventually(t, 30*time.Second, "the command gone after its stop", func() bool { return processGone(pid) })
	if n := countTypes(history(t, home, id)); n["exited"] != 1 || n["fired"] != 1 {
		t.Fatalf("history %v", n)
	}
	auditClean(t, home)
}

// A worker process follows its server when the server comes back on another port
// (another program took its port while it was down): the commands it runs are
// recorded, and it takes new tasks.
func TestAWorkerFollowsItsServerToANewPort(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home, "--no-worker")
	start(t, home, "worker", "--worker-id", "follower")
	makeGate(t, dir, "g")
	before := add(t, home, "--cwd", dir, "--", `echo $$ $PPID > pids; `+gate("g")+`exit 5`)
	waitPIDPair(t, filepath.Join(dir, "pids"))
	oldURL := serverURL(t, home)
	srv.stop(syscall.SIGTERM)
	taken, err := net.Listen("tcp", strings.TrimPrefix(oldURL, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	startServer(t, home)
	if serverURL(t, home) == oldURL {
		t.Fatal("the server came back on a port another program holds")
	}
	openGate(t, dir, "g")
	if w := waitFor(t, home, before); w.ExitCode == nil || *w.ExitCode != 5 {
		t.Fatalf("wake-up of the task started before: %+v", w)
	}
	if w := waitFor(t, home, add(t, home, "--", "exit 6")); w.ExitCode == nil || *w.ExitCode != 6 {
		t.Fatalf("wake-up of a task added after: %+v", w)
	}
	auditClean(t, home)
}

// A server (or worker) started with another --worker-id on a state directory that
// holds runs refuses to start rather than stop them; its own id watches them to
// their end.
func TestAServerWithAnotherWorkerIDLeavesTheRunsOfItsStateDirectoryAlone(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	makeGate(t, dir, "g")
	id := add(t, home, "--cwd", dir, "--", `echo $$ $PPID > pids; `+gate("g")+`exit 8`)
	pid, _ := waitPIDPair(t, filepath.Join(dir, "pids"))
	srv.stop(syscall.SIGKILL)

	r := run(t, home, "server", "--listen", "127.0.0.1:0", "--worker-id", "renamed")
	if r.code == 0 || !strings.Contains(r.stderr, "holds 1 runs of worker") {
		t.Fatalf("server with another worker id: exit %d\n%s", r.code, r.stderr)
	}
	if processGone(pid) {
		t.Fatal("the refused server stopped the command")
	}
	startServer(t, home)
	openGate(t, dir, "g")
	if w := waitFor(t, home, id); w.ExitCode == nil || *w.ExitCode != 8 {
		t.Fatalf("wake-up: %+v, want exit 8", w)
	}
	auditClean(t, home)
}
