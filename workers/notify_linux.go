package workers

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// endWatch waits for a process to end on its pidfd, which the runtime's poller
// waits on with no thread of its own.
type endWatch struct {
	pidfd *os.File
	wait  sync.WaitGroup
}

// watchEnd calls ended once process p has ended (a zombie has), or at once if the
// PID names another process now. It returns nil, and never calls ended, where it
// cannot watch: p ended already, or no pidfd (before Linux 5.10); the caller's own
// checks and polls see the end then.
func watchEnd(p shim.ProcRef, ended func()) *endWatch {
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if start, err := shim.ProcStart(p.PID); err != nil || start != p.Start {
		f.Close() // the PID names another process now: p has ended
		ended()
		return nil
	}
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	e := &endWatch{pidfd: f}
	e.wait.Go(func() {
		// Read calls pidfdReadable again each time the poller says the pidfd is
		// readable; it fails when close closes the pidfd.
		if conn.Read(pidfdReadable) == nil {
			ended()
		}
	})
	return e
}

// close stops the watch; ended is not called after it returns.
func (e *endWatch) close() {
	if e != nil {
		e.pidfd.Close()
		e.wait.Wait()
	}
}

func pidfdReadable(fd uintptr) bool {
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		if !errors.Is(err, unix.EINTR) {
			return err == nil && n > 0
		}
	}
}
