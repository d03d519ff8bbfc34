package workers

import "golang.org/x/sys/unix"

// emptyIfUnwritten empties the file at path, durably (a crash of the host must
// not bring a run's output back into the next run's), if no other process has it
// open for writing; kept says whether it did. The kernel grants a write lease only
// on a file no other descriptor has open for writing; it is held while the file
// is emptied, and given back. A file system without leases keeps nothing.
func emptyIfUnwritten(path string) (kept bool, err error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, nil
	}
	defer unix.Close(fd)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		return false, nil
	}
	defer func() { _, _ = unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK) }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size == 0 {
		return err == nil, err
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		return false, err
	}
	return true, unix.Fsync(fd)
}
