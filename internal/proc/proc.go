// Package proc names and watches processes that bgtask did not start: the PID a
// task watches (bgtask add --pid). A PID alone may name another process once the
// first has ended, and a host's PIDs start again at its boot, so a process is
// named by its Identity: its PID, its start time and the boot it runs in. All
// that reads the operating system for it is here: Linux (proc_linux.go) reads
// /proc and waits on a pidfd; another system (proc_other.go) refuses, until its
// own reading is added (macOS: the start time from sysctl kern.proc.pid, the end
// from kqueue's NOTE_EXIT).
package proc

import (
	"errors"
	"fmt"
)

// Identity names one process for as long as it lives, on the host it runs on.
type Identity struct {
	PID int `json:"pid"`
	// Start is when the process started, in clock ticks after boot (Linux: field
	// 22 of /proc/PID/stat): a process that takes over its PID later has another.
	Start uint64 `json:"start"`
	// Boot names the host's boot (Linux: /proc/sys/kernel/random/boot_id): after a
	// restart of the host, no process of an earlier boot is alive.
	Boot string `json:"boot"`
}

// ErrGone is a process that is not running: it never was, it has ended (a
// zombie, not yet reaped by its parent, has ended), its PID now names another
// process, or the host has restarted since. A *GoneError says which.
var ErrGone = errors.New("the process is not running")

// ErrUnsupported: this system has no reading of processes here yet.
var ErrUnsupported = errors.New("watching a process bgtask did not start is supported on Linux only")

// GoneError says why a process is not running.
type GoneError struct {
	PID    int
	Reason string
}

func (e *GoneError) Error() string { return fmt.Sprintf("process %d %s", e.PID, e.Reason) }

func (e *GoneError) Is(target error) bool { return target == ErrGone }

// Watch is a watch of one running process's end.
type Watch struct {
	// Ended is closed when the process has ended.
	Ended <-chan struct{}
	stop  func()
}

// Stop ends the watch and frees what it holds; Ended is then closed only if the
// process ended first.
func (w *Watch) Stop() { w.stop() }
