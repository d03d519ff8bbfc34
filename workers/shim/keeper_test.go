package shim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// testShim starts a shim, this test binary, whose stdin is a socket; its stdout
// and stderr go to out (nil: nowhere). It returns the test's end of the socket,
// closed when the test ends.
func testShim(t *testing.T, out io.Writer) (*os.File, *exec.Cmd) {
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
	cmd := exec.Command(os.Args[0], "shim")
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

// handRun hands the shim a run whole and fails the test unless it says the
// start is recorded; said is what the shim wrote, for the failure (nil: none).
func handRun(t *testing.T, sock *os.File, r Run, env []byte, said *bytes.Buffer) {
	t.Helper()
	sendRun(t, sock, r, env, 1<<20)
	if !says(sock, Recorded) {
		var out []byte
		if said != nil {
			out = said.Bytes()
		}
		t.Fatalf("%s: the shim did not say the run's start was recorded: %s", r.Dir, out)
	}
}

// sendRun hands the shim a run with its directory's start lock, taken as a
// worker takes it: all of it, or the first part bytes of what follows the lock.
func sendRun(t *testing.T, sock *os.File, r Run, env []byte, part int) {
	t.Helper()
	sendArgs(t, sock, r.Dir, r.ShimArgs(), env, part)
}

// sendArgs sends the shim a run's message, its arguments args and environment
// env, with the start lock of the run directory dir: all of it, or the first
// part bytes of what follows the lock.
func sendArgs(t *testing.T, sock *os.File, dir string, shimArgs []string, env []byte, part int) {
	t.Helper()
	lock, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var args []byte
	for _, a := range shimArgs {
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

type exitJSON struct {
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal"`
	StoppedBy string    `json:"stopped_by"`
	StartedAt time.Time `json:"started_at"`
}

func readExit(t *testing.T, dir string) exitJSON {
	t.Helper()
	var e exitJSON
	readRecord(t, filepath.Join(dir, ExitFile), &e)
	return e
}

// readRecord reads one of the JSON files the shim writes into v.
func readRecord(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		t.Fatalf("%s: %v (%s)", path, err, data)
	}
}

type pidsJSON struct {
	Shim      ProcRef   `json:"shim"`
	Command   ProcRef   `json:"command"`
	StartedAt time.Time `json:"started_at"`
}

func readPIDs(t *testing.T, dir string) pidsJSON {
	t.Helper()
	var p pidsJSON
	readRecord(t, filepath.Join(dir, PIDFile), &p)
	return p
}

// goOn writes a line to the FIFO a command reads to go on. It holds the FIFO
// open for the rest of the test rather than waiting for a reader: where the
// command ended before it read, a write that waited would wait for ever.
func goOn(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_RDWR, 0) // Linux opens a FIFO for both ends at once
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
}

// fifo makes a FIFO for a command to wait on (goOn).
func fifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "go")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// shRun is a run of sh -c script, with an environment of env bytes.
func shRun(t *testing.T, env []byte, script string, args ...string) Run {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	return Run{Dir: t.TempDir(), Cwd: "/", Path: sh, Args: append([]string{"sh", "-c", script}, args...), EnvBytes: int64(len(env))}
}

// runEnv is the environment of a run's command, marked as run name's.
func runEnv(name string) []byte {
	return JoinEnviron([]string{"PATH=" + os.Getenv("PATH"), RunEnv + "=" + name})
}

// lockFree says whether no shim holds the start lock of the run in dir.
func lockFree(t *testing.T, dir string) bool {
	t.Helper()
	lock, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	return syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

// One shim keeps many runs at once, each command its own child: no process of
// bgtask's runs per command. It says each start is recorded as the runs come,
// writes each exit as its command ends, frees each run's lock then, and ends
// once its worker is gone and the last command has ended.
func TestAShimKeepsManyRunsAtOnce(t *testing.T) {
	env := runEnv("many")
	gate := fifo(t)
	long, three, four := shRun(t, env, `echo $PPID; read x < "$0"; exit 7`, gate), shRun(t, env, "echo $PPID; exit 3"), shRun(t, env, "echo $PPID; exit 4")
	var said bytes.Buffer
	sock, cmd := testShim(t, &said)
	for _, r := range []Run{long, three, four} {
		handRun(t, sock, r, env, &said)
	}
	for _, r := range []Run{long, three, four} {
		if p := readPIDs(t, r.Dir); p.Shim.PID != cmd.Process.Pid {
			t.Fatalf("%s: pid.json names shim %d, want %d", r.Dir, p.Shim.PID, cmd.Process.Pid)
		}
	}
	for _, r := range []struct {
		Run
		code int
	}{{three, 3}, {four, 4}} {
		testkit.Eventually(t, 10*time.Second, r.Dir+" over", func() bool { return lockFree(t, r.Dir) })
		if e := readExit(t, r.Dir); e.ExitCode != r.code {
			t.Errorf("%s: exit %+v, want code %d", r.Dir, e, r.code)
		}
	}
	sock.Close()
	if lockFree(t, long.Dir) {
		t.Fatal("the long run's lock is free while its command runs")
	}
	goOn(t, gate)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
	}
	if e := readExit(t, long.Dir); e.ExitCode != 7 || !e.StartedAt.Equal(readPIDs(t, long.Dir).StartedAt) {
		t.Errorf("the long run's exit %+v, want code 7, started as pid.json says", e)
	}
	for _, r := range []Run{long, three, four} {
		if ppid, _ := os.ReadFile(filepath.Join(r.Dir, StdoutFile)); string(ppid) != strconv.Itoa(cmd.Process.Pid)+"\n" {
			t.Errorf("%s: the command's parent was %q, want the shim, %d", r.Dir, ppid, cmd.Process.Pid)
		}
	}
	if !lockFree(t, long.Dir) {
		t.Error("the long run's lock is held once the shim ended")
	}
}

// A run handed over in part (the worker died handing it over) starts nothing, and
// the shim takes no run more: it ends with an error once its runs are over.
func TestAShimHandedPartOfARunStartsNothing(t *testing.T) {
	env := runEnv("part")
	whole, part := shRun(t, env, "exit 3"), shRun(t, env, "exit 5")
	var said bytes.Buffer
	sock, cmd := testShim(t, &said)
	handRun(t, sock, whole, env, &said)
	sendRun(t, sock, part, env, 5)
	sock.Close()
	if err := cmd.Wait(); err == nil || !strings.Contains(said.String(), "not whole") {
		t.Fatalf("the shim, handed part of a run, ended with %v: %s; want an error that says the run is not whole", err, said.Bytes())
	}
	if e := readExit(t, whole.Dir); e.ExitCode != 3 {
		t.Errorf("the whole run's exit %+v, want code 3", e)
	}
	if files, _ := os.ReadDir(part.Dir); len(files) != 0 {
		t.Errorf("a run handed over in part left %v", files)
	}
}

// One shim keeps each run's deadline and stall kill.
func TestAShimKeepsEachRunsTimers(t *testing.T) {
	env := runEnv("timers")
	deadline := shRun(t, env, "exec sleep 60")
	deadline.Deadline = time.Now().Add(2 * time.Second).UnixNano()
	stall := shRun(t, env, "echo once; exec sleep 60")
	stall.StallAfter = int64(2 * time.Second)
	var said bytes.Buffer
	sock, cmd := testShim(t, &said)
	for _, r := range []Run{deadline, stall} {
		handRun(t, sock, r, env, &said)
	}
	sock.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
	}
	for _, c := range []struct {
		run Run
		by  string
	}{{deadline, StoppedByDeadline}, {stall, StoppedByStall}} {
		if e := readExit(t, c.run.Dir); e.StoppedBy != c.by || e.Signal != "TERM" {
			t.Errorf("%s: exit %+v, want stopped by %q with signal TERM", c.run.Dir, e, c.by)
		}
	}
}

// A command outlives its shim killed: the worker above the shim, a subreaper,
// learns how it ends (package workers).
func TestACommandOutlivesItsShim(t *testing.T) {
	env := runEnv("outlives")
	r := shRun(t, env, "exec sleep 60")
	sock, cmd := testShim(t, nil)
	handRun(t, sock, r, env, nil)
	p := readPIDs(t, r.Dir)
	defer func() { _ = syscall.Kill(p.Command.PID, syscall.SIGKILL) }()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !p.Command.Alive() {
		t.Fatalf("the command %+v died with its shim", p.Command)
	}
}

// A run the shim cannot read (its arguments make no run) ends what the shim
// takes: it closes its end of the socket, so that the worker, which waits for an
// answer to each run it sent, learns that none comes; the runs it has go on to
// their end.
func TestAShimThatCannotReadARunClosesItsEnd(t *testing.T) {
	env := runEnv("unread")
	gate := fifo(t)
	long := shRun(t, env, `read x < "$0"; exit 7`, gate)
	var said bytes.Buffer
	sock, cmd := testShim(t, &said)
	handRun(t, sock, long, env, &said)
	sendArgs(t, sock, t.TempDir(), []string{"bogus"}, nil, 1<<20)
	// The shim's end closes at once, with nothing said; one kept open fails the
	// read after 10 s, where the worker would wait for ever.
	timeout := syscall.NsecToTimeval((10 * time.Second).Nanoseconds())
	if err := syscall.SetsockoptTimeval(int(sock.Fd()), syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &timeout); err != nil {
		t.Fatal(err)
	}
	if answer, err := io.ReadAll(sock); err != nil || len(answer) > 0 {
		t.Fatalf("the shim said %q (%v) to a run it could not read, want its end closed with nothing said", answer, err)
	}
	if lockFree(t, long.Dir) {
		t.Fatal("the running run's lock is free")
	}
	goOn(t, gate)
	if err := cmd.Wait(); err == nil || !strings.Contains(said.String(), "bogus") {
		t.Errorf("the shim ended with %v: %s; want the error that names the argument", err, said.Bytes())
	}
	if e := readExit(t, long.Dir); e.ExitCode != 7 {
		t.Errorf("the running run's exit %+v, want code 7", e)
	}
}
