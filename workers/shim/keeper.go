package shim

import (
	"errors"
	"slices"
	"sync"
	"syscall"
)

// keeper is what a shim keeps: its runs, from the start of each command to the
// end of what the command left behind. One goroutine works on it (serve), in a
// loop that sleeps until the worker hands a run, a child ends, a command's
// output changes or a run's next timer is due: a run costs the shim its entry
// here, a few descriptors and no goroutine. Two more goroutines only wait: one
// reaps children (reapChildren), one reads the runs the worker sends (receive),
// so that the loop never waits on the worker in the middle of a run's message
// while other runs' timers are due.
type keeper struct {
	self   ProcRef // the shim, as each run's pid.json names it
	worker bool    // the worker's end of EnvironFD is open: runs may come
	// runs are the runs whose commands run, by the command's PID.
	runs map[int]*running
	// leaving are the runs whose exits are written and whose commands left
	// processes that are being stopped; each holds its start lock until then.
	leaving []*running
	output  outputWatch
	wake    [2]int // a pipe, written to once a child is reaped or a run came
	reaped  reapedChildren
	inbox   inbox
}

// inbox passes the runs receive reads to serve.
type inbox struct {
	mu   sync.Mutex
	runs []receivedRun
	// over is set once no run comes any more: the worker closed its end, or
	// failed is why the shim takes no run more.
	over   bool
	failed error
}

type receivedRun struct {
	run  Run
	env  []string
	lock int
}

// reapedChildren pass the statuses of reaped children from reapChildren to
// serve. A child is reaped and its status listed under mu, which serve holds
// while it starts a command, and while it signals children by their PIDs: a
// PID taken by a command is not one whose old status waits unlisted, and a PID
// serve signals names the child it looked at.
type reapedChildren struct {
	mu   sync.Mutex
	list []reapedChild
	// started is sent to as a command starts: reapChildren, which found no child,
	// waits for one again.
	started chan struct{}
}

type reapedChild struct {
	pid int
	ws  syscall.WaitStatus
}

// running is a run whose command the shim started, until the end of what the
// command left.
type running struct {
	Run                // Dir, Deadline, StallAfter and KillGrace are used
	pid       int      // the command's, and its process group's
	startedAt int64    // Unix nanoseconds
	exit      exitFile // its reserved exit file
	lock      int      // the run's start lock
	marker    []byte   // RunEnv=NAME, as the command's environment has it
	// failed is why the command was stopped as soon as it started: its PIDs
	// could not be recorded. Its exit file says so, as a start error.
	failed string

	// Stopping the command: why (StoppedByDeadline or StoppedByStall; "" while
	// it runs on), and when (monotonic nanoseconds) TERM gives way to KILL.
	stoppedBy string
	killAt    int64
	killed    bool

	output  outputSeen
	stallAt int64 // the next look for a stall (monotonic nanoseconds); -1: none
	// outputKeep is how much of the end of each output file is kept
	// (OutputKeepBytes, bound.go); 0: the files are not bounded.
	outputKeep int64
	looked     outputLook // the last look at the output's bound
	// boundAt is when the next look at the output's bound is due (-1: once the
	// output changes, but not before boundNext).
	boundAt, boundNext int64
	watch              int // the output watch on the run's directory; -1: none

	sweepAt   int64 // leaving: when to look for what the command left again
	termed    bool  // leaving: what it left has had TERM
	groupGone bool  // leaving: its process group was found empty
}

// outputSeen is what the stall watch saw of the command's output: its size, and
// when (monotonic nanoseconds) that size was first seen.
type outputSeen struct{ size, since int64 }

// leftoverSweeps is how often the shim looks for what an ended command left until
// none is left; leftoversLimit bounds the hunt past the kill grace, so that a
// process that forks faster than it is killed does not hold its run for ever.
const (
	leftoverSweeps = 20e6
	leftoversLimit = 5e9
)

func newKeeper() (*keeper, error) {
	k := &keeper{worker: true, runs: map[int]*running{}, output: newOutputWatch()}
	k.reaped.started = make(chan struct{}, 1)
	if err := pipeCloexec(k.wake[:]); err != nil {
		return nil, errors.New("shim: pipe: " + err.Error())
	}
	_ = syscall.SetNonblock(k.wake[0], true)
	_ = syscall.SetNonblock(k.wake[1], true)
	start, _ := ProcStart(syscall.Getpid())
	k.self = ProcRef{PID: syscall.Getpid(), Start: start}
	go k.reapChildren()
	go k.receive()
	return k, nil
}

// serve keeps the runs until the worker is gone and the last is over. It returns
// why it took no run more, where that was no close of the worker's end: a run
// came in part (the worker died handing it over), or the socket failed.
func (k *keeper) serve() error {
	for k.worker || len(k.runs) > 0 || len(k.leaving) > 0 {
		ready := awaitReadable([]int{k.wake[0], k.output.fd}, k.nextDue())
		if ready[0] {
			drain(k.wake[0])
		}
		k.reaped.mu.Lock()
		reaped := k.reaped.take()
		k.reaped.mu.Unlock()
		k.takeReaped(reaped)
		if ready[1] {
			k.output.changed()
		}
		k.takeRuns()
		k.tick(monotonic(), wallClock())
	}
	return k.inbox.failed
}

// receive reads the runs the worker sends until it closes its end, or until a
// run cannot be read whole; the shim then takes no run more, and closes its end
// (EnvironFD becomes /dev/null), so that the worker, which waits for an answer
// to each run it sent, learns that none comes.
func (k *keeper) receive() {
	for {
		run, env, lock, err := receiveRun()
		k.inbox.mu.Lock()
		switch {
		case err != nil:
			k.inbox.over, k.inbox.failed = true, err
			nullify(EnvironFD)
		case run.Dir == "":
			k.inbox.over = true
		default:
			k.inbox.runs = append(k.inbox.runs, receivedRun{run, env, lock})
		}
		over := k.inbox.over
		k.inbox.mu.Unlock()
		_, _ = syscall.Write(k.wake[1], []byte{1})
		if over {
			return
		}
	}
}

// takeRuns starts the runs received, and notes that none comes any more.
func (k *keeper) takeRuns() {
	k.inbox.mu.Lock()
	runs, over := k.inbox.runs, k.inbox.over
	k.inbox.runs = nil
	k.inbox.mu.Unlock()
	for _, r := range runs {
		k.begin(r.run, r.env, r.lock)
	}
	if over {
		k.worker = false
	}
}

// reapChildren reaps every child of the shim, the commands and the orphans
// they left (the shim is their subreaper), and lists their statuses for serve.
func (k *keeper) reapChildren() {
	for {
		if !awaitChild() || !k.reapEnded() {
			<-k.reaped.started // no child: wait for one to start
		}
	}
}

// reapEnded reaps the children that have ended, lists their statuses and wakes
// serve if there were any; false once the shim has no child.
func (k *keeper) reapEnded() (children bool) {
	k.reaped.mu.Lock()
	had := len(k.reaped.list)
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			children = err == nil
			break
		}
		k.reaped.list = append(k.reaped.list, reapedChild{pid, ws})
	}
	reaped := len(k.reaped.list) > had
	k.reaped.mu.Unlock()
	if reaped {
		_, _ = syscall.Write(k.wake[1], []byte{1})
	}
	return children
}

// take returns the statuses listed since the last take; reaped.mu is held.
func (r *reapedChildren) take() []reapedChild {
	list := r.list
	r.list = nil
	return list
}

// begin starts the command of a run, records its PIDs, and says to the worker
// that the start is recorded (Recorded): the PIDs, or the start error in the
// exit file; or why nothing could be recorded (Failed).
func (k *keeper) begin(r Run, env []string, lock int) {
	answer := []byte{Recorded}
	defer func() { _ = writeAll(EnvironFD, answer) }()
	started := wallClock()
	exit := exitFile{dir: r.Dir, fd: -1} // reserved by start
	fail := func(err error) {
		if werr := exit.write(exitRecord{startError: err.Error(), startedAt: started, endedAt: wallClock()}); werr != nil {
			// Nothing was forked: the temp file left would mark a start, and a
			// worker that finds it would take the run for one whose shim died
			// starting its command, where it may start it again.
			_ = syscall.Unlink(join(r.Dir, ExitTempFile))
			why := err.Error() + "; and its record: " + werr.Error()
			answer = append(binary32(append(answer[:0], Failed), len(why)), why...)
		}
		exit.close()
		syscall.Close(lock)
	}
	// The statuses reaped before the start are taken first: a PID the command
	// takes may be that of a command just reaped, whose status must end its own
	// run. The command is in runs before serve takes its status.
	k.reaped.mu.Lock()
	k.takeReaped(k.reaped.take())
	pid, err := r.start(env, &exit)
	k.reaped.mu.Unlock()
	if err != nil {
		fail(err)
		return
	}
	select {
	case k.reaped.started <- struct{}{}:
	default:
	}
	if crash, _ := syscall.Getenv(CrashEnv); crash == CrashAfterStart {
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	c := &running{Run: r, pid: pid, startedAt: started, exit: exit, lock: lock, marker: markerOf(env), stallAt: -1, boundAt: -1, watch: -1}
	k.runs[pid] = c
	child, _ := ProcStart(pid)
	pids := pidsRecord{shim: k.self, command: ProcRef{PID: pid, Start: child}, startedAt: started}
	// Not made durable: after a crash of the host nothing it names is alive, and a
	// missing pid.json beside the exit's temp file says the same (the shim died).
	if err := writeFile(join(r.Dir, PIDFile), pids.appendJSON(nil), notDurable); err != nil {
		// Unwatchable: stop it rather than leave it running unknown.
		c.failed = "record the command's pid: " + err.Error()
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return
	}
	now := monotonic()
	c.output = outputSeen{r.outputSize(), now}
	if c.StallAfter > 0 {
		c.stallAt = now + c.stallCheck()
	}
	if canPunch {
		c.outputKeep, c.looked = OutputKeepBytes, outputLook{now, c.output.size}
		c.boundNext = now + boundPoll
		k.awaitOutput(c)
	}
}

// stallCheck is how often the output of a command that may stall is looked at.
func (c *running) stallCheck() int64 { return max(c.StallAfter/10, 50e6) }

// awaitOutput has the next look at a run's output bound come once its output
// changes, where the output watch can tell, else at boundNext.
func (k *keeper) awaitOutput(c *running) {
	if k.output.arm(c) {
		c.boundAt = -1
	} else {
		c.boundAt = c.boundNext
	}
}

// takeReaped ends the runs whose commands were reaped. The others reaped are
// orphans the commands left, which leave nothing to do.
func (k *keeper) takeReaped(list []reapedChild) {
	for _, child := range list {
		if c := k.runs[child.pid]; c != nil {
			delete(k.runs, child.pid)
			k.end(c, child.ws)
		}
	}
}

// end records how a run's command ended, and starts to stop what it left.
func (k *keeper) end(c *running, ws syscall.WaitStatus) {
	exit := exitOf(ws, c.stoppedBy, c.startedAt, wallClock())
	if c.failed != "" {
		exit = exitRecord{startError: c.failed, startedAt: c.startedAt, endedAt: exit.endedAt}
	}
	// A run whose directory is gone is one its worker let go of (a command left
	// running after its rule matched): no one reads its exit.
	var st syscall.Stat_t
	if err := c.exit.write(exit); err != nil && syscall.Stat(c.Dir, &st) == nil {
		say("shim: run " + c.Dir + ": " + err.Error())
	}
	c.exit.close()
	k.output.forget(c)
	// The exit is recorded: nothing waits for what the command left behind. Its
	// first sweep is due at once (sweepAt 0).
	c.killAt = monotonic() + max(c.KillGrace, 1e9)
	k.leaving = append(k.leaving, c)
}

// tick does what is due of each run's timers at the monotonic time now, the
// wall clock's time being wall.
func (k *keeper) tick(now, wall int64) {
	for _, c := range k.runs {
		c.tick(now, wall)
		if c.boundAt >= 0 && now >= c.boundAt {
			k.bound(c, now)
		}
	}
	k.leaving = slices.DeleteFunc(k.leaving, func(c *running) bool {
		if now < c.sweepAt {
			return false
		}
		if k.sweep(c, now) && now < c.killAt+leftoversLimit {
			c.sweepAt = now + leftoverSweeps
			return false
		}
		syscall.Close(c.lock) // the run is over: no shim works on it any more
		return true
	})
}

// tick stops the command where its deadline passed or it stalled, and kills it
// where it outlived TERM by its grace.
func (c *running) tick(now, wall int64) {
	if c.stoppedBy != "" {
		if !c.killed && now >= c.killAt {
			_ = syscall.Kill(-c.pid, syscall.SIGKILL)
			c.killed = true
		}
		return
	}
	if c.Deadline != 0 && wall >= c.Deadline {
		c.stop(StoppedByDeadline, now)
		return
	}
	if c.stallAt >= 0 && now >= c.stallAt {
		if size := c.outputSize(); size != c.output.size {
			c.output = outputSeen{size, now}
		} else if now-c.output.since >= c.StallAfter {
			c.stop(StoppedByStall, now)
			return
		}
		c.stallAt = now + c.stallCheck()
	}
}

// stop has the command's process group TERM, and KILL after its grace.
func (c *running) stop(by string, now int64) {
	_ = syscall.Kill(-c.pid, syscall.SIGTERM)
	c.stoppedBy, c.killAt = by, now+max(c.KillGrace, 1e9)
}

// nextDue is the earliest monotonic time at which a run's timer is due, or -1.
func (k *keeper) nextDue() int64 {
	now, wall := monotonic(), wallClock()
	due := int64(-1)
	for _, c := range k.runs {
		if c.stoppedBy != "" {
			if !c.killed {
				due = earliest(due, c.killAt)
			}
			continue
		}
		if c.Deadline != 0 {
			due = earliest(due, now+max(c.Deadline-wall, 0))
		}
		due = earliest(earliest(due, c.stallAt), c.boundAt)
	}
	for _, c := range k.leaving {
		due = earliest(due, c.sweepAt)
	}
	return due
}

// bound bounds a run's output, and says when to look again: once its output
// changes, or never where the file system cannot free part of a file.
func (k *keeper) bound(c *running, now int64) {
	c.boundNext = c.boundOutput(now)
	if c.boundNext < 0 {
		c.boundAt = -1
		return
	}
	k.awaitOutput(c)
}

// earliest is the earlier of two monotonic times, where -1 is none.
func earliest(a, b int64) int64 {
	if a < 0 || b >= 0 && b < a {
		return b
	}
	return a
}

// markerOf is the RunEnv entry of a command's environment, or nil.
func markerOf(env []string) []byte {
	for _, kv := range env {
		if len(kv) > len(RunEnv) && kv[:len(RunEnv)+1] == RunEnv+"=" {
			return []byte(kv)
		}
	}
	return nil
}

// drain reads a non-blocking pipe empty.
func drain(fd int) {
	var buf [64]byte
	for {
		if n, _ := syscall.Read(fd, buf[:]); n <= 0 {
			return
		}
	}
}

// binary32 appends n as 4 bytes, little-endian.
func binary32(b []byte, n int) []byte {
	return append(b, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
}

// say writes a line on the shim's stderr, which its worker logs.
func say(line string) { _ = writeAll(2, []byte(line+"\n")) }

// sweep signals what the command of an ended run left running, and says whether
// it found any: the members of its process group, and its orphans outside it
// where the shim is their subreaper (strays). They have TERM at the first sweep,
// KILL from the run's killAt on; between, they are only looked for.
func (k *keeper) sweep(c *running, now int64) bool {
	var sig syscall.Signal
	switch {
	case now >= c.killAt:
		sig = syscall.SIGKILL
	case !c.termed:
		sig = syscall.SIGTERM
	}
	c.termed = true
	found := false
	// A group's number is not reused while a member lives; once the group is
	// found empty, it is not signalled again, as its number may come to name
	// another group.
	if !c.groupGone {
		c.groupGone = k.runs[c.pid] != nil || syscall.Kill(-c.pid, sig) != nil
		found = !c.groupGone
	}
	k.reaped.mu.Lock() // no child is reaped between its look and its signal
	defer k.reaped.mu.Unlock()
	for _, pid := range k.strays(c.marker) {
		if syscall.Kill(pid, sig) == nil {
			found = true
		}
	}
	return found
}
