package shim

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The worker reads these files into its own types (package workers), whose
// tests run a real shim; this holds the hand-written JSON to what encoding/json
// reads back.
func TestTheFilesTheShimWritesReadBackTheSame(t *testing.T) {
	type exit struct {
		ExitCode   int       `json:"exit_code"`
		Signal     string    `json:"signal"`
		StoppedBy  string    `json:"stopped_by"`
		StartedAt  time.Time `json:"started_at"`
		EndedAt    time.Time `json:"ended_at"`
		StartError string    `json:"start_error"`
	}
	at := time.Date(2026, 11, 30, 9, 13, 34, 397335882, time.UTC)
	for _, want := range []exit{
		{ExitCode: 0, StartedAt: at, EndedAt: at.Add(time.Second)},
		{ExitCode: 143, Signal: "TERM", StoppedBy: StoppedByDeadline, StartedAt: at, EndedAt: at},
		{ExitCode: -1, StartedAt: at, EndedAt: at, StartError: `fork/exec "/no/such": no such file; tab	nl
nul` + "\x00 \x1f <&> é 日本 \u2028"},
	} {
		written := exitRecord{exitCode: want.ExitCode, signal: want.Signal, stoppedBy: want.StoppedBy,
			startedAt: want.StartedAt.UnixNano(), endedAt: want.EndedAt.UnixNano(), startError: want.StartError}.appendJSON(nil)
		var got exit
		if err := json.Unmarshal(written, &got); err != nil {
			t.Fatalf("%s: %v", written, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("read back %+v, want %+v", got, want)
		}
	}
	var got exit
	if err := json.Unmarshal(exitRecord{startError: "bad \xff utf-8"}.appendJSON(nil), &got); err != nil || got.StartError != "bad \ufffd utf-8" {
		t.Errorf("invalid UTF-8 read back as %q (%v), want it replaced", got.StartError, err)
	}

	type pids struct {
		Shim    ProcRef   `json:"shim"`
		Command ProcRef   `json:"command"`
		Started time.Time `json:"started_at"`
	}
	want := pids{Shim: ProcRef{PID: 25486, Start: 2350865}, Command: ProcRef{PID: 1 << 22, Start: 1<<64 - 1}, Started: at}
	written := pidsRecord{shim: want.Shim, command: want.Command, startedAt: at.UnixNano()}.appendJSON(nil)
	var gotPIDs pids
	if err := json.Unmarshal(written, &gotPIDs); err != nil || gotPIDs != want {
		t.Errorf("read back %+v (%v), want %+v", gotPIDs, err, want)
	}
}

// The shim formats times and numbers by hand: they must read as package time
// and strconv write them.
func TestTimesAndNumbersAreWrittenAsTheStandardLibraryWritesThem(t *testing.T) {
	instants := []int64{0, 1, 999_999_999, 1e9, 951782400e9 /* 2000-02-29 */, 4102444799999999999, -1, -86400e9 - 1}
	for range 2000 {
		instants = append(instants, rand.Int64N(4102444800e9)) // to 2100
	}
	for _, ns := range instants {
		want := `"` + time.Unix(0, ns).UTC().Format(time.RFC3339Nano) + `"`
		if got := string(appendTime(nil, ns)); got != want {
			t.Errorf("appendTime(%d) = %s, want %s", ns, got, want)
		}
	}
	for _, n := range []int64{0, 7, -7, 10, 1<<63 - 1, -1 << 63, 4194304} {
		if got := string(appendInt(nil, n)); got != strconv.FormatInt(n, 10) {
			t.Errorf("appendInt(%d) = %s", n, got)
		}
		if n >= 0 {
			if got, ok := parseUint(strconv.FormatInt(n, 10)); !ok || got != uint64(n) {
				t.Errorf("parseUint(%d) = %d, %v", n, got, ok)
			}
		}
		if got, ok := parseInt64(strconv.FormatInt(n, 10)); !ok || got != n {
			t.Errorf("parseInt64(%d) = %d, %v", n, got, ok)
		}
	}
	for _, bad := range []string{"", "-", "1x", "+1", " 1", "18446744073709551616", "99999999999999999999"} {
		if n, ok := parseUint(bad); ok {
			t.Errorf("parseUint(%q) = %d, want it refused", bad, n)
		}
	}
	if got, ok := parseUint("18446744073709551615"); !ok || got != 1<<64-1 {
		t.Errorf("parseUint(max) = %d, %v", got, ok)
	}
}

func TestProcStatReadsWhatTheKernelSays(t *testing.T) {
	state, ppid, start, err := procStat(os.Getpid())
	if err != nil || ppid != os.Getppid() || start == 0 || state != 'R' && state != 'S' {
		t.Fatalf("procStat(self) = %c, %d, %d, %v; want running, parent %d", state, ppid, start, err, os.Getppid())
	}
	if !(ProcRef{PID: os.Getpid(), Start: start}).Alive() || (ProcRef{PID: os.Getpid(), Start: start + 1}).Alive() {
		t.Error("Alive does not tell this process from a PID reused")
	}
	if got := signalName(syscall.SIGTERM) + " " + signalName(syscall.SIGKILL) + " " + signalName(syscall.Signal(40)); got != "TERM KILL 40" {
		t.Errorf("signal names: %s", got)
	}
	if got := splitEnviron(JoinEnviron([]string{"A=1", "B=", "C=x=y"})); !reflect.DeepEqual(got, []string{"A=1", "B=", "C=x=y"}) {
		t.Errorf("environ read back as %q", got)
	}
}

func TestArgumentsReadBackTheSameRun(t *testing.T) {
	for _, want := range []Run{
		{Dir: "/state/runs/a.1", Cwd: "/home/u", Path: "/bin/bash", Args: []string{"bash", "-c", "echo --dir=x -- y"}},
		{Dir: "/d", Cwd: "/", Path: "/bin/sleep", Args: []string{"sleep", "--", "1"}, EnvBytes: 4096,
			Deadline: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC).UnixNano(), StallAfter: int64(90 * time.Second), KillGrace: int64(1500 * time.Millisecond)},
	} {
		got, err := parseArgs(want.ShimArgs())
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseArgs(%q) = %+v, %v; want %+v", want.ShimArgs(), got, err, want)
		}
	}
	for _, bad := range [][]string{
		nil,
		{"--dir=/d"},
		{"--dir=/d", "--env-bytes=0", "--", "/bin/true"},
		{"--dir=/d", "--", "/bin/true", "true"}, // the environment's length
		{"--dir=/d", "--env-bytes=-1", "--", "/bin/true", "true"},
		{"--cwd=/", "--", "/bin/true", "true"},
		{"--dir=/d", "--bogus=1", "--", "/bin/true", "true"},
		{"--dir=/d", "--kill-grace-ns=soon", "--", "/bin/true", "true"},
		{"--dir=/d", "--deadline=2026-01-02T03:04:05Z", "--", "/bin/true", "true"},
		{"/d", "--", "/bin/true", "true"},
	} {
		if _, err := parseArgs(bad); err == nil {
			t.Errorf("parseArgs(%q) = nil error, want one", bad)
		}
	}
}

// A shim lives as long as its command, one per running task, and starts with
// every task: it must not grow the packages that took a third more memory and
// twice the CPU of a start (see the package comment), nor anything of the rest of
// bgtask.
func TestTheShimBinaryStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/bgtask/bgtask/cmd/bgtask-shim").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	heavy := []string{"os", "time", "strconv", "strings", "reflect", "fmt", "io", "path/filepath", "golang.org/x/sys/unix"}
	for dep := range strings.FieldsSeq(string(out)) {
		outside := strings.Contains(dep, ".") && !strings.HasPrefix(dep, "github.com/bgtask/bgtask/workers/shim") && dep != "github.com/bgtask/bgtask/cmd/bgtask-shim"
		if outside || strings.HasPrefix(dep, "encoding/") || strings.HasPrefix(dep, "log") || strings.HasPrefix(dep, "net") || slices.Contains(heavy, dep) {
			t.Errorf("bgtask-shim depends on %s", dep)
		}
	}
}

func TestArgsAreThoseOfTheProcess(t *testing.T) {
	got, err := Args()
	if err != nil || !slices.Equal(got, os.Args[1:]) {
		t.Fatalf("Args() = %q, %v; want %q", got, err, os.Args[1:])
	}
}

// A shim whose environment ends short of the length it was given (its worker died
// while it wrote it) starts nothing and records nothing: the run is one whose
// shim never started, which the worker starts at its next start. Given all of
// it, the same shim runs the command in it.
func TestAShimGivenPartOfItsEnvironmentStartsNothing(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH"), "MARK=whole"})
	for _, given := range [][]byte{nil, env[:len(env)-3], env} {
		dir, marker := t.TempDir(), filepath.Join(t.TempDir(), "ran")
		r := Run{Dir: dir, Cwd: "/", Path: sh, Args: []string{"sh", "-c", `echo "$MARK" > "$0"`, marker}, EnvBytes: int64(len(env))}
		var said bytes.Buffer
		sock, cmd := testShim(t, &said)
		sendRun(t, sock, r, given, 1<<20)
		sock.Close()
		err := cmd.Wait()
		out := said.Bytes()
		ran, _ := os.ReadFile(marker)
		files, _ := os.ReadDir(dir)
		if len(given) == len(env) {
			if err != nil || string(ran) != "whole\n" {
				t.Fatalf("given its whole environment: %v, %s; the command wrote %q, want \"whole\"", err, out, ran)
			}
			continue
		}
		if err == nil || !strings.Contains(string(out), "not whole") || ran != nil || len(files) != 0 {
			t.Errorf("given %d bytes of %d: %v, %q; the command wrote %q; the run directory holds %v: want an error, no command, no file",
				len(given), len(env), err, out, ran, files)
		}
	}
}

// A record written where a writer that died before its rename left a longer temp
// file reads back as itself.
func TestARecordOverALongerTempFileReadsBackWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), PIDFile)
	long := bytes.Repeat([]byte("left by a writer that died "), 400) // over one block
	for _, mode := range []durability{notDurable, syncBeforeRename, syncAfterRename} {
		if err := os.WriteFile(path+".tmp", long, 0o600); err != nil {
			t.Fatal(err)
		}
		record := []byte(`{"exit_code":0}`)
		if err := writeFile(path, record, mode); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, record) {
			t.Fatalf("mode %d: read %q (%v), want %q", mode, got, err, record)
		}
	}
}

// A run is watched while a worker holds the lock of the state directory its
// directory is in, STATE/runs/NAME: not when there is no such lock, nor once
// the worker let go of it. Its exit is written whole either way.
func TestARunIsWatchedWhileItsWorkerHoldsTheStateLock(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "runs", "task-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	exit := exitRecord{exitCode: 3}
	check := func(what string, want bool) {
		t.Helper()
		if got := watched(dir); got != want {
			t.Fatalf("%s: watched %v, want %v", what, got, want)
		}
		if err := (exitFile{dir: dir, fd: -1}).write(exit); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, ExitFile)); err != nil || string(got) != string(exit.appendJSON(nil)) {
			t.Fatalf("%s: the exit file holds %q (%v), want %q", what, got, err, exit.appendJSON(nil))
		}
		if err := KeepExit(dir); err != nil {
			t.Fatalf("%s: keep the exit: %v", what, err)
		}
	}
	check("no state lock", false)
	lock, err := os.OpenFile(filepath.Join(state, WorkerLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	check("a state lock no worker holds", false)
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	check("a state lock a worker holds", true)
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	check("a state lock let go", false)
	if err := KeepExit(t.TempDir()); err != nil {
		t.Errorf("keep the exit of a run with none: %v", err)
	}
}
