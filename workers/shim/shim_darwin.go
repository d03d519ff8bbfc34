package shim

import (
	"os"
	"syscall"
)

// Args are this process's arguments after its name. macOS has no /proc to read
// them from, so the shim takes them from package os there, which costs a
// macOS shim the size of os (see the package comment).
func Args() ([]string, error) {
	if len(os.Args) == 0 {
		return nil, nil
	}
	return os.Args[1:], nil
}

// KeepInherited marks every descriptor from 3 up close-on-exec, so that none this
// process inherited reaches what it starts: those open are listed in /dev/fd.
func KeepInherited() {
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

// canPunch is false: macOS has no call to free part of a file that Go reaches
// (docs/platforms.md), so a run's output files grow to its command's end.
const canPunch = false

func punchHole(fd int, length int64) error { return syscall.EOPNOTSUPP }

// awaitChild waits 10 ms: macOS has no waitid that leaves a child to be reaped,
// so the shim looks for ended children that often while it has any.
func awaitChild() bool {
	sleep(10e6)
	return true
}

func dup(from, to int) error { return syscall.Dup2(from, to) }
