package shim

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// testShim starts a shim, this test binary, whose stdin is a socket, waiting idle
// nanoseconds for another run once one is over; its stdout and stderr go to out
// (nil: nowhere). It returns the test's end of the socket, closed when the test
// ends.
func testShim(t *testing.T, idle int64, out io.Writer) (*os.File, *exec.Cmd) {
	t.Helper()
	syscall.ForkLock.RLock() // the test's end must not reach the shim
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
	defer theirs.Close()
	cmd := exec.Command(os.Args[0], "shim", "--idle-ns="+strconv.FormatInt(idle, 10))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = theirs, out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ours.Close() })
	return ours, cmd
}

// says reads what the shim says until want; false if it ends first.
func says(sock *os.File, want byte) bool {
	var b [1]byte
	for {
		if n, _ := sock.Read(b[:]); n == 0 {
			return false
		}
		if b[0] == want {
			return true
		}
	}
}

// sendRun hands the shim a run with its directory's start lock: all of it, or
// the first part bytes of what follows the lock.
func sendRun(t *testing.T, sock *os.File, r Run, env []byte, part int) {
	t.Helper()
	lock, err := os.Open(r.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	var args []byte
	for _, a := range r.ShimArgs() {
		args = append(append(args, a...), 0)
	}
	head := binary.LittleEndian.AppendUint32(nil, uint32(len(args)))
	if err := syscall.Sendmsg(int(sock.Fd()), head, syscall.UnixRights(int(lock.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	rest := append(args, env...)
	if _, err := sock.Write(rest[:min(part, len(rest))]); err != nil {
		t.Fatal(err)
	}
}

// A shim whose run is over takes the next run handed to it whole, in its own run
// directory, and says when its start is recorded and when it is idle again; a
// run handed over in part starts nothing, and the shim ends.
func TestAShimTakesTheNextRunHandedToItWhole(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	run := func(code string) Run {
		return Run{Dir: t.TempDir(), Cwd: "/", Path: sh, Args: []string{"sh", "-c", "exit " + code}, EnvBytes: int64(len(env))}
	}
	first, second, third := run("3"), run("4"), run("5")
	var said bytes.Buffer
	sock, cmd := testShim(t, 20e9, &said)
	for _, r := range []Run{first, second} {
		sendRun(t, sock, r, env, 1<<20)
		if !says(sock, Recorded) || !says(sock, Idle) {
			t.Fatalf("the shim did not say its run's start was recorded, then that it was idle: %s", said.Bytes())
		}
	}
	for _, r := range []struct {
		Run
		code int
	}{{first, 3}, {second, 4}} {
		data, err := os.ReadFile(filepath.Join(r.Dir, ExitFile))
		if err != nil {
			t.Fatal(err)
		}
		want := `"exit_code":` + string(appendInt(nil, int64(r.code)))
		if !strings.Contains(string(data), want) {
			t.Errorf("%s: %s, want %s", r.Dir, data, want)
		}
		if lock, err := os.Open(r.Dir); err == nil {
			if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				t.Errorf("%s: the start lock is still held once the run is over", r.Dir)
			}
			lock.Close()
		}
	}

	sendRun(t, sock, third, env, 5) // the worker died handing it over
	sock.Close()
	if err := cmd.Wait(); err == nil { // its stderr went with its first run's start
		t.Fatal("the shim, handed part of a run, ended as if all was well")
	}
	if files, _ := os.ReadDir(third.Dir); len(files) != 0 {
		t.Errorf("a run handed over in part left %v", files)
	}
}
