package workers_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
)

// procStat returns a process's state letter and process group from /proc, ok false
// if /proc does not know it.
func procStat(pid int) (state byte, pgrp int, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 3 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(fields[2])
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], pgrp, true
}

// dead reports whether a process state is a process that has ended but was not yet
// reaped. The killed processes are not this test's children: once their parent is
// gone they belong to PID 1, which in a container may reap them late.
func dead(state byte) bool { return state == 'Z' || state == 'X' }

// alive reports whether pid is a running process.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	if state, _, ok := procStat(pid); ok && dead(state) {
		return false
	}
	return true
}

// groupAlive lists the running members of process group pgid.
func groupAlive(pgid int) []int {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{pgid} // no /proc: the group exists, as far as we can tell
	}
	var members []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, pgrp, ok := procStat(pid); ok && pgrp == pgid && !dead(state) {
			members = append(members, pid)
		}
	}
	return members
}

// waitGone waits until no process of group pgid runs.
func waitGone(t *testing.T, timeout time.Duration, pgid int) {
	t.Helper()
	testkit.Eventually(t, timeout, fmt.Sprintf("process group %d gone", pgid), func() bool { return len(groupAlive(pgid)) == 0 })
}

// waitPIDsGone waits until none of pids runs.
func waitPIDsGone(t *testing.T, timeout time.Duration, pids ...int) {
	t.Helper()
	testkit.Eventually(t, timeout, fmt.Sprintf("processes %v gone", pids), func() bool { return !slices.ContainsFunc(pids, alive) })
}

// readPID waits for a command to write a pid (and its newline) to path.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	testkit.Eventually(t, 10*time.Second, "pid in "+filepath.Base(path), func() bool {
		data, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(data), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	return pid
}

func TestExitIsRecordedPromptlyWhenABackgroundChildHoldsTheOutput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	dir := t.TempDir()
	// It ends at once, most often before its first tick: its PID is in a file.
	id := b.arm(t, engine.Spec{Command: "echo $$ > pid; sleep 600 & echo started", Cwd: dir})
	pgid := readPID(t, filepath.Join(dir, "pid"))
	// The sleeper outlives the command, in the command's process group.
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })

	st := b.waitFor(t, id, 5*time.Second, "ended while the sleeper holds stdout", ended)
	if st.Run == nil {
		t.Fatalf("no run: %q", st.Reason)
	}
	if got, want := st.Run.ExitCode, 0; got != want {
		t.Errorf("exit code = %d, want %d", got, want)
	}
	if got, want := st.Run.Tail, []string{"started"}; !slices.Equal(got, want) {
		t.Errorf("tail = %q, want %q", got, want)
	}
	if took := st.Run.EndedAt.Sub(st.Run.StartedAt); took > 5*time.Second {
		t.Errorf("run lasted %v, want the exit recorded within seconds", took)
	}
}

func TestCancelKillsTheWholeProcessTree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.startWorker(t, workers.Config{KillGrace: 300 * time.Millisecond})
	tests := []struct {
		name string
		// command starts a child ($DIR/c) that starts a grandchild ($DIR/gc).
		command string
	}{
		{name: "all die on TERM", command: `bash -c 'sleep 600 & echo $! > "$DIR/gc"; wait' & echo $! > "$DIR/c"; wait`},
		// The leader dies on TERM; the grandchild left behind still gets KILL.
		{name: "grandchild ignores TERM", command: `bash -c '(trap "" TERM; exec sleep 600) & echo $! > "$DIR/gc"; wait' & echo $! > "$DIR/c"; wait`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			id := b.arm(t, engine.Spec{Command: tt.command, Env: map[string]string{"DIR": dir}, Cwd: dir})
			leader := b.waitFor(t, id, 20*time.Second, "started", hasPID).PID
			t.Cleanup(func() { _ = syscall.Kill(-leader, syscall.SIGKILL) })
			child, grandchild := readPID(t, filepath.Join(dir, "c")), readPID(t, filepath.Join(dir, "gc"))
			if !alive(child) || !alive(grandchild) {
				t.Fatalf("child %d or grandchild %d not running before the cancel", child, grandchild)
			}

			b.cancel(t, id)

			waitPIDsGone(t, 10*time.Second, leader, child, grandchild)
			waitGone(t, 10*time.Second, leader)
			testkit.Eventually(t, 10*time.Second, "done with the task", func() bool { return !slices.Contains(w.Running(), id) })
			h := b.history(t, id)
			if got := h[len(h)-1].Type; got != events.TypeCancelled {
				t.Errorf("history = %v, want it to end with cancelled", types(h))
			}
			for _, rec := range h {
				if rec.Type == events.TypeExited || rec.Type == events.TypeFailed {
					t.Errorf("history = %v, want no end of run besides the cancel", types(h))
				}
			}
		})
	}
}

func TestCancelKillsACommandThatIgnoresTERMAfterTheGrace(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	b := setup(t)
	w := b.startWorker(t, workers.Config{KillGrace: grace})
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	id := b.arm(t, engine.Spec{
		Command: `trap '' TERM; : > "$READY"; sleep 600; echo unreachable`,
		Env:     map[string]string{"READY": ready},
		Cwd:     dir,
	})
	pgid := b.waitFor(t, id, 20*time.Second, "started", hasPID).PID
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	testkit.Eventually(t, 10*time.Second, "ready", func() bool { _, err := os.Stat(ready); return err == nil })

	start := time.Now()
	b.cancel(t, id)
	waitGone(t, 10*time.Second, pgid)
	if took := time.Since(start); took < grace {
		t.Errorf("gone %v after the cancel, want TERM ignored for the grace of %v", took, grace)
	}
	testkit.Eventually(t, 10*time.Second, "done with the task", func() bool { return len(w.Running()) == 0 })
	h := b.history(t, id)
	if got := h[len(h)-1].Type; got != events.TypeCancelled {
		t.Errorf("history = %v, want it to end with cancelled", types(h))
	}
}

// A worker starts its shim as its own child: when the shim ends, once the
// worker let go of it and its last run is over, the worker reaps it, and no
// zombie is left behind.
func TestEndedShimsAreReaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.startWorker(t, workers.Config{})
	dir := t.TempDir()
	id := b.arm(t, engine.Spec{Command: `echo $PPID > shim`, Cwd: dir})
	b.waitFor(t, id, 20*time.Second, "ended", ended)
	shim := readPID(t, filepath.Join(dir, "shim"))
	workers.LetGoOfShim(w)
	testkit.Eventually(t, 20*time.Second, "the shim let go of ended", func() bool {
		state, _, ok := procStat(shim)
		return !ok || dead(state)
	})
	testkit.Eventually(t, 20*time.Second, "the ended shim reaped", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(shim))
		return errors.Is(err, os.ErrNotExist)
	})
}

// A run's directory holds the files of its run and no other: the directory itself
// is the run's intent and its start lock, which its shim holds while it lives.
func TestARunDirectoryIsItsStartLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	id := b.arm(t, engine.Spec{Command: "while [ ! -e gate ]; do sleep 0.02; done", Cwd: dir})
	b.waitFor(t, id, 20*time.Second, "running", hasPID)
	runDir := filepath.Join(state, "runs", id+"-1")
	entries, err := os.ReadDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	// exit.json.tmp: the exit file's room, taken before the command started.
	if want := []string{"exit.json.tmp", "pid.json", "run.json", "stderr", "stdout"}; !slices.Equal(names, want) {
		t.Fatalf("run directory holds %v, want %v", names, want)
	}
	if !workers.ShimAlive(runDir) {
		t.Fatal("the shim of a running command does not hold its run's directory locked")
	}
	if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, id, 20*time.Second, "ended", ended)
}

// A shim is alive, as a worker that died while it started can tell, while
// something holds its run directory locked.
func TestShimAliveReadsTheStartLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if workers.ShimAlive(dir) {
		t.Fatal("alive before anything holds the lock")
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !workers.ShimAlive(dir) {
		t.Fatal("not alive while the directory is locked")
	}
	f.Close()
	if workers.ShimAlive(dir) {
		t.Fatal("alive after the lock was let go")
	}
}

// A shim runs with one Go scheduler thread (GOMAXPROCS=1 in its own environment),
// which its command does not inherit.
func TestAShimRunsWithOneSchedulerThread(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	id := b.arm(t, engine.Spec{Command: `printenv GOMAXPROCS > gomaxprocs; while [ ! -e gate ]; do sleep 0.02; done`, Cwd: dir})
	var pids runPIDs
	testkit.Eventually(t, 20*time.Second, "the run's pid.json", func() bool {
		var err error
		pids, err = readRunPIDs(filepath.Join(state, "runs", id+"-1"))
		return err == nil
	})
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(pids.Shim.PID) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for kv := range strings.SplitSeq(string(environ), "\x00") {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			got = append(got, kv)
		}
	}
	if !slices.Equal(got, []string{"GOMAXPROCS=1"}) {
		t.Errorf("the shim's environment has %q, want GOMAXPROCS=1 once", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, id, 20*time.Second, "ended", ended)
	if out, _ := os.ReadFile(filepath.Join(dir, "gomaxprocs")); len(out) != 0 && os.Getenv("GOMAXPROCS") == "" {
		t.Errorf("the command inherited GOMAXPROCS=%s from its shim", out)
	}
}

// The shim holds none of its worker's stdin, stdout and stderr: it outlives the
// worker, and whoever reads the worker's output (a pipe: a supervisor, a test
// harness, $(...)) would see no end while the shim kept its runs.
func TestTheShimHoldsNoneOfTheWorkersStandardFiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	id := b.arm(t, engine.Spec{Command: `while [ ! -e gate ]; do sleep 0.02; done`, Cwd: dir})
	var pids runPIDs
	testkit.Eventually(t, 20*time.Second, "the run's pid.json", func() bool {
		var err error
		pids, err = readRunPIDs(filepath.Join(state, "runs", id+"-1"))
		return err == nil
	})
	ours := map[string]bool{}
	for fd := range 3 {
		if target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err == nil && target != os.DevNull {
			ours[target] = true
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pids.Shim.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pids.Shim.PID, fd.Name())); err == nil && ours[target] {
			t.Errorf("the shim's descriptor %s is the worker's %s", fd.Name(), target)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, id, 20*time.Second, "ended", ended)
}
