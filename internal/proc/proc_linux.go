package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Start watches the end of the running process id names. The wait is a pidfd on
// the Go runtime's poller: a watch holds a descriptor and a parked goroutine, no
// thread. A process that is not running is ErrGone.
func Start(id Identity) (*Watch, error) {
	fd, err := unix.PidfdOpen(id.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, &GoneError{PID: id.PID, Reason: "does not exist"}
	}
	if err != nil {
		return nil, fmt.Errorf("watch process %d: pidfd_open: %w", id.PID, err)
	}
	// Checked after the open: the pidfd names the process that had the PID then,
	// and the same start time now says it is still that one, the one registered.
	if err := Check(id); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	// A pidfd is readable once its process has ended.
	return watchUntil(os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(id.PID)), func(fd uintptr) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return err == nil && n > 0
	})
}

// startOf reads when pid started, from /proc/PID/stat; a zombie has ended.
func startOf(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return 0, &GoneError{PID: pid, Reason: "does not exist"}
	}
	if err != nil {
		return 0, fmt.Errorf("read process %d: %w", pid, err)
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses, so the
	// fields start after the last ')'; the start time is field 22, the 20th after it.
	i := bytes.LastIndexByte(data, ')')
	fields := bytes.Fields(data[i+1:])
	if i < 0 || len(fields) < 20 {
		return 0, fmt.Errorf("read process %d: /proc/%d/stat has no start time", pid, pid)
	}
	if state := fields[0]; string(state) == "Z" || string(state) == "X" {
		return 0, &GoneError{PID: pid, Reason: "has ended (its parent has not reaped it yet)"}
	}
	start, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read process %d: start time: %w", pid, err)
	}
	return start, nil
}

// bootID names this boot of the host; it does not change while the host runs.
var bootID = sync.OnceValues(func() (string, error) {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read the host's boot id: %w", err)
	}
	return string(bytes.TrimSpace(data)), nil
})
