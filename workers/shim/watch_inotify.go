//go:build linux && !bgtask_portable

package shim

import (
	"syscall"
	"unsafe"
)

// outputWatch tells the shim when a run's output files change, so that it looks
// at their bound only then (bound.go): a command that prints nothing costs the
// shim nothing. One inotify instance holds a watch of each run's directory,
// which lasts until the first change after a look (IN_ONESHOT).
type outputWatch struct {
	fd   int // -1: the output is polled
	runs map[int]*running
}

func newOutputWatch() outputWatch {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		fd = -1
	}
	return outputWatch{fd: fd, runs: map[int]*running{}}
}

// arm watches the run's directory for its next change; false where it cannot.
func (w *outputWatch) arm(c *running) bool {
	if w.fd < 0 {
		return false
	}
	wd, err := syscall.InotifyAddWatch(w.fd, c.Dir, syscall.IN_MODIFY|syscall.IN_ONESHOT)
	if err != nil {
		return false
	}
	c.watch, w.runs[wd] = wd, c
	return true
}

// changed has the next look at the bound of each run whose output changed come
// at its pace (boundNext).
func (w *outputWatch) changed() {
	var buf [4096]byte
	for {
		n, err := syscall.Read(w.fd, buf[:])
		if err == syscall.EINTR {
			continue
		}
		if n <= 0 {
			return
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += syscall.SizeofInotifyEvent + int(ev.Len)
			if c := w.runs[int(ev.Wd)]; c != nil {
				delete(w.runs, int(ev.Wd))
				c.watch, c.boundAt = -1, c.boundNext
			}
		}
	}
}

// forget ends the watch of a run whose command has ended.
func (w *outputWatch) forget(c *running) {
	if c.watch >= 0 {
		_, _ = syscall.InotifyRmWatch(w.fd, uint32(c.watch))
		delete(w.runs, c.watch)
		c.watch = -1
	}
}
