//go:build linux && !bgtask_portable

package workers

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers/shim"
)

// newTestNotifier returns a notifier whose waiters never poll in a test's time:
// what wakes them is an event, or nothing.
func newTestNotifier(t *testing.T) *notifier {
	t.Helper()
	n := newNotifier(slog.New(slog.DiscardHandler))
	if n.closed {
		t.Fatal("no inotify instance")
	}
	n.safety, n.unwatched = time.Hour, 2*time.Hour
	t.Cleanup(n.close)
	return n
}

// testWaiter is a waiter whose calls of its look land in wake, which holds one.
type testWaiter struct {
	*waiter
	wake chan struct{}
}

// watchRecords is n.watch, for a test.
func watchRecords(n *notifier, dir string, names ...string) testWaiter {
	wake := make(chan struct{}, 1)
	return testWaiter{n.watch(wakeInto(wake), dir, names...), wake}
}

// watchGrowing is n.watchGrowth, for a test.
func watchGrowing(n *notifier, paths ...string) testWaiter {
	wake := make(chan struct{}, 1)
	return testWaiter{n.watchGrowth(wakeInto(wake), paths...), wake}
}

func wakeInto(wake chan struct{}) func() {
	return func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// woken waits for a waiter's call itself, which only an event or the end of its
// watch gives, never a poll.
func woken(t *testing.T, w testWaiter, what string) {
	t.Helper()
	select {
	case <-w.wake:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no wake-up", what)
	}
}

// kernelWatches counts the watches the kernel holds for the notifier's instance.
func kernelWatches(t *testing.T, n *notifier) int {
	t.Helper()
	f, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(n.fd))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	count := 0
	for lines := bufio.NewScanner(f); lines.Scan(); {
		if strings.HasPrefix(lines.Text(), "inotify wd:") {
			count++
		}
	}
	return count
}

func appendTo(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

// renameInto makes a file appear in dir by rename, as the shim's records do,
// without their fsyncs.
func renameInto(t *testing.T, dir, name string) {
	t.Helper()
	tmp := filepath.Join(dir, name+".tmp")
	if err := os.WriteFile(tmp, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func TestNotifierWakesForItsRecords(t *testing.T) {
	n := newTestNotifier(t)
	dir := t.TempDir()
	exit, pids := watchRecords(n, dir, shim.ExitFile), watchRecords(n, dir, shim.PIDFile)
	defer exit.close()
	defer pids.close()

	// The shim's way: a temporary file, then a rename. The temporary file's own
	// events are not the exit file's.
	if err := writeJSONAtomic(filepath.Join(dir, shim.ExitFile), shimExit{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	woken(t, exit, "exit file renamed into the directory")
	if len(pids.wake) != 0 {
		t.Fatal("the exit file woke the waiter of pid.json")
	}
	renameInto(t, dir, shim.PIDFile)
	woken(t, pids, "pid.json renamed into the directory")
	if len(exit.wake) != 0 {
		t.Fatal("pid.json woke the waiter of the exit file")
	}
}

func TestNotifierWakesAGrowthWaiterOncePerArm(t *testing.T) {
	n := newTestNotifier(t)
	dir := t.TempDir()
	path := filepath.Join(dir, shim.StdoutFile)
	appendTo(t, path, "")
	// A record waiter in the same directory: once it is woken, every event queued
	// before its record has been dispatched.
	barrier := watchRecords(n, dir, shim.ExitFile)
	defer barrier.close()
	grown := watchGrowing(n, path)
	defer grown.close()

	appendTo(t, path, "before the arm\n")
	grown.arm()
	if got := kernelWatches(t, n); got != 2 {
		t.Fatalf("%d kernel watches, want the directory's and the armed file's", got)
	}
	for range 100 {
		appendTo(t, path, "chatty\n")
	}
	woken(t, grown, "file written after the arm")
	if got := kernelWatches(t, n); got != 1 {
		t.Fatalf("%d kernel watches once the file's fired, want only the directory's", got)
	}
	renameInto(t, dir, shim.ExitFile)
	woken(t, barrier, "barrier")
	if len(grown.wake) != 0 {
		t.Fatal("writes after the first woke the waiter again: one event per write")
	}

	appendTo(t, path, "unarmed\n")
	renameInto(t, dir, shim.ExitFile)
	woken(t, barrier, "barrier")
	if len(grown.wake) != 0 {
		t.Fatal("a write woke a waiter that was not armed again")
	}
	grown.arm()
	appendTo(t, path, "armed again\n")
	woken(t, grown, "file written after the arm again")
}

func TestNotifierSharesOneWatchPerDirectory(t *testing.T) {
	n := newTestNotifier(t)
	const dirs = 1000 // as many runs as a worker may have
	var paths []string
	var exits, pids []testWaiter
	for i := range dirs {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, dir)
		exits = append(exits, watchRecords(n, dir, shim.ExitFile))
		pids = append(pids, watchRecords(n, dir, shim.PIDFile))
	}
	if got := kernelWatches(t, n); got != dirs {
		t.Fatalf("%d kernel watches for %d directories, want one each", got, dirs)
	}
	for _, dir := range paths {
		renameInto(t, dir, shim.ExitFile)
	}
	for i, w := range exits {
		woken(t, w, fmt.Sprintf("directory %d", i))
	}
	for _, w := range exits {
		w.close()
	}
	if got := kernelWatches(t, n); got != dirs {
		t.Fatalf("%d kernel watches once a waiter of each directory left, want %d", got, dirs)
	}
	for _, w := range pids {
		w.close()
	}
	if got := kernelWatches(t, n); got != 0 || len(n.watches) != 0 {
		t.Fatalf("%d kernel watches, %d known once every waiter left, want none", got, len(n.watches))
	}
}

func TestNotifierForgetsARemovedDirectory(t *testing.T) {
	n := newTestNotifier(t)
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w := watchRecords(n, dir, shim.ExitFile)
	defer w.close()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	woken(t, w, "directory removed")
	if got := w.pollEvery(); got != n.unwatched {
		t.Fatalf("a waiter on a removed directory looks every %s, want %s", got, n.unwatched)
	}
	if got := kernelWatches(t, n); got != 0 {
		t.Fatalf("%d kernel watches after the directory went, want 0", got)
	}
}

func TestNotifierOverflowWakesEveryWaiter(t *testing.T) {
	n := newTestNotifier(t)
	var waiters []testWaiter
	for range 3 {
		w := watchRecords(n, t.TempDir(), shim.ExitFile)
		defer w.close()
		waiters = append(waiters, w)
	}
	// What the kernel queues when it dropped events: wd -1, IN_Q_OVERFLOW, no name.
	overflow := make([]byte, unix.SizeofInotifyEvent)
	binary.NativeEndian.PutUint32(overflow[0:], ^uint32(0))
	binary.NativeEndian.PutUint32(overflow[4:], unix.IN_Q_OVERFLOW)
	n.dispatch(overflow)
	for i, w := range waiters {
		woken(t, w, fmt.Sprintf("waiter %d after an overflow", i))
	}
}

func TestNotifierCloseTurnsWaitersToPolling(t *testing.T) {
	n := newNotifier(slog.New(slog.DiscardHandler))
	w := watchRecords(n, t.TempDir(), shim.ExitFile)
	n.close()
	if target, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(n.fd)); target == "anon_inode:inotify" {
		t.Fatal("the inotify instance is still open")
	}
	woken(t, w, "notifier closed")
	if got := w.pollEvery(); got != unwatchedPoll {
		t.Fatalf("a waiter of a closed notifier looks every %s, want %s", got, unwatchedPoll)
	}
	w.close()
	late := watchRecords(n, t.TempDir(), shim.ExitFile)
	defer late.close()
	if got := late.pollEvery(); got != unwatchedPoll {
		t.Fatalf("a waiter made after close looks every %s, want %s", got, unwatchedPoll)
	}
}

// startSleep starts a process that lives until killed, and its reference.
func startSleep(t *testing.T) (*exec.Cmd, shim.ProcRef) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	start, err := shim.ProcStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, shim.ProcRef{PID: cmd.Process.Pid, Start: start}
}

func TestWaiterWakesWhenItsProcessEnds(t *testing.T) {
	n := newTestNotifier(t)
	cmd, ref := startSleep(t)
	w := watchRecords(n, t.TempDir(), shim.ExitFile)
	defer w.close()
	w.watchProcess(ref)
	if len(w.wake) != 0 {
		t.Fatal("woken while the process runs")
	}
	_ = cmd.Process.Kill() // not reaped: a zombie has ended too
	woken(t, w, "process killed")

	reused := watchRecords(n, t.TempDir(), shim.ExitFile)
	defer reused.close()
	_, other := startSleep(t)
	other.Start++ // the PID, but another process than the one meant
	reused.watchProcess(other)
	woken(t, reused, "PID naming another process")
}

// A worker waits for the ends of all its processes in one goroutine, and each
// end wakes its own watch alone.
func TestProcessEndsShareOneGoroutine(t *testing.T) {
	n := newTestNotifier(t)
	const procs = 20
	cmds, waiters := make([]*exec.Cmd, procs), make([]testWaiter, procs)
	dir := t.TempDir()
	before := runtime.NumGoroutine()
	for i := range procs {
		var ref shim.ProcRef
		cmds[i], ref = startSleep(t)
		waiters[i] = watchRecords(n, dir, shim.ExitFile)
		defer waiters[i].close()
		waiters[i].watchProcess(ref)
	}
	if g := runtime.NumGoroutine() - before; g > 1 {
		t.Fatalf("%d goroutines wait for %d processes, want one", g, procs)
	}
	for i := procs - 1; i >= 0; i-- {
		_ = cmds[i].Process.Kill()
		woken(t, waiters[i], fmt.Sprintf("process %d killed", i))
		for j := range i {
			if len(waiters[j].wake) != 0 {
				t.Fatalf("process %d killed: the waiter of process %d, running, woken", i, j)
			}
		}
	}
}

// attachPIDs watches a run in dir whose pid.json names pids, until the test ends.
func attachPIDs(t *testing.T, n *notifier, dir string, pids shimPIDs) *process {
	t.Helper()
	if err := writeJSONAtomic(filepath.Join(dir, shim.PIDFile), pids); err != nil {
		t.Fatal(err)
	}
	p := attachProcess(n, dir, pids)
	t.Cleanup(p.detach)
	return p
}

func TestProcessSeesTheExitFile(t *testing.T) {
	self, err := shim.ProcStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	attach := func(t *testing.T, n *notifier, dir string, ref shim.ProcRef) *process {
		t.Helper()
		return attachPIDs(t, n, dir, shimPIDs{Shim: ref})
	}
	ended := func(t *testing.T, p *process) {
		t.Helper()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Fatal("the end of the run not seen")
		}
	}

	t.Run("written before the watch", func(t *testing.T) {
		n, dir := newTestNotifier(t), t.TempDir()
		if err := writeJSONAtomic(filepath.Join(dir, shim.ExitFile), shimExit{ExitCode: 3}); err != nil {
			t.Fatal(err)
		}
		p := attach(t, n, dir, shim.ProcRef{PID: os.Getpid(), Start: self})
		ended(t, p)
		if p.lost || p.result.ExitCode != 3 {
			t.Fatalf("lost %v, exit code %d, want 3", p.lost, p.result.ExitCode)
		}
	})
	t.Run("written after the watch", func(t *testing.T) {
		n, dir := newTestNotifier(t), t.TempDir()
		p := attach(t, n, dir, shim.ProcRef{PID: os.Getpid(), Start: self})
		if err := writeJSONAtomic(filepath.Join(dir, shim.ExitFile), shimExit{ExitCode: 4}); err != nil {
			t.Fatal(err)
		}
		ended(t, p)
		if p.lost || p.result.ExitCode != 4 {
			t.Fatalf("lost %v, exit code %d, want 4", p.lost, p.result.ExitCode)
		}
	})
	t.Run("never written: the shim died", func(t *testing.T) {
		n, dir := newTestNotifier(t), t.TempDir()
		shim, ref := startSleep(t)
		p := attach(t, n, dir, ref)
		_ = shim.Process.Kill()
		ended(t, p)
		if !p.lost {
			t.Fatal("a shim that died without an exit file: run not lost")
		}
	})
	// A crash of the host between the exit file's rename and its fsync may leave
	// it empty.
	t.Run("left empty by a crash: the shim died", func(t *testing.T) {
		n, dir := newTestNotifier(t), t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, shim.ExitFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p := attach(t, n, dir, shim.ProcRef{PID: os.Getpid(), Start: self + 1}) // a PID reused since
		ended(t, p)
		if !p.lost {
			t.Fatalf("an empty exit file read as exit code %d, want the run lost", p.result.ExitCode)
		}
	})
}

// The command's end is seen before its shim has written the exit file: the worker
// flushes the log meanwhile.
func TestProcessSeesTheCommandEndBeforeTheExitFile(t *testing.T) {
	attach := func(t *testing.T, command shim.ProcRef) *process {
		t.Helper()
		_, shimRef := startSleep(t) // a shim alive that writes no exit file
		return attachPIDs(t, newTestNotifier(t), t.TempDir(), shimPIDs{Shim: shimRef, Command: command})
	}
	seen := func(t *testing.T, p *process) {
		t.Helper()
		select {
		case <-p.commandEnded:
		case <-time.After(10 * time.Second):
			t.Fatal("the command's end not seen")
		}
		select {
		case <-p.exited:
			t.Fatal("exited closed with no exit file and the shim alive")
		default:
		}
		if !p.ended() {
			t.Fatal("ended() is false once the command has ended")
		}
	}

	t.Run("killed", func(t *testing.T) {
		cmd, ref := startSleep(t)
		p := attach(t, ref)
		if p.ended() {
			t.Fatal("ended() while the command runs")
		}
		_ = cmd.Process.Kill() // not reaped: its shim would reap it
		seen(t, p)
	})
	t.Run("its PID naming another process", func(t *testing.T) {
		_, ref := startSleep(t)
		ref.Start++
		seen(t, attach(t, ref))
	})
}

// chunks is a writer that hands each write on.
type chunks chan string

func (c chunks) Write(p []byte) (int, error) {
	c <- string(p)
	return len(p), nil
}

func (c chunks) Skip(n int64) { c <- fmt.Sprintf("[%d bytes skipped]", n) }

// Copies waiting for output hold no buffer of their own, and no goroutine: they
// borrow a buffer for each look at the file, and a look runs when it grew.
func TestCopiesWaitingForOutputHoldNoBufferNorGoroutine(t *testing.T) {
	const copies = 100
	n := newTestNotifier(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	looked := make(chunks, copies)
	for range copies {
		path := filepath.Join(t.TempDir(), shim.StdoutFile)
		appendTo(t, path, "x")
		c := copyGrowing(n, []*growingFile{{path: path, w: looked}})
		defer c.stop()
	}
	for range copies {
		<-looked // each has read what there was, and goes on to wait
	}
	// Each puts its buffer back, and its goroutine ends, a moment after it read.
	limit := int64(copies * copyBufferBytes / 4)
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d copies waiting for output holding under %d bytes of heap and no goroutine", copies, limit), func() bool {
		runtime.GC() // twice at least: a pool keeps what it holds through one
		var now runtime.MemStats
		runtime.ReadMemStats(&now)
		return int64(now.HeapAlloc)-int64(before.HeapAlloc) < limit && runtime.NumGoroutine() <= goroutines
	})
}

func TestCopyGrowingFollowsWrites(t *testing.T) {
	n := newTestNotifier(t)
	path := filepath.Join(t.TempDir(), shim.StdoutFile)
	appendTo(t, path, "before\n")
	got := make(chunks, 10)
	file := &growingFile{path: path, w: got}
	c := copyGrowing(n, []*growingFile{file})
	next := func(want string) {
		t.Helper()
		select {
		case s := <-got:
			if s != want {
				t.Fatalf("copied %q, want %q", s, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q not copied", want)
		}
	}
	next("before\n")
	appendTo(t, path, "after\n")
	next("after\n")
	appendTo(t, path, "last")
	c.stop()
	if file.offset != int64(len("before\nafter\nlast")) {
		t.Fatalf("copied up to %d", file.offset)
	}
	next("last")
}

// turns records which of a run's output files each write came from.
type turns struct {
	name  string
	order *[]string
}

func (w turns) Write(p []byte) (int, error) { *w.order = append(*w.order, w.name); return len(p), nil }
func (w turns) Skip(int64)                  {}

// A run's output files take turns, a buffer each: a command that floods its
// stdout does not hold up what it writes to stderr.
func TestCopyGrowingTakesTheFilesInTurn(t *testing.T) {
	n := newTestNotifier(t)
	dir := t.TempDir()
	stdout, stderr := filepath.Join(dir, shim.StdoutFile), filepath.Join(dir, shim.StderrFile)
	appendTo(t, stdout, strings.Repeat("o", 3*copyBufferBytes+1))
	appendTo(t, stderr, "an error\n")
	var order []string
	files := []*growingFile{{path: stdout, w: turns{"stdout", &order}}, {path: stderr, w: turns{"stderr", &order}}}
	copyGrowing(n, files).stop()
	if want := []string{"stdout", "stderr", "stdout", "stdout", "stdout"}; !slices.Equal(order, want) {
		t.Fatalf("writes from %v, want %v", order, want)
	}
	if files[0].offset != 3*copyBufferBytes+1 || files[1].offset != int64(len("an error\n")) {
		t.Fatalf("copied up to %d and %d", files[0].offset, files[1].offset)
	}
}
