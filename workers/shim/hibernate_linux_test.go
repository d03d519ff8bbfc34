//go:build linux && cgo && !bgtask_portable

package shim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// awaitHibernated waits until the shim pid has become the waiter: one thread, no
// Go runtime, its arguments those of a hibernation and its name kept.
// What it saw is logged as it changes, for a failure to show.
func awaitHibernated(t *testing.T, pid int) {
	t.Helper()
	last := ""
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("the shim %d hibernated", pid), func() bool {
		ok, seen := hibernated(t, pid)
		if seen != last {
			t.Logf("the shim %d: %s", pid, seen)
			last = seen
		}
		return ok
	})
}

// hibernated says whether process pid is a hibernated shim now, and what it saw.
func hibernated(t *testing.T, pid int) (bool, string) {
	t.Helper()
	if !hibernation {
		t.Fatal("package waiter is linked in (waiter_test.go), and its shims do not hibernate")
	}
	proc := "/proc/" + strconv.Itoa(pid)
	name := filepath.Base(os.Args[0])
	name = name[:min(15, len(name))] // the kernel's limit
	cmdline, _ := os.ReadFile(proc + "/cmdline")
	status, _ := os.ReadFile(proc + "/status")
	comm, _ := os.ReadFile(proc + "/comm")
	// The name is set by the waiter as it starts: exec'd as /proc/self/exe,
	// the kernel names it "exe".
	threads := "Threads: ?"
	if _, after, found := bytes.Cut(status, []byte("\nThreads:")); found {
		count, _, _ := bytes.Cut(after, []byte("\n"))
		threads = "Threads: " + string(bytes.TrimSpace(count))
	}
	ok := bytes.Contains(cmdline, []byte("\x00"+hibernatedFlag+"\x00")) && threads == "Threads: 1" &&
		strings.TrimSpace(string(comm)) == name
	return ok, fmt.Sprintf("its command line %q, name %q (want %q), %s", cmdline, bytes.TrimSpace(comm), name, threads)
}

type exitJSON struct {
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal"`
	StoppedBy string    `json:"stopped_by"`
	StartedAt time.Time `json:"started_at"`
}

func readExit(t *testing.T, dir string) exitJSON {
	t.Helper()
	var e exitJSON
	readRecord(t, filepath.Join(dir, ExitFile), &e)
	return e
}

// readRecord reads one of the JSON files the shim writes into v.
func readRecord(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		t.Fatalf("%s: %v (%s)", path, err, data)
	}
}

// hibernatedShim starts a shim (testShim) with run r, and returns once its
// command has started and the shim has hibernated.
func hibernatedShim(t *testing.T, idle int64, r Run, env []byte) (*os.File, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	said := new(bytes.Buffer)
	sock, cmd := testShim(t, idle, said)
	sendRun(t, sock, r, env, 1<<20)
	if !says(sock, Recorded) {
		t.Fatalf("no start recorded: %s", said.Bytes())
	}
	awaitHibernated(t, cmd.Process.Pid)
	return sock, cmd, said
}

// goOn writes a line to the FIFO a command reads to go on. It holds the FIFO
// open for the rest of the test rather than waiting for a reader: where the
// command ended before it read, a write that waited would wait for ever.
func goOn(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_RDWR, 0) // Linux opens a FIFO for both ends at once
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
}

func shRun(t *testing.T, env []byte, script string, args ...string) Run {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	return Run{Dir: t.TempDir(), Cwd: "/", Path: sh, Args: append([]string{"sh", "-c", script}, args...), EnvBytes: int64(len(env))}
}

// A shim whose command runs long becomes the waiter, and wakes when the command
// ends: the exit it records is the command's, with the start the shim recorded,
// and the shim takes the worker's next run as one that never hibernated does.
func TestAShimWhoseCommandRunsLongHibernatesAndRecordsItsExit(t *testing.T) {
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	fifo := filepath.Join(t.TempDir(), "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	long, next := shRun(t, env, `read x < "$0"; exit 7`, fifo), shRun(t, env, "exit 4")
	sock, cmd, said := hibernatedShim(t, 20e9, long, env)
	goOn(t, fifo)
	if !says(sock, Idle) {
		t.Fatalf("the shim did not wake to say it was idle: %s", said.Bytes())
	}
	var pids struct {
		Shim      ProcRef   `json:"shim"`
		StartedAt time.Time `json:"started_at"`
	}
	readRecord(t, filepath.Join(long.Dir, PIDFile), &pids)
	if pids.Shim.PID != cmd.Process.Pid {
		t.Fatalf("pid.json names shim %d, want the shim's PID %d", pids.Shim.PID, cmd.Process.Pid)
	}
	if e := readExit(t, long.Dir); e.ExitCode != 7 || !e.StartedAt.Equal(pids.StartedAt) {
		t.Errorf("exit %+v, want exit code 7, started at %v", e, pids.StartedAt)
	}
	if lock, err := os.Open(long.Dir); err == nil {
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			t.Error("the start lock is still held once the run is over")
		}
		lock.Close()
	}
	sendRun(t, sock, next, env, 1<<20)
	if !says(sock, Recorded) || !says(sock, Idle) {
		t.Fatalf("the woken shim did not take the next run: %s", said.Bytes())
	}
	if e := readExit(t, next.Dir); e.ExitCode != 4 {
		t.Errorf("the next run's exit %+v, want exit code 4", e)
	}
	sock.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("the shim ended with %v: %s", err, said.Bytes())
	}
}

// The waiter keeps the command's deadline and its stall kill, and the shim's
// subreaping: what the command left is stopped once its exit is written.
func TestAHibernatedShimKeepsTheCommandsTimersAndStopsWhatItLeft(t *testing.T) {
	testkit.FullOnly(t)
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	leftover := filepath.Join(t.TempDir(), "leftover")
	deadline := shRun(t, env, "exec sleep 60")
	deadline.Deadline = time.Now().Add(4 * time.Second).UnixNano()
	stall := shRun(t, env, "echo once; exec sleep 60")
	stall.StallAfter = int64(3 * time.Second)
	left := shRun(t, env, `setsid sleep 60 & echo $! > "$0"; read x < "$0.go"`, leftover)
	if err := syscall.Mkfifo(leftover+".go", 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		run    Run
		by     string
		signal string
	}{{"deadline", deadline, StoppedByDeadline, "TERM"}, {"stall", stall, StoppedByStall, "TERM"}, {"leftover", left, "", ""}} {
		t.Run(c.name, func(t *testing.T) {
			_, cmd, said := hibernatedShim(t, 0, c.run, env)
			if c.name == "leftover" {
				goOn(t, leftover+".go")
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
			}
			if e := readExit(t, c.run.Dir); e.StoppedBy != c.by || e.Signal != c.signal {
				t.Errorf("exit %+v, want stopped by %q with signal %q", e, c.by, c.signal)
			}
			if c.name != "leftover" {
				return
			}
			data, _ := os.ReadFile(leftover)
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				t.Fatalf("the command's leftover PID: %q", data)
			}
			if syscall.Kill(pid, 0) == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Error("what the command left runs on after its hibernated shim ended")
			}
		})
	}
}

// The command outlives its hibernated shim, as it does a shim that never
// hibernated: the worker above the shim, a subreaper, learns how it ends.
func TestACommandOutlivesItsHibernatedShim(t *testing.T) {
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	r := shRun(t, env, "exec sleep 60")
	_, cmd, _ := hibernatedShim(t, 0, r, env)
	var pids struct {
		Command ProcRef `json:"command"`
	}
	readRecord(t, filepath.Join(r.Dir, PIDFile), &pids)
	defer func() { _ = syscall.Kill(pids.Command.PID, syscall.SIGKILL) }()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	// A parent-death signal is sent as the shim ends, before its reap: one would
	// have reached the command by now.
	if !pids.Command.Alive() {
		t.Fatalf("the command %+v died with its hibernated shim", pids.Command)
	}
}

// A shim woken to look at a stall, whose command printed meanwhile, carries on
// and hibernates again, and its command lives on. The command makes orphans for
// the woken shim to reap and the shim runs on one P.
func TestAShimHibernatesAgainAndItsCommandLivesOn(t *testing.T) {
	testkit.FullOnly(t)
	t.Setenv("GOMAXPROCS", "1") // the shim's
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	const want = 3
	done, attempts := 0, 0
	for ; done < want && attempts < 2*want; attempts++ {
		if rehibernated(t, env) {
			done++
		}
	}
	if done < want {
		t.Fatalf("%d of %d commands printed before their woken shim looked at the stall, want %d", done, attempts, want)
	}
}

// rehibernated runs a command that prints again as soon as its shim wakes for a
// stall, and says whether the shim went on and hibernated again with the command
// alive: false where the shim looked first (it looks as it starts, the stall
// being due), and stopped the command for its stall. It fails the test where the
// command died otherwise.
func rehibernated(t *testing.T, env []byte) bool {
	t.Helper()
	// The command watches its shim's command line for the waiter's exec of the Go
	// side. dash's read drops the NULs between arguments (bash's says so on
	// stderr, which would count as output); a sleep between looks leaves the
	// cores to the shim.
	r := shRun(t, env, `echo a
until read -r line </proc/$PPID/cmdline 2>/dev/null; case $line in *`+wokenFlag+`*) true ;; *) false ;; esac; do sleep 0.002; done
echo b; while :; do (sleep 0.01 &); sleep 0.02; done`)
	r.StallAfter = int64(3 * time.Second)
	_, cmd, said := hibernatedShim(t, 0, r, env)
	var pids struct {
		Command ProcRef `json:"command"`
	}
	readRecord(t, filepath.Join(r.Dir, PIDFile), &pids)
	defer func() { _ = syscall.Kill(-pids.Command.PID, syscall.SIGKILL) }()
	testkit.Eventually(t, 20*time.Second, "the shim woke, or its command ended", func() bool {
		return holdsFlag(cmd.Process.Pid, wokenFlag) || !pids.Command.Alive()
	})
	testkit.Eventually(t, 20*time.Second, "the shim hibernated again, or its command ended", func() bool {
		ok, _ := hibernated(t, cmd.Process.Pid)
		return ok || !pids.Command.Alive()
	})
	if !pids.Command.Alive() {
		_ = cmd.Wait()
		e := readExit(t, r.Dir)
		if e.StoppedBy != StoppedByStall {
			t.Fatalf("the command died as its shim hibernated again: exit %+v (%s)", e, said.Bytes())
		}
		t.Logf("the woken shim looked at the stall before the command printed: %+v", e)
		return false
	}
	if ok, seen := hibernated(t, cmd.Process.Pid); !ok {
		t.Fatalf("the shim did not hibernate again: %s", seen)
	}
	_ = syscall.Kill(-pids.Command.PID, syscall.SIGKILL)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
	}
	return true
}

// holdsFlag says whether the command line of process pid holds flag.
func holdsFlag(pid int, flag string) bool {
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return bytes.Contains(cmdline, []byte("\x00"+flag+"\x00"))
}

// A hibernated shim keeps its command's output files within their bound as the
// Go shim does (TestAShimBoundsTheOutputNoWorkerReads), told of each write by
// the kernel, and goes on doing so when it wakes and hibernates again.
func TestAHibernatedShimBoundsTheOutputNoWorkerReads(t *testing.T) {
	testkit.FullOnly(t)
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	gate := filepath.Join(t.TempDir(), "go")
	r := floodRun(t, env, gate)
	_, cmd, said := hibernatedShim(t, 0, r, env)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if peak := peakWhileFlooding(t, r, gate); peak > outputBound {
		t.Fatalf("the output file took %d bytes of disk while its command printed %d, want at most %d", peak, floodBytes, outputBound)
	}
	if ok, seen := hibernated(t, cmd.Process.Pid); !ok {
		t.Fatalf("the shim woke while its command printed: %s", seen)
	}
	if err := os.WriteFile(gate+".end", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
	}
	if e := readExit(t, r.Dir); e.ExitCode != 0 {
		t.Fatalf("exit %+v, want exit code 0", e)
	}
}
