package shim

import (
	"syscall"
	"unsafe"
)

// Args are this process's arguments after its name, for a main without package
// os (which is where Go keeps them), from the kernel's copy.
func Args() ([]string, error) {
	args, err := commandLine()
	if err != nil || len(args) == 0 {
		return nil, err
	}
	return args[1:], nil
}

// commandLine is this process's name and arguments, from the kernel's copy.
func commandLine() ([]string, error) {
	cmdline, err := readFile("/proc/self/cmdline")
	if err != nil {
		return nil, err
	}
	return splitNUL(cmdline), nil
}

// KeepInherited marks every descriptor from 3 up close-on-exec, so that none this
// process inherited reaches what it starts.
func KeepInherited() {
	_, _, _ = syscall.RawSyscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec)
}

func pipeCloexec(p []int) error { return syscall.Pipe2(p, syscall.O_CLOEXEC) }

func allocate(fd int, size int64) error { return syscall.Fallocate(fd, 0, 0, size) }

// canPunch says whether the system can free part of a file (punchHole).
const canPunch = true

// punchHole frees the blocks of the first length bytes of the file fd, keeping
// its size. It fails with EOPNOTSUPP where the file system or the kernel cannot.
func punchHole(fd int, length int64) error {
	const keepSize, punch = 0x1, 0x2 // FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE
	err := syscall.Fallocate(fd, punch|keepSize, 0, length)
	if err == syscall.ENOSYS {
		return syscall.EOPNOTSUPP
	}
	return err
}

// awaitChild waits until a child has ended, and leaves it to be reaped
// (WNOWAIT); false where the shim has no child.
func awaitChild() bool {
	const pAll, wExited, wNowait = 0, 4, 0x1000000
	for {
		var info [128]byte // siginfo_t
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pAll, 0, uintptr(unsafe.Pointer(&info)), wExited|wNowait, 0, 0)
		if errno != syscall.EINTR {
			return errno != syscall.ECHILD
		}
	}
}

func dup(from, to int) error { return syscall.Dup3(from, to, 0) }
