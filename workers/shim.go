package workers

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// The shim is the command's real parent. The worker starts it (its own binary in
// shim mode) in a new session, so it outlives the worker: a worker that stops, is
// killed or upgraded leaves its commands running. The shim starts the command in
// its own process group with stdout and stderr going straight to files (nothing
// copies them, so nothing can block the command), reaps it, and writes the exit
// file atomically. Everything it knows is in its run directory:
//
//	run.json    what to start (written by the worker)
//	stdout      the command's output
//	stderr
//	start.lock  locked for as long as a shim of the run lives (see startLockFD)
//	starting    made just before the shim starts the command
//	pid.json    the command's and the shim's PIDs with their start times
//	exit.json   how the command ended (or why it could not start)
const (
	runFile       = "run.json"
	startLockFile = "start.lock"
	startingFile  = "starting"
	pidFile       = "pid.json"
	exitFile      = "exit.json"
	stdoutFile    = "stdout"
	stderrFile    = "stderr"
)

// startLockFD is the descriptor of the run's start lock in a shim. The worker locks
// the file (flock) before it starts the shim and hands the locked descriptor down,
// and each stage of the shim keeps it open for as long as it lives: whoever finds
// the lock free knows that no shim of the run is alive, or ever will be, so a worker
// that died while its shim started can tell a shim still starting from one gone.
const startLockFD = 3

// shimRun is what the shim starts.
type shimRun struct {
	TaskID string   `json:"task_id"`
	Epoch  uint64   `json:"epoch"`
	Path   string   `json:"path"`
	Args   []string `json:"args"`
	Env    []string `json:"env"`
	Dir    string   `json:"dir"`
	// LogOffsets is where the task's log streams stood when this run started.
	LogOffsets [2]int64 `json:"log_offsets"`
	// The timers the shim enforces itself, so they hold while no worker watches:
	// the deadline, and a stall that the spec says to kill on.
	Deadline   time.Time     `json:"deadline,omitempty"`
	StallAfter time.Duration `json:"stall_after,omitempty"`
	KillGrace  time.Duration `json:"kill_grace,omitempty"`
}

// procRef names a process for as long as it lives: a PID alone may be reused.
type procRef struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // clock ticks after boot, from /proc/PID/stat
}

type shimPIDs struct {
	Shim    procRef   `json:"shim"`
	Command procRef   `json:"command"`
	Started time.Time `json:"started_at"`
}

type shimExit struct {
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	StoppedBy  string    `json:"stopped_by,omitempty"` // deadline or stall, when the shim stopped it
	StartedAt  time.Time `json:"started_at"`
	EndedAt    time.Time `json:"ended_at"`
	StartError string    `json:"start_error,omitempty"`
}

// shimDetachedEnv marks the second start of a shim: the first only starts it again
// and exits, so the shim is no child of the worker (the worker keeps no process to
// reap, and the shim belongs to no process that may go away).
const shimDetachedEnv = "BGTASK_SHIM_DETACHED"

// RunShim is the shim: `bgtask shim DIR`. It returns when the command has ended
// and its exit file is written.
func RunShim(dir string) error {
	if os.Getenv(shimDetachedEnv) == "" {
		files := []*os.File{nil, nil, nil}
		if _, err := unix.FcntlInt(startLockFD, unix.F_GETFD, 0); err == nil {
			files = append(files, os.NewFile(startLockFD, startLockFile)) // the lock, handed down
		}
		// /proc/self/exe is this very binary, even if an upgrade replaced its file.
		_, err := os.StartProcess("/proc/self/exe", os.Args, &os.ProcAttr{
			Env:   append(os.Environ(), shimDetachedEnv+"=1"),
			Files: files,
			Sys:   &syscall.SysProcAttr{Setsid: true},
		})
		return err
	}
	// The start lock (descriptor startLockFD, if the worker handed one down) stays
	// open until this process ends; CloseRange below keeps it from the command.
	// Orphans of the command become the shim's children, not init's, so the whole
	// tree stays under it.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	var run shimRun
	if err := readJSON(filepath.Join(dir, runFile), &run); err != nil {
		return err
	}
	started := time.Now().UTC()
	fail := func(err error) error {
		return writeJSONAtomic(filepath.Join(dir, exitFile), shimExit{StartError: err.Error(), StartedAt: started, EndedAt: time.Now().UTC()})
	}
	stdout, err := os.OpenFile(filepath.Join(dir, stdoutFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	stderr, err := os.OpenFile(filepath.Join(dir, stderrFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
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
	if err := os.WriteFile(filepath.Join(dir, startingFile), nil, 0o600); err != nil {
		return fail(err)
	}
	// The command dies with the shim (Pdeathsig), so it never runs on unrecorded if
	// the shim is killed before it wrote pid.json. The signal follows the thread that
	// started it: this goroutine keeps that thread until the shim ends.
	runtime.LockOSThread()
	proc, err := os.StartProcess(run.Path, run.Args, &os.ProcAttr{
		Dir:   run.Dir,
		Env:   run.Env,
		Files: []*os.File{devnull, stdout, stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	devnull.Close()
	stdout.Close()
	stderr.Close()
	if err != nil {
		return fail(err)
	}
	engine.CrashPoint(engine.CrashShimAfterStart)
	self, _ := procStart(os.Getpid())
	child, _ := procStart(proc.Pid)
	if err := writeJSONAtomic(filepath.Join(dir, pidFile), shimPIDs{
		Shim:    procRef{PID: os.Getpid(), Start: self},
		Command: procRef{PID: proc.Pid, Start: child},
		Started: started,
	}); err != nil {
		// Unwatchable: stop it rather than leave it running unknown.
		_ = unix.Kill(-proc.Pid, unix.SIGKILL)
		_, _ = proc.Wait()
		return fail(fmt.Errorf("record the command's pid: %w", err))
	}
	exited := make(chan syscall.WaitStatus, 1)
	go reap(proc.Pid, exited)
	stoppedBy, ws := watchTimers(dir, run, proc.Pid, exited)
	exit := shimExit{ExitCode: ws.ExitStatus(), StoppedBy: stoppedBy, StartedAt: started, EndedAt: time.Now().UTC()}
	if ws.Signaled() {
		exit.ExitCode, exit.Signal = 128+int(ws.Signal()), signalName(ws.Signal())
	}
	err = writeJSONAtomic(filepath.Join(dir, exitFile), exit)
	// The exit is recorded: nothing waits for what the command left behind.
	stopOrphans(max(run.KillGrace, time.Second))
	return err
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
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		i := strings.LastIndexByte(string(data), ')')
		if fields := strings.Fields(string(data[i+1:])); i >= 0 && len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
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
// deadline passes or it stalls (when the spec says kill), and says which did.
func watchTimers(dir string, run shimRun, pgid int, exited <-chan syscall.WaitStatus) (string, syscall.WaitStatus) {
	var deadline <-chan time.Time
	if !run.Deadline.IsZero() {
		timer := time.NewTimer(time.Until(run.Deadline))
		defer timer.Stop()
		deadline = timer.C
	}
	var stallCheck <-chan time.Time
	if run.StallAfter > 0 {
		ticker := time.NewTicker(max(run.StallAfter/10, 50*time.Millisecond))
		defer ticker.Stop()
		stallCheck = ticker.C
	}
	lastSize, lastChange := outputSize(dir), time.Now()
	stop := func(by string) (string, syscall.WaitStatus) {
		_ = unix.Kill(-pgid, unix.SIGTERM)
		select {
		case ws := <-exited:
			return by, ws
		case <-time.After(max(run.KillGrace, time.Second)):
		}
		_ = unix.Kill(-pgid, unix.SIGKILL)
		return by, <-exited
	}
	for {
		select {
		case ws := <-exited:
			return "", ws
		case <-deadline:
			return stop(events.StoppedByDeadline)
		case now := <-stallCheck:
			if size := outputSize(dir); size != lastSize {
				lastSize, lastChange = size, now
			} else if now.Sub(lastChange) >= run.StallAfter {
				return stop(events.StoppedByStall)
			}
		}
	}
}

// outputSize is how much the command has written to its output files.
func outputSize(dir string) int64 {
	var n int64
	for _, name := range []string{stdoutFile, stderrFile} {
		if info, err := os.Stat(filepath.Join(dir, name)); err == nil {
			n += info.Size()
		}
	}
	return n
}

// procStart reads a process's start time, which with its PID names it uniquely.
func procStart(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// procStat reads a process's state letter and start time from /proc/PID/stat.
func procStat(pid int) (state string, start uint64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	// pid (comm) state ...: comm may hold spaces; field 22 is the start time.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return "", 0, errors.New("unreadable /proc stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return "", 0, errors.New("unreadable /proc stat")
	}
	start, err = strconv.ParseUint(fields[19], 10, 64)
	return fields[0], start, err
}

// alive reports whether the process ref names is still running (a zombie is not).
func (r procRef) alive() bool {
	if r.PID <= 0 {
		return false
	}
	state, start, err := procStat(r.PID)
	return err == nil && start == r.Start && state != "Z"
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// writeJSONAtomic writes a file so that a reader sees all of it or none: a temp
// file, fsync, rename, fsync of the directory.
func writeJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
