package shim

import (
	"encoding/binary"
	"syscall"

	"golang.org/x/sys/unix"
)

// Args are this process's arguments after its name, for a main without package
// os (which is where Go keeps them), from the kernel's copy (kern.procargs2:
// argc, the executable's path, padding, then argv).
func Args() ([]string, error) {
	raw, err := unix.SysctlRaw("kern.procargs2", syscall.Getpid())
	if err != nil {
		return nil, &fileError{"sysctl", "kern.procargs2", err}
	}
	if len(raw) < 4 {
		return nil, &fileError{"sysctl", "kern.procargs2", syscall.EIO}
	}
	argc := int(binary.NativeEndian.Uint32(raw))
	rest := raw[4:]
	for len(rest) > 0 && rest[0] != 0 { // the executable's path
		rest = rest[1:]
	}
	for len(rest) > 0 && rest[0] == 0 {
		rest = rest[1:]
	}
	args := splitNUL(rest)
	if len(args) > argc { // the environment follows argv
		args = args[:argc]
	}
	if len(args) == 0 {
		return nil, nil
	}
	return args[1:], nil
}

// adoptOrphans does nothing: macOS has no child subreaper. What the command
// leaves behind in its process group is stopped by group (stopLeftovers); what
// it moves to a group or session of its own (setsid, a daemon's double fork)
// goes to launchd and outlives the run.
func adoptOrphans() {}

// keepInherited marks every descriptor from 3 up close-on-exec: those open are
// listed in /dev/fd.
func keepInherited() {
	dir, err := open("/dev/fd", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	defer syscall.Close(dir)
	var names []string
	buf := make([]byte, 4096)
	for {
		n, err := syscall.ReadDirent(dir, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
	for _, name := range names {
		if fd, ok := parseUint(name); ok && fd >= 3 && int(fd) != dir {
			syscall.CloseOnExec(int(fd))
		}
	}
}

// pipeCloexec makes a pipe whose ends are close-on-exec. macOS has no pipe2;
// the shim starts no process between the two calls.
func pipeCloexec(p []int) error {
	if err := syscall.Pipe(p); err != nil {
		return err
	}
	syscall.CloseOnExec(p[0])
	syscall.CloseOnExec(p[1])
	return nil
}

// commandAttr puts the command in its own process group. macOS has no
// parent-death signal: a shim killed between the command's start and its
// pid.json leaves the command running unrecorded (docs/platforms.md).
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// allocate has no fallocate to call: the exit file's room is written instead.
func allocate(fd int, size int64) error { return syscall.EOPNOTSUPP }

func dup(from, to int) error { return syscall.Dup2(from, to) }

// stopLeftovers ends what the command left running in its process group pgid:
// TERM, and KILL once grace (nanoseconds) has passed with the group not empty.
// While a process of the group lives, its ID names no other process or group.
func stopLeftovers(pgid int, grace int64) {
	if syscall.Kill(-pgid, syscall.SIGTERM) != nil {
		return // nothing is left
	}
	killAt := monotonic() + grace
	for syscall.Kill(-pgid, 0) == nil {
		if monotonic() >= killAt {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
		sleep(20e6)
	}
}
