package workers

import (
	"encoding/binary"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// A shim whose run has ended waits a while for the worker's next run (see
// shim.receiveRun), so that a short task costs no program start and end of its own:
// on the machines measured, those were half of a shim's CPU and a sixth of a task's.
// Each run still has a shim of its own for its whole life, and its own start lock.
const (
	// shimIdleAfter is how long an idle shim waits for a run before it ends.
	shimIdleAfter = 2 * time.Second
	// spareUseWithin is how long after it became idle the worker still hands a shim
	// a run: well before shimIdleAfter, so that a shim rarely ends as its run comes.
	spareUseWithin = time.Second
	// maxSpareShims bounds the idle shims a worker keeps.
	maxSpareShims = 16
	// spareRunsWithin is how long a run may last for its shim to be kept as a
	// spare after it: the worker waits for a run's end on the shim's socket, a
	// goroutine for each run, which a long run would hold to save the start of one
	// shim. Past it the worker closes the socket, and the shim ends with its run.
	spareRunsWithin = 2 * time.Second
)

// spareShims are the worker's idle shims, the latest first out, and those whose
// runs go on, to be idle next.
type spareShims struct {
	max int

	mu     sync.Mutex
	idle   []*liveShim
	busy   map[*liveShim]bool
	closed bool
}

// running counts sh as busy with a run, whose end it says (shim.Idle) on its socket.
func (p *spareShims) running(sh *liveShim) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.busy == nil {
		p.busy = map[*liveShim]bool{}
	}
	p.busy[sh] = true
	return true
}

// take returns an idle shim fit for a run, or nil; it ends those too long idle.
func (p *spareShims) take() *liveShim {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		sh := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if time.Since(sh.idle) < spareUseWithin {
			return sh
		}
		sh.sock.Close()
	}
	return nil
}

// put keeps an idle shim for a run to come, or ends it where there is no room.
func (p *spareShims) put(sh *liveShim) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.busy, sh)
	if p.closed || len(p.idle) >= p.max {
		sh.sock.Close()
		return
	}
	p.idle = append(p.idle, sh)
}

// forget lets go of a busy shim that ended.
func (p *spareShims) forget(sh *liveShim) {
	sh.sock.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.busy, sh)
}

// close ends the idle shims; those busy end once their runs are over, as they
// would after the worker's end.
func (p *spareShims) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, sh := range p.idle {
		sh.sock.Close()
	}
	for sh := range p.busy {
		sh.sock.Close()
	}
	p.idle, p.busy = nil, nil
}

// shimFor readies the shim of a prepared run: an idle one, or one started for it.
func (w *Worker) shimFor(dir string, run shimRun) (*startingShim, error) {
	if sh := w.spares.take(); sh != nil {
		return &startingShim{dir: dir, shimCmd: w.cfg.Shim, run: run, env: shim.JoinEnviron(run.Env), sh: sh, spares: w.spares}, nil
	}
	s, err := startShim(w.cfg.Shim, dir, run)
	if err == nil {
		s.spares = w.spares
	}
	return s, err
}

// send hands an idle shim a run in dir, with its start lock.
func (sh *liveShim) send(dir string, args []string, env []byte) error {
	lock, err := lockRun(dir)
	if err != nil {
		return err
	}
	// Once sent, the lock is held by the message until the shim takes it, or
	// until the shim ends.
	defer lock.Close()
	var joined []byte
	for _, a := range args {
		joined = append(append(joined, a...), 0)
	}
	head := binary.LittleEndian.AppendUint32(nil, uint32(len(joined)))
	raw, err := sh.sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), head, unix.UnixRights(int(lock.Fd())), nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	_, err = sh.sock.Write(append(joined, env...))
	return err
}

// await reads what the shim says until it says want; false if it ends first, or
// if by (zero: none) passes first.
func (sh *liveShim) await(want byte, by time.Time) bool {
	if sh.sock.SetReadDeadline(by) != nil {
		return false
	}
	var b [1]byte
	for {
		if n, err := sh.sock.Read(b[:]); n == 0 || err != nil {
			return false
		}
		if b[0] == want {
			return true
		}
	}
}

// socketPair makes the socket a shim's stdin is: the worker's end, read through
// the runtime's poller, and the shim's, which blocks.
func socketPair() (ours, theirs *os.File, err error) {
	// As os does: no process starts between the pair's making and its close-on-exec.
	syscall.ForkLock.RLock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.CloseOnExec(fds[0])
		unix.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "shim socket"), os.NewFile(uintptr(fds[1]), "shim stdin"), nil
}
