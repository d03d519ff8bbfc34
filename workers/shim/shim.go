// Package shim is the command's real parent. Each run has a shim of its own, in
// a new session, so it outlives the worker: a worker that stops, is killed or
// upgraded leaves its commands running. The shim starts the command in its own
// process group with stdout and stderr going straight to files (nothing copies
// them, so nothing can block the command), enforces the deadline and the stall
// kill, keeps the output files within their bound on disk (bound.go), reaps the
// command, and writes the exit file atomically. Everything it
// knows is in its arguments and its run directory, whose files are named below.
// Who writes each of them, when, and what a reader may take from it is told in
// one place, at the top of workers/rundir.go.
//
// The worker starts the shim directly in a new session and reaps it when it ends.
// One shim lives per running task, so its size is what a running task costs; it
// starts with a task unless one whose run is over takes the task (receiveRun), so
// its start is part of many tasks' starts: the package
// calls the kernel through package syscall alone, without os, time, strconv or
// the reflection-based packages: a Go program's text is resident whole in each of
// its processes here, and those packages would add about a quarter to a shim's RSS
// and to the time a short command takes under it.
// It runs as its own small binary, bgtask-shim, or as `bgtask shim` where that is
// missing. A shim whose command runs long hibernates (hibernate.go): it becomes a
// waiter in C, which holds a tenth of a Go shim's memory, until the command ends.
package shim

import (
	"errors"
	"sync"
	"syscall"
)

// The files of a run directory the shim reads or writes.
const (
	StdoutFile   = "stdout"
	StderrFile   = "stderr"
	StartingFile = "starting"
	PIDFile      = "pid.json"
	ExitFile     = "exit.json"
)

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

// Main runs a shim with its arguments: --idle-ns=N at most. It reads its runs on
// its standard input (receiveRun), one at a time, and returns when a run's
// command has ended and its exit file is written, and no other run came within
// the idle time. Meanwhile, once a command's start is recorded (its PIDs, or its
// start error), it lets go of its stdout and stderr: the worker that started it
// reads them until then. A shim that hibernated comes back with --woken (hibernate.go).
func Main(args []string) error {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		return writeAll(1, []byte("usage: "+usage))
	}
	if len(args) == 1 && args[0] == "--protocol" {
		return writeAll(1, []byte(Protocol+"\n"))
	}
	if len(args) > 0 && args[0] == wokenFlag {
		c, ended, err := parseWoken(args[1:])
		if err != nil {
			return err
		}
		c.args = len(args)
		if more, err := runOver(c.lock, c.resume(ended), c.idleAfter); !more {
			return err
		}
		return serve(len(args), c.idleAfter, monotonic()+c.idleAfter)
	}
	idleAfter, err := parseIdle(args)
	if err != nil {
		return err
	}
	return serve(len(args), idleAfter, -1)
}

// serve takes runs until none comes by the monotonic time until (-1: for ever),
// then in idleAfter after each run. args is how many arguments the shim has.
func serve(args int, idleAfter, until int64) error {
	// A run comes whole, or the worker that started this shim died handing it over:
	// then nothing is recorded and no command starts, and the run is one whose shim
	// never started, which the worker starts at its next start (in the same boot of
	// the host).
	for ; ; until = monotonic() + idleAfter {
		run, env, lock, err := receiveRun(until)
		if err != nil || run.Dir == "" {
			return err
		}
		if more, err := runOver(lock, run.supervise(env, running{lock: lock, idleAfter: idleAfter, args: args}), idleAfter); !more {
			return err
		}
	}
}

// runOver ends a run whose exit is written (or failed to be, err): it lets go of
// its start lock and, where the shim waits for another run, says so to the
// worker. It says whether the shim waits.
func runOver(lock int, err error, idleAfter int64) (bool, error) {
	syscall.Close(lock) // no shim works on the run any more
	if err != nil || idleAfter <= 0 || writeAll(EnvironFD, []byte{Idle}) != nil {
		return false, err
	}
	return true, nil
}

// running is a run whose command has started: what the shim needs until its end
// is recorded, all of which a hibernation carries to the shim that wakes.
type running struct {
	Run                // Dir, Deadline, StallAfter and KillGrace are used
	pid       int      // the command's, and its process group's
	startedAt int64    // Unix nanoseconds
	exit      exitFile // its reserved exit file
	lock      int      // the run's start lock
	idleAfter int64    // the shim's --idle-ns
	args      int      // how many of the shim's command line are its own arguments
	output    outputSeen
	// outputKeep is how much of the end of each output file is kept
	// (OutputKeepBytes, bound.go); 0: the files are not bounded.
	outputKeep int64
	looked     outputLook // the last look at the output's bound
}

// outputSeen is what the stall watch saw of the command's output: its size, and
// when (monotonic nanoseconds) that size was first seen.
type outputSeen struct{ size, since int64 }

// supervise runs the command to its end, c holding what the shim has for it. The
// worker started the shim in a session of its own, so that the shim outlives
// the worker and no signal to the worker's process group reaches it.
func (r Run) supervise(env []string, c running) error {
	adoptOrphans()
	started := wallClock()
	// The exit file's blocks are taken now, before anything runs: a disk that
	// fills while the command runs must not lose how it ended.
	exitFile, reserveErr := reserveExit(r.Dir)
	defer exitFile.close()
	// A start that failed is recorded in the exit file; if even that fails, the
	// error goes to the worker on the shim's stderr, which it still reads.
	fail := func(err error) error {
		if werr := exitFile.write(exitRecord{startError: err.Error(), startedAt: started, endedAt: wallClock()}); werr != nil {
			return errors.New(err.Error() + "; and its record: " + werr.Error())
		}
		releaseOutput()
		return nil
	}
	if reserveErr != nil {
		return fail(errors.New("reserve the exit file, so that a full disk cannot lose the command's exit: " + reserveErr.Error()))
	}
	// Descriptors the worker inherited (a pipe its caller reads) must not reach a
	// command that outlives it: its reader would never see EOF.
	KeepInherited()
	reap, err := newReaper()
	if err != nil {
		return fail(err)
	}
	defer reap.close()
	pid, err := r.start(env)
	if err != nil {
		return fail(err)
	}
	if crash, _ := syscall.Getenv(CrashEnv); crash == CrashAfterStart {
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	self, _ := ProcStart(syscall.Getpid())
	child, _ := ProcStart(pid)
	pids := pidsRecord{shim: ProcRef{PID: syscall.Getpid(), Start: self}, command: ProcRef{PID: pid, Start: child}, startedAt: started}
	go reap.wait(pid)
	// Not made durable: after a crash of the host nothing it names is alive, and a
	// missing pid.json beside the starting file says the same (the shim died).
	if err := writeFile(join(r.Dir, PIDFile), pids.appendJSON(nil), notDurable); err != nil {
		// Unwatchable: stop it rather than leave it running unknown.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-reap.exited
		return fail(errors.New("record the command's pid: " + err.Error()))
	}
	releaseOutput()
	c.Run, c.pid, c.startedAt, c.exit = r, pid, started, exitFile
	c.output = outputSeen{r.outputSize(), monotonic()}
	if canPunch {
		c.outputKeep, c.looked = OutputKeepBytes, outputLook{c.output.since, c.output.size}
	}
	return c.end(c.watch(reap))
}

// end records how the command ended and stops what it left.
func (c running) end(stoppedBy string, ws syscall.WaitStatus) error {
	err := c.exit.write(exitOf(ws, stoppedBy, c.startedAt, wallClock()))
	// The exit is recorded: nothing waits for what the command left behind.
	stopLeftovers(c.pid, max(c.KillGrace, 1e9))
	return err
}

// start starts the command with its stdin on /dev/null and its output appended
// to the run's files.
func (r Run) start(env []string) (pid int, err error) {
	var files [3]int // stdin, stdout, stderr
	for i, f := range []struct {
		path  string
		flags int
	}{
		{"/dev/null", syscall.O_RDONLY},
		{join(r.Dir, StdoutFile), syscall.O_WRONLY | syscall.O_CREAT | syscall.O_APPEND},
		{join(r.Dir, StderrFile), syscall.O_WRONLY | syscall.O_CREAT | syscall.O_APPEND},
	} {
		if files[i], err = open(f.path, f.flags, 0o600); err != nil {
			return 0, err
		}
		defer syscall.Close(files[i])
	}
	// From here on the command may be running before its PIDs are recorded: a worker
	// that finds this file and no pid.json knows the shim died starting it.
	starting, err := open(join(r.Dir, StartingFile), syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	syscall.Close(starting)
	pid, err = syscall.ForkExec(r.Path, r.Args, &syscall.ProcAttr{
		Dir:   r.Cwd,
		Env:   env,
		Files: []uintptr{uintptr(files[0]), uintptr(files[1]), uintptr(files[2])},
		Sys:   commandAttr(),
	})
	if err != nil {
		return 0, &fileError{"fork/exec", r.Path, err}
	}
	return pid, nil
}

// exitReserveBytes is the room the exit file is given before the command starts:
// a record is a few hundred bytes, a start error with a long path a few more.
const exitReserveBytes = 4 << 10

// exitFile is the exit file of a run, to be: its temp file, made with its blocks
// allocated before the command starts, which the record overwrites and which is
// then renamed into place. Neither needs a block more, so a full disk loses no exit.
type exitFile struct {
	dir string
	fd  int // -1: not reserved; the record is written as any file
}

// reserveExit makes the exit file's temp file in dir with exitReserveBytes of it
// allocated. If that fails, the exitFile it returns still writes the record as a
// file of its own, where the disk has room.
func reserveExit(dir string) (exitFile, error) {
	e := exitFile{dir: dir, fd: -1}
	tmp := join(dir, ExitFile) + ".tmp"
	fd, err := open(tmp, syscall.O_RDWR|syscall.O_CREAT|syscall.O_TRUNC, 0o600)
	if err != nil {
		return e, err
	}
	err = allocate(fd, exitReserveBytes)
	if err == syscall.EOPNOTSUPP {
		// A file system (or system) without fallocate allocates the blocks written.
		err = writeAll(fd, make([]byte, exitReserveBytes))
	}
	if err != nil {
		syscall.Close(fd)
		return e, &fileError{"allocate", tmp, err}
	}
	e.fd = fd
	return e, nil
}

// write writes the exit file, whole. The exit code is what the caller waits
// for, and it must outlive a crash of the host before it is in the log: where
// no worker watches the run, the file is made durable; where one does, the
// worker records the exit as soon as it reads it, and makes the file durable
// itself if the log cannot take the exit at once (KeepExit). The worker may
// read it before it is on disk: a crash of the host in the meantime may leave a
// file it cannot read, which it takes for none, as after a crash before the
// write: the task is lost either way.
func (e exitFile) write(exit exitRecord) error {
	path := join(e.dir, ExitFile)
	durable := !watched(e.dir)
	if e.fd < 0 {
		mode := notDurable
		if durable {
			mode = syncAfterRename
		}
		return writeFile(path, exit.appendJSON(nil), mode)
	}
	tmp := path + ".tmp"
	if err := overwrite(e.fd, tmp, exit.appendJSON(nil)); err != nil {
		return err
	}
	if err := syscall.Rename(tmp, path); err != nil {
		return &fileError{"rename", tmp, err}
	}
	if !durable {
		return nil
	}
	if err := syscall.Fsync(e.fd); err != nil {
		return &fileError{"sync", path, err}
	}
	_ = SyncDir(e.dir)
	return nil
}

// overwrite makes the file fd (at path) hold data: written over the blocks the
// file has and cut to its length, it takes no block more.
func overwrite(fd int, path string, data []byte) error {
	for off := 0; off < len(data); {
		n, err := syscall.Pwrite(fd, data[off:], int64(off))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &fileError{"write", path, err}
		}
		off += n
	}
	if err := syscall.Ftruncate(fd, int64(len(data))); err != nil {
		return &fileError{"truncate", path, err}
	}
	return nil
}

func (e exitFile) close() {
	if e.fd >= 0 {
		syscall.Close(e.fd)
	}
}

// releaseOutput tells the worker that the command's start is recorded: it points
// the shim's stdout and stderr, a pipe the worker reads until it closes, at
// /dev/null, and says so on EnvironFD, a socket (receiveRun).
func releaseOutput() {
	if devnull, err := open("/dev/null", syscall.O_WRONLY, 0); err == nil {
		_ = dup(devnull, 1)
		_ = dup(devnull, 2)
		syscall.Close(devnull)
	}
	_ = writeAll(EnvironFD, []byte{Recorded})
}

// reaper waits for every child, the command and the orphans reparented to the
// shim, and passes on the command's status when it ends.
type reaper struct {
	// mu is held while a child is reaped, and by a hibernation from its last look
	// at ended to its exec: a status reaped is passed on before any exec.
	mu     sync.Mutex
	ended  [2]int // a pipe, written once the command's status is on exited
	exited chan syscall.WaitStatus
}

func newReaper() (*reaper, error) {
	r := &reaper{exited: make(chan syscall.WaitStatus, 1)}
	if err := pipeCloexec(r.ended[:]); err != nil {
		return nil, errors.New("pipe: " + err.Error())
	}
	return r, nil
}

func (r *reaper) close() {
	syscall.Close(r.ended[0])
	syscall.Close(r.ended[1])
}

// wait reaps children until the command (pid) has ended.
func (r *reaper) wait(pid int) {
	for {
		awaitChild()
		r.mu.Lock()
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, reapFlags, nil)
		if err != syscall.EINTR && (err != nil || got == pid) {
			// The wake-up first: once the status is received, ended may be closed.
			_ = writeAll(r.ended[1], []byte{1})
			r.exited <- ws
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// hibernateAfter is how long a command runs under a Go shim before the shim
// hibernates: a short task keeps its shim, which may take the worker's next run.
const hibernateAfter = 1e9

// watch waits for the command to end, stopping its process group when its
// deadline passes or it stalls, and says which did. Meanwhile it keeps the output
// files within their bound (bound.go). A shim that can hibernates once the
// command has run hibernateAfter.
func (c *running) watch(reap *reaper) (string, syscall.WaitStatus) {
	stallCheck := int64(-1)
	if c.StallAfter > 0 {
		stallCheck = max(c.StallAfter/10, 50e6)
	}
	hibernateAt, boundAt := int64(-1), int64(-1)
	if hibernation {
		hibernateAt = monotonic() + hibernateAfter
	}
	if c.outputKeep > 0 {
		boundAt = c.looked.at + boundPoll
	}
	stop := func(by string) (string, syscall.WaitStatus) {
		_ = syscall.Kill(-c.pid, syscall.SIGTERM)
		if !awaitReadable(reap.ended[0], monotonic()+max(c.KillGrace, 1e9)) {
			_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		}
		return by, <-reap.exited
	}
	for {
		until := earliest(hibernateAt, boundAt)
		if c.Deadline != 0 {
			left := c.Deadline - wallClock()
			if left <= 0 {
				return stop(StoppedByDeadline)
			}
			until = earliest(until, monotonic()+left)
		}
		if stallCheck > 0 {
			until = earliest(until, monotonic()+stallCheck)
		}
		if awaitReadable(reap.ended[0], until) {
			return "", <-reap.exited
		}
		now := monotonic()
		if c.StallAfter > 0 {
			if size := c.outputSize(); size != c.output.size {
				c.output = outputSeen{size, now}
			} else if now-c.output.since >= c.StallAfter {
				return stop(StoppedByStall)
			}
		}
		if boundAt >= 0 && now >= boundAt {
			boundAt = c.boundOutput(now)
		}
		if hibernateAt >= 0 && now >= hibernateAt {
			c.hibernate(reap) // returns if it did not
			hibernateAt = -1
		}
	}
}

// earliest is the earlier of two monotonic times, where -1 is none.
func earliest(a, b int64) int64 {
	if a < 0 || b >= 0 && b < a {
		return b
	}
	return a
}

// outputSize is how much the command has written to its output files.
func (r Run) outputSize() int64 {
	return fileSize(join(r.Dir, StdoutFile)) + fileSize(join(r.Dir, StderrFile))
}
