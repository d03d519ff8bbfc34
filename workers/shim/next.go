package shim

import "syscall"

// A shim whose run has ended can take its worker's next run, so that a short
// task does not pay for the start and the end of a program of its own. Its
// standard input (EnvironFD) is then a socket, on which the two speak:
//
//	shim → worker  Recorded  the run's start is recorded (releaseOutput)
//	shim → worker  Idle      the run is over: its exit is written, what the command
//	                         left is stopped, its start lock closed
//	worker → shim  a run     its arguments' length (4 bytes, little-endian) with the
//	                         run's start lock (SCM_RIGHTS), its arguments
//	                         (ShimArgs, each NUL-terminated), its environment
//	                         (EnvBytes, JoinEnviron)
//
// A run comes whole or not at all: a worker that dies handing it over leaves a
// shim that reads less, starts nothing and ends, and whose end frees the lock.
// One run at a time, each with its own lock: a lock found free still means that
// no shim works on the run, or ever will.
const (
	Recorded = 'R'
	Idle     = 'I'
)

// nextRun says Idle and waits idleAfter nanoseconds at most for the next run. It
// is false when none came whole in that time.
func nextRun(idleAfter int64) (r Run, env []string, lock int, ok bool) {
	if writeAll(EnvironFD, []byte{Idle}) != nil || !awaitReadable(EnvironFD, monotonic()+idleAfter) {
		return r, nil, -1, false
	}
	var head [4]byte
	n, lock, err := receiveLock(EnvironFD, head[:])
	if err != nil || lock < 0 {
		return r, nil, -1, false
	}
	const name = "the next run on standard input"
	if n < len(head) {
		rest, err := readFull(EnvironFD, name, len(head)-n)
		if err != nil {
			syscall.Close(lock)
			return r, nil, -1, false
		}
		copy(head[n:], rest)
	}
	size := int(head[0]) | int(head[1])<<8 | int(head[2])<<16 | int(head[3])<<24
	args, err := readFull(EnvironFD, name, size)
	if err == nil {
		r, err = parseArgs(splitNUL(args))
	}
	if err == nil {
		env, err = readEnviron(r.EnvBytes)
	}
	if err != nil {
		syscall.Close(lock)
		return r, nil, -1, false
	}
	return r, env, lock, true
}

// receiveLock reads into buf from the socket fd, with the descriptor sent beside
// it (close-on-exec), or -1 if none was. Any other descriptors are closed.
func receiveLock(fd int, buf []byte) (n, lock int, err error) {
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for {
		var oobn int
		n, oobn, _, _, err = syscall.Recvmsg(fd, buf, oob, recvCloexec)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0, -1, syscall.EPIPE
		}
		lock = -1
		msgs, _ := syscall.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := syscall.ParseUnixRights(&m)
			for _, f := range fds {
				if lock < 0 {
					lock = f
					syscall.CloseOnExec(f)
				} else {
					syscall.Close(f)
				}
			}
		}
		return n, lock, nil
	}
}
