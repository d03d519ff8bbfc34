// Package shim is the command's real parent. A worker starts one shim per run, in
// a new session, so it outlives the worker: a worker that stops, is killed or
// upgraded leaves its commands running. The shim starts the command in its own
// process group with stdout and stderr going straight to files (nothing copies
// them, so nothing can block the command), enforces the deadline and the stall
// kill, reaps the command, and writes the exit file atomically. Everything it
// knows is in its arguments and its run directory:
//
//	environ     the command's environment, NUL-separated (written by the worker)
//	stdout      the command's output
//	stderr
//	starting    made just before the shim starts the command
//	pid.json    the command's and the shim's PIDs with their start times
//	exit.json   how the command ended (or why it could not start)
//
// The worker starts the shim directly in a new session and reaps it when it ends.
// One shim lives per running task, so its memory is what a running task costs:
// the package uses none of the standard library's reflection-based packages
// (encoding/json, fmt): in a test program that only starts a command and waits,
// they took its RSS from 2.1 to 2.8 MiB (bgtask-shim is 2.46 MiB, BENCHMARKS.md).
// It runs as
// its own small binary, bgtask-shim, or as `bgtask shim` where that is missing.
package shim

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The files of a run directory the shim reads or writes.
const (
	EnvironFile   = "environ"
	StdoutFile    = "stdout"
	StderrFile    = "stderr"
	StartLockFile = "start.lock"
	StartingFile  = "starting"
	PIDFile       = "pid.json"
	ExitFile      = "exit.json"
)

// StartLockFD is the descriptor of the run's start lock in a shim: the run
// directory, which the worker locks (flock) before it starts the shim and hands
// down, and the shim keeps open for as long as it lives: whoever finds the lock
// free knows that no shim of the run is alive, or ever will be, so a worker that
// died while its shim started can tell a shim still starting from one gone.
// Workers before this one locked a file of its own in the directory,
// StartLockFile, which the shims they started hold.
const StartLockFD = 3

// Why the shim stopped a command, in Exit.StoppedBy.
const (
	StoppedByDeadline = "deadline"
	StoppedByStall    = "stall"
)

// Fault tests name a crash point in CrashEnv to have a process kill itself there.
const (
	CrashEnv        = "BGTASK_CRASH_AT"
	CrashAfterStart = "shim-after-start" // the command started, its PID not recorded
)

// Main runs a shim with its arguments (Run.ShimArgs). It returns when the command
// has ended and its exit file is written. Meanwhile, once the command's start is
// recorded (its PIDs, or its start error), it lets go of its stdout and stderr: the
// worker that started it reads them until then.
func Main(args []string) error {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		_, err := os.Stdout.WriteString("usage: " + usage)
		return err
	}
	run, err := parseArgs(args)
	if err != nil {
		return err
	}
	return run.supervise()
}

// supervise runs the command to its end. The worker started the shim in a session
// of its own, so that the shim outlives the worker and no signal to the worker's
// process group reaches it.
func (r Run) supervise() error {
	// The start lock (descriptor StartLockFD, if the worker handed one down) stays
	// open until this process ends; CloseRange below keeps it from the command.
	// Orphans of the command become the shim's children, not init's, so the whole
	// tree stays under it.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	started := time.Now().UTC()
	exitPath := filepath.Join(r.Dir, ExitFile)
	fail := func(err error) error {
		defer releaseOutput()
		return WriteDurable(exitPath, Exit{StartError: err.Error(), StartedAt: started, EndedAt: time.Now().UTC()}.appendJSON(nil))
	}
	env, err := ReadEnviron(r.Dir)
	if err != nil {
		return fail(err)
	}
	stdout, err := os.OpenFile(filepath.Join(r.Dir, StdoutFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	stderr, err := os.OpenFile(filepath.Join(r.Dir, StderrFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	// Descriptors the worker inherited (a pipe its caller reads) must not reach a
	// command that outlives it: its reader would never see EOF.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	// From here on the command may be running before its PIDs are recorded: a worker
	// that finds this file and no pid.json knows the shim died starting it.
	if err := os.WriteFile(filepath.Join(r.Dir, StartingFile), nil, 0o600); err != nil {
		return fail(err)
	}
	// The command dies with the shim (Pdeathsig), so it never runs on unrecorded if
	// the shim is killed before it wrote pid.json. The signal follows the thread that
	// started it: this goroutine keeps that thread until the shim ends.
	runtime.LockOSThread()
	proc, err := os.StartProcess(r.Path, r.Args, &os.ProcAttr{
		Dir:   r.Cwd,
		Env:   env,
		Files: []*os.File{devnull, stdout, stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	devnull.Close()
	stdout.Close()
	stderr.Close()
	if err != nil {
		return fail(err)
	}
	if os.Getenv(CrashEnv) == CrashAfterStart {
		_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
	self, _ := ProcStart(os.Getpid())
	child, _ := ProcStart(proc.Pid)
	pids := PIDs{Shim: ProcRef{PID: os.Getpid(), Start: self}, Command: ProcRef{PID: proc.Pid, Start: child}, Started: started}
	// Not made durable: after a crash of the host nothing it names is alive, and a
	// missing pid.json beside the starting file says the same (the shim died).
	if err := WriteAtomic(filepath.Join(r.Dir, PIDFile), pids.appendJSON(nil)); err != nil {
		// Unwatchable: stop it rather than leave it running unknown.
		_ = unix.Kill(-proc.Pid, unix.SIGKILL)
		_, _ = proc.Wait()
		return fail(errors.New("record the command's pid: " + err.Error()))
	}
	releaseOutput()
	exited := make(chan syscall.WaitStatus, 1)
	go reap(proc.Pid, exited)
	stoppedBy, ws := r.watchTimers(proc.Pid, exited)
	exit := Exit{ExitCode: ws.ExitStatus(), StoppedBy: stoppedBy, StartedAt: started, EndedAt: time.Now().UTC()}
	if ws.Signaled() {
		exit.ExitCode, exit.Signal = 128+int(ws.Signal()), SignalName(ws.Signal())
	}
	// Durable: the exit code is what the caller waits for, and it must outlive a
	// crash of the host before the worker recorded it.
	err = WriteDurable(exitPath, exit.appendJSON(nil))
	// The exit is recorded: nothing waits for what the command left behind.
	stopOrphans(max(r.KillGrace, time.Second))
	return err
}

// releaseOutput points the shim's stdout and stderr, a pipe the worker reads until
// it closes, at /dev/null: the worker then knows the command's start is recorded.
func releaseOutput() {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer devnull.Close()
	_ = unix.Dup2(int(devnull.Fd()), 1)
	_ = unix.Dup2(int(devnull.Fd()), 2)
}

// ReadEnviron reads the environment of the run in dir.
func ReadEnviron(dir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(dir, EnvironFile))
	return splitEnviron(data), err
}

// splitEnviron reads NUL-separated NAME=value entries, as in /proc/PID/environ.
func splitEnviron(data []byte) []string {
	var env []string
	for kv := range strings.SplitSeq(string(data), "\x00") {
		if kv != "" {
			env = append(env, kv)
		}
	}
	return env
}

// JoinEnviron writes env as an environ file holds it.
func JoinEnviron(env []string) []byte {
	var b []byte
	for _, kv := range env {
		b = append(append(b, kv...), 0)
	}
	return b
}

// stopOrphans ends what the command left running when it exited: processes it
// started in the background, in its process group or in a session of their own
// (setsid, a daemon's double fork). Their parents have ended, so they are the
// shim's children now (it is their subreaper). Each gets TERM, and KILL once grace
// has passed; their own children come to the shim in turn when they end.
func stopOrphans(grace time.Duration) {
	self := os.Getpid()
	killAt := time.Now().Add(grace)
	termed := map[int]bool{}
	for {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.ECHILD) {
				return // no child left
			}
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break // children left, none ended
			}
		}
		// A child is not reaped but here, so its PID cannot name another process
		// between this look and the signal.
		kill := !time.Now().Before(killAt)
		for _, pid := range childrenOf(self) {
			switch {
			case kill:
				_ = unix.Kill(pid, unix.SIGKILL)
			case !termed[pid]:
				_ = unix.Kill(pid, unix.SIGTERM)
				termed[pid] = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, _, err := procStat(child); err == nil && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// reap waits for every child, the command and the orphans reparented to the shim,
// and sends the command's status when it has ended.
func reap(pid int, exited chan<- syscall.WaitStatus) {
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || got == pid {
			exited <- ws
			return
		}
	}
}

// watchTimers waits for the command to end, stopping its process group when its
// deadline passes or it stalls, and says which did.
func (r Run) watchTimers(pgid int, exited <-chan syscall.WaitStatus) (string, syscall.WaitStatus) {
	var deadline <-chan time.Time
	if !r.Deadline.IsZero() {
		timer := time.NewTimer(time.Until(r.Deadline))
		defer timer.Stop()
		deadline = timer.C
	}
	var stallCheck <-chan time.Time
	if r.StallAfter > 0 {
		ticker := time.NewTicker(max(r.StallAfter/10, 50*time.Millisecond))
		defer ticker.Stop()
		stallCheck = ticker.C
	}
	lastSize, lastChange := outputSize(r.Dir), time.Now()
	stop := func(by string) (string, syscall.WaitStatus) {
		_ = unix.Kill(-pgid, unix.SIGTERM)
		select {
		case ws := <-exited:
			return by, ws
		case <-time.After(max(r.KillGrace, time.Second)):
		}
		_ = unix.Kill(-pgid, unix.SIGKILL)
		return by, <-exited
	}
	for {
		select {
		case ws := <-exited:
			return "", ws
		case <-deadline:
			return stop(StoppedByDeadline)
		case now := <-stallCheck:
			if size := outputSize(r.Dir); size != lastSize {
				lastSize, lastChange = size, now
			} else if now.Sub(lastChange) >= r.StallAfter {
				return stop(StoppedByStall)
			}
		}
	}
}

// outputSize is how much the command has written to its output files.
func outputSize(dir string) int64 {
	var n int64
	for _, name := range []string{StdoutFile, StderrFile} {
		if info, err := os.Stat(filepath.Join(dir, name)); err == nil {
			n += info.Size()
		}
	}
	return n
}

// SignalName is a signal's name without its SIG prefix: TERM, KILL.
func SignalName(sig syscall.Signal) string {
	if name, ok := strings.CutPrefix(unix.SignalName(sig), "SIG"); ok {
		return name
	}
	return strconv.Itoa(int(sig))
}
