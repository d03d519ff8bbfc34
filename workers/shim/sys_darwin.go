package shim

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// On macOS the shim calls the kernel through golang.org/x/sys/unix, which has
// the libSystem calls that package syscall lacks there (clock_gettime, poll,
// sysctl); the linker keeps only the calls used.

// wallClock is the time of day, in nanoseconds since the Unix epoch.
func wallClock() int64 { return clock(unix.CLOCK_REALTIME) }

// monotonic is a clock for intervals: it never jumps.
func monotonic() int64 { return clock(unix.CLOCK_MONOTONIC) }

func clock(id int32) int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(id, &ts)
	return ts.Nano()
}

// sleep waits nanos nanoseconds: macOS has no nanosleep call, so it polls no
// descriptor for that long.
func sleep(nanos int64) {
	until := monotonic() + nanos
	for left := nanos; left > 0; left = until - monotonic() {
		_, _ = unix.Poll(nil, pollMillis(left))
	}
}

// pollMillis is a wait in the milliseconds poll takes, rounded up so that a
// wait never ends early.
func pollMillis(nanos int64) int {
	return int(min((nanos+999_999)/1e6, 1<<30))
}

// awaitReadable waits until one of fds can be read (or is closed at its other
// end), or the monotonic clock reaches until (no limit if it is negative), and
// says which can. A negative fd is none, never ready.
func awaitReadable(fds []int, until int64) []bool {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	ready := make([]bool, len(fds))
	for {
		timeout := -1
		if until >= 0 {
			timeout = pollMillis(max(until-monotonic(), 0))
		}
		n, err := unix.Poll(pfds, timeout)
		switch {
		case err == nil && n > 0:
			for i := range pfds {
				ready[i] = pfds[i].Revents != 0
			}
			return ready
		case err == nil && until >= 0 && monotonic() >= until:
			return ready
		case err != nil && err != syscall.EINTR:
			sleep(10e6)
		}
	}
}

// recvCloexec: macOS has no MSG_CMSG_CLOEXEC; receiveLock sets the flag after.
const recvCloexec = 0
