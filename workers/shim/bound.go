package shim

import "syscall"

// The shim keeps its command's output files bounded on disk itself, worker or no
// worker. The worker frees what it has read (boundOutput in package workers), but
// a worker that is stopped, killed or far behind reads nothing, and a command
// that printed a gigabyte meanwhile took a gigabyte of disk until it came back.
// So the shim frees the start of each output file past its last OutputKeepBytes,
// with a hole punched in it: the file keeps its size, and the offsets the worker
// resumes from. A worker that comes back, or reads on after a pause, finds the
// hole and skips it: the output in it is dropped, and counted, as the log drops
// what it cannot keep. A file system that cannot punch holes keeps all of it.
//
// The shim looks at the files once the kernel says a file in the run directory
// was written to (outputWatch), at most at the pace below, so that a command
// that prints nothing costs it nothing; in the portable build, on a timer at
// that pace.

// OutputKeepBytes is how much of the end of each output file the shim keeps. It
// is more than the worker keeps behind what it has read, for a restart to read
// again: a worker that keeps up loses nothing to the shim.
const OutputKeepBytes = 8 << 20

// A file is freed once it takes an eighth more than it keeps (OutputKeepBytes / 8):
// a command that prints all the time has its files freed now and then, not at
// each look.

// The pace of the looks at the output files: about one for each eighth of what
// is kept that the command prints, but at most one a boundGather and at least
// one a boundPoll. A command that starts printing fast after a quiet spell
// prints for a boundPoll at most before a look: 20 MB at 1 GB/s.
const (
	boundGather = 1e6  // nanoseconds
	boundPoll   = 20e6 // nanoseconds
)

// outputLook is the shim's last look at its command's output files: when
// (monotonic nanoseconds), and their size then.
type outputLook struct{ at, size int64 }

// boundOutput frees the start of the run's output files past their last keep
// bytes, and returns when to look again (monotonic nanoseconds), or -1 where the
// file system cannot free part of a file: the files grow to the command's end.
func (c *running) boundOutput(now int64) int64 {
	size := c.outputSize()
	for _, name := range [...]string{StdoutFile, StderrFile} {
		if boundFile(join(c.Dir, name), c.outputKeep) == syscall.EOPNOTSUPP {
			c.outputKeep = 0
			return -1
		}
	}
	next := now + paceLooks(size-c.looked.size, now-c.looked.at, c.outputKeep)
	c.looked = outputLook{now, size}
	return next
}

// paceLooks is how long after a look the next is due, where the output grew by
// grown bytes in the elapsed nanoseconds before it: about the time the command
// takes to print an eighth of keep, within boundGather and boundPoll.
func paceLooks(grown, elapsed, keep int64) int64 {
	if grown <= 0 {
		return boundPoll
	}
	return min(max(min(elapsed, boundPoll)*(keep/8)/grown, boundGather), boundPoll)
}

// boundFile frees the start of the file at path past its last keep bytes, once it
// takes an eighth more than that: whole blocks of the file system, so that
// nothing reads as data where no output is left. It fails with EOPNOTSUPP where
// the file system cannot.
func boundFile(path string, keep int64) error {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil || st.Blocks*512 <= keep+keep/8 {
		return nil
	}
	block := max(int64(st.Blksize), 4<<10)
	upTo := (st.Size - keep) / block * block
	if upTo <= 0 {
		return nil
	}
	fd, err := open(path, syscall.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer syscall.Close(fd)
	return punchHole(fd, upTo)
}
