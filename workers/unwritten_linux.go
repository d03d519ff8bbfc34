package workers

import "golang.org/x/sys/unix"

// unwritten reports whether no process has the file at path open for writing.
// The kernel grants a write lease only on a file no other descriptor has open for
// writing; the lease is given back at once. A file system without leases (or
// any error) says no.
func unwritten(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		return false
	}
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return true
}
