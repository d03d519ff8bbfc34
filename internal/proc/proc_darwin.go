package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Start watches the end of the running process id names, on a kqueue with one
// EVFILT_PROC NOTE_EXIT filter, which names the process, not its PID. A process
// that is not running is ErrGone.
func Start(id Identity) (*Watch, error) {
	kq, err := kqueue()
	if err != nil {
		return nil, fmt.Errorf("watch process %d: kqueue: %w", id.PID, err)
	}
	change := unix.Kevent_t{Ident: uint64(id.PID), Filter: unix.EVFILT_PROC, Flags: unix.EV_ADD | unix.EV_ONESHOT, Fflags: unix.NOTE_EXIT}
	if _, err := unix.Kevent(kq, []unix.Kevent_t{change}, nil, nil); err != nil {
		_ = unix.Close(kq)
		if errors.Is(err, unix.ESRCH) {
			return nil, &GoneError{PID: id.PID, Reason: "does not exist"}
		}
		return nil, fmt.Errorf("watch process %d: kevent: %w", id.PID, err)
	}
	// Checked after the filter is on: it is on the process that had the PID then,
	// and the same start time now says it is still that one, the one registered.
	if err := Check(id); err != nil {
		_ = unix.Close(kq)
		return nil, err
	}
	// The kqueue is readable once it holds the exit.
	return watchUntil(os.NewFile(uintptr(kq), "kqueue:"+strconv.Itoa(id.PID)), func(fd uintptr) bool {
		events := make([]unix.Kevent_t, 1)
		n, err := unix.Kevent(int(fd), nil, events, &unix.Timespec{})
		return err == nil && n > 0
	})
}

// kqueue makes a non-blocking kqueue for the runtime's poller, close-on-exec.
func kqueue() (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	kq, err := unix.Kqueue()
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(kq)
	if err := unix.SetNonblock(kq, true); err != nil {
		_ = unix.Close(kq)
		return -1, err
	}
	return kq, nil
}

// startOf reads when pid started, in Unix microseconds, from its kinfo_proc
// (sysctl kern.proc.pid); a zombie has ended.
func startOf(pid int) (uint64, error) {
	info, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	// The kernel answers a PID it does not know with no record, which x/sys takes
	// for EIO.
	if errors.Is(err, unix.EIO) || errors.Is(err, unix.ESRCH) || err == nil && info.Proc.P_pid != int32(pid) {
		return 0, &GoneError{PID: pid, Reason: "does not exist"}
	}
	if err != nil {
		return 0, fmt.Errorf("read process %d: %w", pid, err)
	}
	if info.Proc.P_stat == 5 { // SZOMB
		return 0, &GoneError{PID: pid, Reason: "has ended (its parent has not reaped it yet)"}
	}
	t := info.Proc.P_starttime
	return uint64(t.Sec)*1e6 + uint64(t.Usec), nil
}

// bootID names this boot of the host; it does not change while the host runs.
var bootID = sync.OnceValues(func() (string, error) {
	id, err := unix.Sysctl("kern.bootsessionuuid")
	if err != nil {
		return "", fmt.Errorf("read the host's boot id: %w", err)
	}
	return id, nil
})
