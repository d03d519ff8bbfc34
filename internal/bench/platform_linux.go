package bench

import "syscall"

// childAttr puts a process the bench starts in a group of its own, which dies
// with the bench even when the bench is killed outright (Pdeathsig).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// supported says whether the bench can measure here: it reads /proc.
func supported() error { return nil }
