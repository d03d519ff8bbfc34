package shim

import (
	"errors"
	"syscall"
)

// A shim reads its runs on its standard input (EnvironFD), a socket, on which it
// also answers: it can then take its worker's next run once its own is over, so
// that a short task does not pay for the start and the end of a program of its
// own. The two speak:
//
//	worker → shim  a run     its arguments' length (4 bytes, little-endian) with the
//	                         run's start lock (SCM_RIGHTS), its arguments
//	                         (ShimArgs, each NUL-terminated), its environment
//	                         (EnvBytes, JoinEnviron)
//	shim → worker  Recorded  the run's start is recorded (releaseOutput)
//	shim → worker  Idle      the run is over: its exit is written, what the command
//	                         left is stopped, its start lock closed
//
// A run comes whole or not at all: a worker that dies handing it over leaves a
// shim that reads less, starts nothing and ends, and whose end frees the lock.
// One run at a time, each with its own lock, held until the run is over: a lock
// found free means that no shim works on the run, or ever will.
const (
	Recorded = 'R'
	Idle     = 'I'
)

// Protocol names how a worker and a shim speak, which `bgtask-shim --protocol`
// prints: a worker uses a bgtask-shim of another build only if it says the same.
const Protocol = "bgtask-shim protocol 2: runs on stdin"

// receiveRun waits until the monotonic time until (-1: for ever) for a run. It
// returns no run, and no error, where none came in that time, or the worker
// closed its end; and an error where a run came in part.
func receiveRun(until int64) (r Run, env []string, lock int, err error) {
	const name = "the run on standard input"
	if !awaitReadable(EnvironFD, until) {
		return r, nil, -1, nil
	}
	var head [4]byte
	n, lock, err := receiveLock(EnvironFD, head[:])
	if err != nil || n == 0 {
		return r, nil, -1, err
	}
	if lock < 0 {
		return r, nil, -1, errors.New(name + ": no start lock came with it")
	}
	fail := func(err error) (Run, []string, int, error) {
		syscall.Close(lock)
		return Run{}, nil, -1, err
	}
	if n < len(head) {
		rest, err := readFull(EnvironFD, name, len(head)-n)
		if err != nil {
			return fail(err)
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
		return fail(err)
	}
	return r, env, lock, nil
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
			return 0, -1, nil // the worker's end is closed, or unusable: no run comes
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
