package shim

import (
	"syscall"
	"unsafe"
)

const (
	clockRealtime       = 0
	clockMonotonic      = 1
	prSetChildSubreaper = 36
	// close_range(2) came after package syscall stopped adding calls; it has the
	// same number on every Linux architecture.
	sysCloseRange     = 436
	closeRangeCloexec = 1 << 2
	pollIn            = 0x1
)

// wallClock is the time of day, in nanoseconds since the Unix epoch.
func wallClock() int64 { return clock(clockRealtime) }

// monotonic is a clock for intervals: it never jumps.
func monotonic() int64 { return clock(clockMonotonic) }

func clock(id uintptr) int64 {
	var ts syscall.Timespec
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, id, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

func sleep(nanos int64) {
	ts := syscall.NsecToTimespec(nanos)
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}

// awaitReadable waits until one of fds can be read (or is closed at its other
// end), or the monotonic clock reaches until (no limit if it is negative), and
// says which can. A negative fd is none, never ready.
func awaitReadable(fds []int, until int64) []bool {
	type pollFd struct {
		fd      int32
		events  int16
		revents int16
	}
	pfds := make([]pollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = pollFd{fd: int32(fd), events: pollIn}
	}
	ready := make([]bool, len(fds))
	for {
		var timeout *syscall.Timespec
		if until >= 0 {
			ts := syscall.NsecToTimespec(max(until-monotonic(), 0))
			timeout = &ts
		}
		n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfds[0])), uintptr(len(pfds)), uintptr(unsafe.Pointer(timeout)), 0, 0, 0)
		switch {
		case errno == 0 && n > 0:
			for i := range pfds {
				ready[i] = pfds[i].revents != 0
			}
			return ready
		case errno == 0 && until >= 0 && monotonic() >= until:
			return ready
		case errno != 0 && errno != syscall.EINTR:
			// Not seen; the Go runtime's signals are EINTR. Keep waiting, not spinning.
			sleep(10e6)
		}
	}
}

// recvCloexec makes descriptors received on a socket close-on-exec at once.
const recvCloexec = syscall.MSG_CMSG_CLOEXEC
