package workers

// A worker waits for the files of its runs: each run's exit file, and each quiet
// output file. Polling them would delay every command's end by half a poll and wake
// the worker all the time for idle runs; the kernel can say when a file in a run
// directory changes (inotify) and when a shim ends (pidfd), so the worker reacts to
// the event and sleeps otherwise.
//
// One inotify instance serves the whole worker: the per-user limit on instances
// (fs.inotify.max_user_instances, 128 by default) allows none per run. A run costs
// at most three watches (fs.inotify.max_user_watches): its directory, shared by all
// that wait for a record in it and given back with the last of them or with the
// directory, and each output file while its copier waits for it to grow.
//
// An event only hurries a look; it is never the truth. A look reads the files
// again, and a waiter has one anyway every safetyPoll: on filesystems where
// inotify does not fire (a network filesystem written from another host), and for
// a pidfd the kernel is too old to give. When the kernel drops events
// (IN_Q_OVERFLOW) every waiter looks again. A waiter that has no watch (no inotify,
// the watch limit reached, the notifier closed) polls every unwatchedPoll.
//
// The kernel's part is in notify_linux.go. macOS has no inotify: its waiters
// poll (notify_darwin.go), and a process's end comes from kqueue.

import (
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/bgtask/bgtask/workers/shim"
)

const (
	// safetyPoll is how often a waiter looks at a watched file with no event. Each
	// run has three waiters (its exit and its two output files), each look a few
	// system calls: looking every second, a worker watching 1,000 sleeping runs
	// would spend a quarter of a core on looks that find nothing.
	safetyPoll = 10 * time.Second
	// unwatchedPoll is how often it looks when the file cannot be watched.
	unwatchedPoll = 20 * time.Millisecond
)

// notifier calls the looks of a worker's runs at files that changed, over one
// inotify instance.
type notifier struct {
	log *slog.Logger
	// How often waiters look with no event: safetyPoll and unwatchedPoll, but tests
	// that must see events alone make them longer.
	safety, unwatched time.Duration

	fd   int      // the inotify instance, used only while the notifier is open
	file *os.File // fd, read through the runtime's poller so that closing it ends the read
	read sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	watches map[int32]*kernelWatch // by watch descriptor

	ends procEnds // the processes waited for
}

// kernelWatch is a watch of the inotify instance that one or more waiters share.
type kernelWatch struct {
	wd      int32
	oneshot bool // the kernel removes it with its first event
	waiters map[*waiter]struct{}
}

// close ends the notifier. Waiters still open poll from now on, and no process
// end calls their looks.
func (n *notifier) close() {
	n.ends.close()
	n.shutdown()
	if n.file != nil {
		n.file.Close()
		n.read.Wait()
	}
}

// shutdown turns every waiter to polling and watches nothing more.
func (n *notifier) shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, x := range n.watches {
		n.forget(x, true)
	}
}

// forget drops a watch the kernel no longer has: its waiters poll until armed
// again, and look at once if wake.
func (n *notifier) forget(x *kernelWatch, wake bool) {
	delete(n.watches, x.wd)
	for w := range x.waiters {
		if w.watch == x {
			w.watch = nil
		}
		if wake {
			w.look()
		}
	}
}

// watch returns a waiter that calls look when one of the named records lands in
// dir. It is armed on return: a record that lands after it is never missed, so a
// caller looks for its records after watch, and after each call.
func (n *notifier) watch(look func(), dir string, names ...string) *waiter {
	w := &waiter{n: n, names: names, look: look}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.add(w, dir, recordMask)
	return w
}

// watchGrowth returns a waiter for files that grow, the output files of a run,
// that calls look when any of them grows: arm it before each look.
func (n *notifier) watchGrowth(look func(), paths ...string) *waiter {
	w := &waiter{n: n, look: look}
	for _, path := range paths {
		// A waiter of its own on each file's watch, with the same look.
		w.files = append(w.files, &waiter{n: n, path: path, look: look})
	}
	return w
}

// add joins w to the kernel's watch of path; the same file gives the same watch.
func (n *notifier) add(w *waiter, path string, mask uint32) {
	if n.closed {
		return
	}
	wd, err := addWatch(n.fd, path, mask)
	if err != nil {
		if !w.warned {
			w.warned = true
			n.log.Warn("a run's file cannot be watched: it is polled every "+unwatchedPoll.String(), "path", path, "err", err)
		}
		return
	}
	x := n.watches[int32(wd)]
	if x == nil {
		x = &kernelWatch{wd: int32(wd), oneshot: mask&oneshotMask != 0, waiters: map[*waiter]struct{}{}}
		n.watches[x.wd] = x
	}
	if w.watch != x {
		n.leave(w) // a one-shot watch that fired, its event not yet read
		x.waiters[w] = struct{}{}
		w.watch = x
	}
}

// leave takes w off its watch, and gives the watch back if w was its last waiter.
func (n *notifier) leave(w *waiter) {
	x := w.watch
	if x == nil {
		return
	}
	w.watch = nil
	delete(x.waiters, w)
	if len(x.waiters) == 0 && n.watches[x.wd] == x {
		delete(n.watches, x.wd)
		// EINVAL if the file went meanwhile and took its watch with it.
		removeWatch(n.fd, x.wd)
	}
}

// waiter is a wait for some files of a run to change, which calls its look when
// they may have: no goroutine waits.
type waiter struct {
	n      *notifier
	names  []string     // the records it waits for in a directory
	path   string       // or the file it waits to grow
	files  []*waiter    // or the files, each with a path, it waits for any of to grow
	look   func()       // must not block: the notifier calls it with its watches locked
	watch  *kernelWatch // under n.mu; nil when polled
	warned bool         // under n.mu: said once that it cannot be watched
	poll   *time.Timer  // calls look when the poll is due

	process *endWatch // if the waiter also waits for a process to end
}

// arm watches a growing file for its next write. Called before each look at the
// file, so a write the look misses calls the next.
func (w *waiter) arm() {
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	for _, f := range w.files {
		w.n.add(f, f.path, growthMask)
	}
}

// looked has look called again once the poll is due, if no event calls it
// first: called after each look.
func (w *waiter) looked() {
	every := w.pollEvery()
	if w.poll == nil {
		w.poll = time.AfterFunc(every, w.look)
	} else {
		w.poll.Reset(every)
	}
}

// stopWatching stops watching path, one of the files of a growth waiter.
func (w *waiter) stopWatching(path string) {
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	w.files = slices.DeleteFunc(w.files, func(f *waiter) bool {
		if f.path == path {
			w.n.leave(f)
			return true
		}
		return false
	})
}

func (w *waiter) pollEvery() time.Duration {
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	watched := w.watch != nil || len(w.files) > 0
	for _, f := range w.files {
		watched = watched && f.watch != nil
	}
	if !watched {
		return w.n.unwatched
	}
	return w.n.safety
}

// watchProcess has the waiter call its look when process p ends too. A shim that dies without
// its exit file (killed) changes nothing in its directory; its pidfd turns readable
// when it ends.
func (w *waiter) watchProcess(p shim.ProcRef) {
	w.process = w.n.ends.watch(p, w.look)
}

// close gives the waiter's watches back; a nil waiter has none.
func (w *waiter) close() {
	if w == nil {
		return
	}
	if w.poll != nil {
		w.poll.Stop()
	}
	w.process.close()
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	w.n.leave(w)
	for _, f := range w.files {
		w.n.leave(f)
	}
}
