package bench

import (
	"errors"
	"syscall"
)

// childAttr puts a process the bench starts in a group of its own.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// supported says whether the bench can measure here: it reads each process's
// memory, and the host's CPU and load, from /proc.
func supported() error {
	return errors.New("bgtask bench is not supported on macOS yet: it measures through /proc")
}
