package workers

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// DefaultShim is how a worker starts its shim: bgtask-shim from the directory of
// its own binary, a small program, or else this binary in shim mode, which holds
// the memory of all of bgtask.
func DefaultShim() []string {
	if exe, err := os.Executable(); err == nil {
		if light, ok := lightShim(exe); ok {
			return []string{light}
		}
	}
	return []string{selfExe, "shim"}
}

// lightShim is bgtask-shim beside the bgtask binary exe, if it is there and
// speaks this worker's protocol (shim.Protocol): one left from another build
// would start no run this worker hands it.
func lightShim(exe string) (string, bool) {
	light := filepath.Join(filepath.Dir(exe), "bgtask-shim")
	info, err := os.Stat(light)
	if err != nil || !info.Mode().IsRegular() || info.Mode()&0o111 == 0 {
		return light, false
	}
	said, err := exec.Command(light, "--protocol").Output()
	return light, err == nil && string(bytes.TrimSpace(said)) == shim.Protocol
}

// errWorkerStopping: the worker stops, and hands no run to a shim any more.
var errWorkerStopping = errors.New("the worker is stopping")

// shims is the shim a worker hands its runs to (package shim): one process for
// all of them, started with the first run, and again after it ended. A shim the
// worker lets go of (close, or the worker's end) keeps the runs it has until
// they are over, and then ends.
type shims struct {
	cmd []string
	log *slog.Logger // where what the shim says of its own failures goes

	mu     sync.Mutex
	live   *liveShim
	closed bool
}

// liveShim is a shim process this worker started, and its end of the shim's stdin.
type liveShim struct {
	sock *os.File // a socket (shim.EnvironFD)
	said *os.File // the shim's stderr, a pipe, read until the worker lets go of the shim

	mu sync.Mutex // held while a run is sent, whole
	// waiting are the runs sent that the shim has not answered yet, the first
	// sent first; each is told nil once its start is recorded, errShimEnded if
	// the shim ended first, or why the shim could record nothing.
	waiting []chan error
	ended   bool
}

// errShimEnded: the shim ended, or the worker let go of it, before it answered.
var errShimEnded = errors.New("the shim ended")

// hand sends a prepared run in dir to the shim, and returns once the shim has
// answered, or has ended: awaitShim then tells what became of the run. A shim
// that ended before it took the run (it was ending as the run came) leaves it
// to one started for it.
func (s *shims) hand(dir string, run shimRun) error {
	env := shim.JoinEnviron(run.Env)
	args := run.shimArgs(dir, len(env))
	err := s.send(dir, args, env)
	if err == errShimEnded && !taken(dir) {
		err = s.send(dir, args, env)
	}
	if err == errShimEnded {
		return nil
	}
	return err
}

// send sends a run to the live shim, started if there is none, and waits for
// its answer.
func (s *shims) send(dir string, args []string, env []byte) error {
	sh, err := s.shim()
	if err != nil {
		return err
	}
	return sh.send(dir, args, env)
}

// taken says whether a shim took the run in dir: it recorded its start, began
// it, or holds its lock (works on it, or is still to read it from the socket).
func taken(dir string) bool {
	return recorded(dir) || exists(filepath.Join(dir, shim.ExitTempFile)) || shimAlive(dir)
}

// shim returns the live shim, started if there is none.
func (s *shims) shim() (*liveShim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errWorkerStopping
	}
	if s.live != nil {
		if !s.live.gone() {
			return s.live, nil
		}
		// It ended, or stopped taking runs: what it still says is no longer read.
		s.live.letGo()
		s.live = nil
	}
	sh, err := startShim(s.cmd, s.log)
	if err != nil {
		return nil, err
	}
	s.live = sh
	return sh, nil
}

// close lets go of the shim: it takes no run more, and ends once its runs are over.
func (s *shims) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.live != nil {
		s.live.letGo()
		s.live = nil
	}
}

// letGo closes the worker's ends of the shim's stdin and stderr.
func (sh *liveShim) letGo() {
	sh.sock.Close()
	sh.said.Close()
}

// startShim starts a shim in a session of its own, so that it outlives the
// worker and no signal to the worker's process group reaches it. It is this
// process's child until it ends, and reapShims collects it then; if the worker
// ends first, init does. What it says of its own failures on its stderr, a pipe
// (not the worker's stderr, which the shim would hold open past the worker's
// end), goes to log while the worker holds the shim.
func startShim(shimCmd []string, log *slog.Logger) (*liveShim, error) {
	path, err := exec.LookPath(shimCmd[0])
	if err != nil {
		return nil, fmt.Errorf("start the shim: %w", err)
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, err
	}
	defer theirs.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		ours.Close()
		return nil, err
	}
	defer devnull.Close()
	said, stderr, err := os.Pipe()
	if err != nil {
		ours.Close()
		return nil, err
	}
	defer stderr.Close()
	pidfd := -1
	proc, err := os.StartProcess(path, slices.Clone(shimCmd), &os.ProcAttr{
		Env:   shimEnviron(os.Environ()),
		Files: []*os.File{theirs, devnull, stderr},
		Sys:   shimAttr(&pidfd),
	})
	if err != nil {
		ours.Close()
		said.Close()
		return nil, fmt.Errorf("start the shim: %w", err)
	}
	adoptShim(proc, shimRef(proc, pidfd))
	sh := &liveShim{sock: ours, said: said}
	go sh.hear()
	go relay(said, log)
	return sh, nil
}

// send sends the shim a run in dir with its start lock, and waits for its answer.
func (sh *liveShim) send(dir string, args []string, env []byte) error {
	answer, err := sh.post(dir, args, env)
	if err != nil {
		return err
	}
	return <-answer
}

// post sends the shim a run in dir with its start lock, and returns where its
// answer comes.
func (sh *liveShim) post(dir string, args []string, env []byte) (<-chan error, error) {
	lock, err := lockRun(dir)
	if err != nil {
		return nil, err
	}
	// Once sent, the lock is held by the message until the shim takes it, or
	// until the shim ends.
	defer lock.Close()
	var joined []byte
	for _, a := range args {
		joined = append(append(joined, a...), 0)
	}
	msg := append(binary.LittleEndian.AppendUint32(nil, uint32(len(joined))), joined...)
	answer := make(chan error, 1)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.ended {
		return nil, errShimEnded
	}
	sh.waiting = append(sh.waiting, answer)
	if err := sh.write(lock, append(msg, env...)); err != nil {
		// The shim has part of the run, or none: it starts nothing of it and
		// takes no run more.
		sh.sock.Close()
	}
	return answer, nil
}

// write writes a run's message to the shim, with the lock beside it.
func (sh *liveShim) write(lock *os.File, msg []byte) error {
	raw, err := sh.sock.SyscallConn()
	if err != nil {
		return err
	}
	var n int
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		n, serr = unix.SendmsgN(int(fd), msg, unix.UnixRights(int(lock.Fd())), nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	_, err = sh.sock.Write(msg[n:])
	return err
}

// hear reads the shim's answers until it ends, or the worker lets go of it.
func (sh *liveShim) hear() {
	in := bufio.NewReader(sh.sock)
	for {
		answer, err := readAnswer(in)
		sh.mu.Lock()
		if err != nil {
			sh.ended = true
			for _, w := range sh.waiting {
				w <- errShimEnded
			}
			sh.waiting = nil
			sh.mu.Unlock()
			sh.sock.Close()
			return
		}
		if len(sh.waiting) > 0 {
			sh.waiting[0] <- answer
			sh.waiting = sh.waiting[1:]
		}
		sh.mu.Unlock()
	}
}

// relay logs each line the shim writes on its stderr, until its end, or until
// the worker lets go of the shim.
func relay(said *os.File, log *slog.Logger) {
	defer said.Close()
	lines := bufio.NewScanner(said)
	for lines.Scan() {
		log.Error("the shim says", "line", lines.Text())
	}
}

// readAnswer reads the shim's answer to a run: nil where its start is recorded,
// else why nothing is; or err where the shim said no more.
func readAnswer(in *bufio.Reader) (answer, err error) {
	b, err := in.ReadByte()
	if err != nil || b == shim.Recorded {
		return nil, err
	}
	if b != shim.Failed {
		return nil, fmt.Errorf("the shim said %q", b)
	}
	var size [4]byte
	if _, err := io.ReadFull(in, size[:]); err != nil {
		return nil, err
	}
	why := make([]byte, binary.LittleEndian.Uint32(size[:]))
	if _, err := io.ReadFull(in, why); err != nil {
		return nil, err
	}
	return errors.New(string(why)), nil
}

// gone says whether the shim ended, or the worker let go of it.
func (sh *liveShim) gone() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.ended
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
