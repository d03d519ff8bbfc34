package shim

import (
	"errors"
	"syscall"
)

// A shim reads its runs on its standard input (EnvironFD), a socket, on which it
// also answers. The two speak:
//
//	worker → shim  a run     its arguments' length (4 bytes, little-endian) with the
//	                         run's start lock (SCM_RIGHTS), its arguments
//	                         (ShimArgs, each NUL-terminated), its environment
//	                         (EnvBytes, JoinEnviron)
//	shim → worker  Recorded  the run's start is recorded: its PIDs, or its start
//	                         error in the exit file
//	shim → worker  Failed    nothing is recorded, and why: its length (4 bytes,
//	                         little-endian), the text
//
// Each run has one answer or the other, in the order the runs came, unless the
// shim cannot read a run: it then takes no run more and closes its end, and the
// runs after the last answer are not its.
//
// A run comes whole or not at all: a worker that dies handing it over leaves a
// shim that reads less, starts nothing of it and takes no run more. Each run
// has its own lock, which the shim holds until the run is over (its exit written,
// what its command left stopped): a lock found free means that no shim works on
// the run, or ever will.
const (
	Recorded = 'R'
	Failed   = 'F'
)

// Protocol names how a worker and a shim speak, which `bgtask-shim --protocol`
// prints: a worker uses a bgtask-shim of another build only if it says the same.
const Protocol = "bgtask-shim protocol 4: many runs at once on stdin, a start marked by the exit's temp file"

// receiveRun reads the run the worker sends, once EnvironFD can be read. It
// returns no run, and no error, where the worker closed its end; and an error
// where a run came in part.
func receiveRun() (r Run, env []string, lock int, err error) {
	const name = "the run on standard input"
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
