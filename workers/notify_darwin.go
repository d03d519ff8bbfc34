package workers

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// endWatch waits for a process to end on a kqueue that holds one EVFILT_PROC
// NOTE_EXIT filter on it, which the runtime's poller waits on with no thread of
// its own. The filter is bound to the process, not to its PID.
type endWatch struct {
	kq   *os.File
	wait sync.WaitGroup
}

// procEnds waits for processes' ends, a kqueue for each.
type procEnds struct{}

// watch calls ended once process p has ended, or at once if the PID names
// another process now or none. It returns nil, and never calls ended, where it
// cannot watch; the caller's own checks and polls see the end then.
func (*procEnds) watch(p shim.ProcRef, ended func()) *endWatch {
	kq, err := kqueue()
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(kq), "kqueue")
	change := unix.Kevent_t{Ident: uint64(p.PID), Filter: unix.EVFILT_PROC, Flags: unix.EV_ADD | unix.EV_ONESHOT, Fflags: unix.NOTE_EXIT}
	_, err = unix.Kevent(kq, []unix.Kevent_t{change}, nil, nil)
	// Checked after the filter is on: a process that started before it, with this
	// start time, is p, so the filter is on p.
	if start, serr := shim.ProcStart(p.PID); err == unix.ESRCH || serr != nil || start != p.Start {
		f.Close()
		ended()
		return nil
	}
	conn, cerr := f.SyscallConn()
	if err != nil || cerr != nil {
		f.Close()
		return nil
	}
	e := &endWatch{kq: f}
	e.wait.Go(func() {
		// Read calls exited again each time the poller says the kqueue has an event;
		// it fails when close closes the kqueue.
		if conn.Read(exited) == nil {
			ended()
		}
	})
	return e
}

func (*procEnds) close() {}

// close stops the watch; ended is not called after it returns.
func (e *endWatch) close() {
	if e != nil {
		e.kq.Close()
		e.wait.Wait()
	}
}

// kqueue makes a kqueue that no child inherits, for the runtime's poller.
func kqueue() (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	kq, err := unix.Kqueue()
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(kq)
	if err := unix.SetNonblock(kq, true); err != nil {
		unix.Close(kq)
		return -1, err
	}
	return kq, nil
}

// exited takes the kqueue's event, if it has one: its only filter is NOTE_EXIT.
func exited(kq uintptr) bool {
	events := make([]unix.Kevent_t, 1)
	for {
		n, err := unix.Kevent(int(kq), nil, events, &unix.Timespec{})
		if err != unix.EINTR {
			return err == nil && n > 0
		}
	}
}
