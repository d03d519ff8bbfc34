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

// allocate has no fallocate to call: the exit file's room is written instead.
func allocate(fd int, size int64) error { return syscall.EOPNOTSUPP }

func dup(from, to int) error { return syscall.Dup2(from, to) }
