package shim

import "syscall"

// Args are this process's arguments after its name, for a main without package
// os (which is where Go keeps them), from the kernel's copy.
func Args() ([]string, error) {
	cmdline, err := readFile("/proc/self/cmdline")
	if err != nil {
		return nil, err
	}
	args := splitNUL(cmdline)
	if len(args) == 0 {
		return nil, nil
	}
	return args[1:], nil
}

// keepInherited marks every descriptor from 3 up close-on-exec.
func keepInherited() {
	_, _, _ = syscall.RawSyscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec)
}

func pipeCloexec(p []int) error { return syscall.Pipe2(p, syscall.O_CLOEXEC) }

func allocate(fd int, size int64) error { return syscall.Fallocate(fd, 0, 0, size) }

func dup(from, to int) error { return syscall.Dup3(from, to, 0) }
