package workers

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// procEnds waits for the ends of a worker's processes (each run's command and
// shim), each on its pidfd, all on one epoll instance that the runtime's poller
// waits on: one goroutine for all of them, where a goroutine per pidfd would
// cost each running task two more goroutine stacks.
type procEnds struct {
	mu      sync.Mutex
	closed  bool
	ep      *os.File // the epoll instance, made at the first watch
	epfd    int      // its descriptor (ep.Fd would make it blocking, which the poller cannot wait on)
	wait    sync.WaitGroup
	watches map[int32]*endWatch // by pidfd, until it fires or is closed
	events  []unix.EpollEvent   // taken from the instance, under mu
}

// endWatch is a wait for one process's end.
type endWatch struct {
	ends  *procEnds
	pidfd int
	ended func()
}

// watch calls ended once process p has ended (a zombie has), or at once if the
// PID names another process now. It returns nil, and never calls ended, where it
// cannot watch: p ended already, or no pidfd (before Linux 5.10); the caller's own
// checks and polls see the end then. ended is called with the watches locked:
// it must not block.
func (s *procEnds) watch(p shim.ProcRef, ended func()) *endWatch {
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil
	}
	if start, err := shim.ProcStart(p.PID); err != nil || start != p.Start {
		_ = unix.Close(fd) // the PID names another process now: p has ended
		ended()
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open() {
		_ = unix.Close(fd)
		return nil
	}
	// One-shot: an ended process's pidfd stays readable, and is reported once.
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(fd)}
	if unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev) != nil {
		_ = unix.Close(fd)
		return nil
	}
	e := &endWatch{ends: s, pidfd: fd, ended: ended}
	s.watches[int32(fd)] = e
	return e
}

// open makes the epoll instance and starts its goroutine, once; false where it
// cannot, or after close. Called with mu held.
func (s *procEnds) open() bool {
	if s.ep != nil || s.closed {
		return s.ep != nil && !s.closed
	}
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return false
	}
	if err := unix.SetNonblock(fd, true); err != nil { // for the runtime's poller
		_ = unix.Close(fd)
		return false
	}
	s.ep, s.epfd = os.NewFile(uintptr(fd), "epoll"), fd
	conn, err := s.ep.SyscallConn()
	if err != nil {
		s.ep.Close()
		s.ep = nil
		return false
	}
	s.watches = map[int32]*endWatch{}
	s.events = make([]unix.EpollEvent, 64)
	// Read calls take each time the poller says the instance has events, until
	// close closes it.
	s.wait.Go(func() { _ = conn.Read(s.take) })
	return true
}

// take calls the ended of each process the instance reports ended. It reports
// false: the poller's wait for the next events follows.
func (s *procEnds) take(ep uintptr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		n, err := unix.EpollWait(int(ep), s.events, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		for _, ev := range s.events[:n] {
			if e := s.watches[ev.Fd]; e != nil {
				delete(s.watches, ev.Fd)
				e.ended()
			}
		}
	}
}

// close ends every watch: none calls its ended after close returns. The runs
// must have stopped watching their processes first: a command's end no longer
// reaches its run after it (adoptCommand waits for it).
func (s *procEnds) close() {
	s.mu.Lock()
	s.closed = true
	ep := s.ep
	s.mu.Unlock()
	if ep != nil {
		ep.Close()
		s.wait.Wait()
	}
}

// close stops the watch; ended is not called after it returns. Again, it does
// nothing (the pidfd's number may name another file by then).
func (e *endWatch) close() {
	if e == nil {
		return
	}
	s := e.ends
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.pidfd < 0 {
		return
	}
	// Taken out of the instance before the pidfd is closed: a child forked in
	// between holds a copy of the pidfd, which would keep it in the instance,
	// reported under a number that another watch may have by then.
	if !s.closed {
		_ = unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, e.pidfd, nil)
	}
	delete(s.watches, int32(e.pidfd))
	_ = unix.Close(e.pidfd)
	e.pidfd = -1
}
