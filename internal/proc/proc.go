// Package proc names and watches processes that bgtask did not start: the PID a
// task watches (bgtask add --pid). A PID alone may name another process once the
// first has ended, and a host's PIDs start again at its boot, so a process is
// named by its Identity: its PID, its start time and the boot it runs in. All
// that reads the operating system for it is here: Linux (proc_linux.go) reads
// /proc and waits on a pidfd; macOS (proc_darwin.go) reads the start time from
// sysctl kern.proc.pid and waits on kqueue's NOTE_EXIT; another system
// (proc_other.go) refuses.
package proc

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// Identity names one process for as long as it lives, on the host it runs on.
type Identity struct {
	PID int `json:"pid"`
	// Start is when the process started (Linux: in clock ticks after boot, field
	// 22 of /proc/PID/stat; macOS: in Unix microseconds, from kinfo_proc): a
	// process that takes over its PID later has another.
	Start uint64 `json:"start"`
	// Boot names the host's boot (Linux: /proc/sys/kernel/random/boot_id; macOS:
	// kern.bootsessionuuid): after a
	// restart of the host, no process of an earlier boot is alive.
	Boot string `json:"boot"`
}

// Boot names this boot of the host (Identity.Boot).
func Boot() (string, error) { return bootID() }

// ErrGone is a process that is not running: it never was, it has ended (a
// zombie, not yet reaped by its parent, has ended), its PID now names another
// process, or the host has restarted since. A *GoneError says which.
var ErrGone = errors.New("the process is not running")

// ErrUnsupported: this system has no reading of processes here yet.
var ErrUnsupported = errors.New("watching a process bgtask did not start is supported on Linux and macOS only")

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

// Of reads the identity of pid, a process running now.
func Of(pid int) (Identity, error) {
	if pid <= 0 {
		return Identity{}, &GoneError{PID: pid, Reason: "is not a process id"}
	}
	boot, err := bootID()
	if err != nil {
		return Identity{}, err
	}
	start, err := startOf(pid)
	if err != nil {
		return Identity{}, err
	}
	return Identity{PID: pid, Start: start, Boot: boot}, nil
}

// Check reports, as a *GoneError, whether the process id names is not running.
func Check(id Identity) error {
	boot, err := bootID()
	if err != nil {
		return err
	}
	if boot != id.Boot {
		return &GoneError{PID: id.PID, Reason: "ran in an earlier boot of this host: the host has restarted since"}
	}
	start, err := startOf(id.PID)
	if err != nil {
		return err
	}
	if start != id.Start {
		return &GoneError{PID: id.PID, Reason: fmt.Sprintf("has ended: its PID now names another process (started at tick %d, not %d)", start, id.Start)}
	}
	return nil
}

// watchUntil watches f, a descriptor of one process, on the Go runtime's poller:
// a watch holds a descriptor and a parked goroutine, no thread. ended says, each
// time the poller finds f readable, whether the process has ended; the wait ends
// then, or when the watch is stopped and f closed.
func watchUntil(f *os.File, ended func(fd uintptr) bool) (*Watch, error) {
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	endedCh, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		if conn.Read(ended) == nil {
			close(endedCh)
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			f.Close()
			<-done
		})
	}
	return &Watch{Ended: endedCh, stop: stop}, nil
}
