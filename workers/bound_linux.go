package workers

import "golang.org/x/sys/unix"

// punchHole frees the blocks of length bytes at offset in the file fd, keeping
// its size.
func punchHole(fd int, offset, length int64) error {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, offset, length)
}
