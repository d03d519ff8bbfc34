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

// awaitReadable waits until fd can be read, or the monotonic clock reaches until
// (no limit if it is negative), and says whether fd can be read.
func awaitReadable(fd int, until int64) bool {
	for {
		timeout := -1
		if until >= 0 {
			timeout = pollMillis(max(until-monotonic(), 0))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		switch {
		case err == nil && n > 0:
			return true
		case err == nil && until >= 0 && monotonic() >= until:
			return false
		case err != nil && err != syscall.EINTR:
			sleep(10e6)
		}
	}
}

// recvCloexec: macOS has no MSG_CMSG_CLOEXEC; receiveLock sets the flag after.
const recvCloexec = 0
