package workers

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers/shim"
)

// finishedRun makes the directory of a run as its worker and shim leave it: every
// file written, the output and the environment not empty.
func finishedRun(t *testing.T, runs, name string) string {
	t.Helper()
	dir := filepath.Join(runs, name)
	if err := writeIntent(dir); err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string]string{
		shim.StdoutFile: "out of the first run\n", shim.StderrFile: "err\n", "environ": "from a layout gone",
		runFile: `{"task_id":"a","env":["TOKEN=secret"]}`, shim.PIDFile: `{"shim":{"pid":1}}`, shim.ExitFile: `{"exit_code":3}`,
		shim.StartingFile: "", decisionFile: `{"stopped_by":"match"}`, shim.PIDFile + ".tmp": "left by a crash",
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, e := range entries {
		list = append(list, e.Name())
	}
	return list
}

// A finished run's directory becomes the next run's with the inodes of its files
// and with nothing of the first run in it: the files its worker and shim alone
// write are absent (their temp files are there to be opened, the environment's
// empty), and the output files, which no process holds any more, are empty.
func TestARunDirectoryIsRecycledEmptyWithItsInodes(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	first := finishedRun(t, runs, "a-1")
	inodes := map[string]uint64{}
	kept := []string{shim.ExitFile, runFile, shim.PIDFile, shim.StartingFile}
	for _, f := range append(kept, shim.StdoutFile, shim.StderrFile) {
		inodes[f] = inode(t, filepath.Join(first, f))
	}
	pool := newRunPool(runs, 4)
	pool.recycle(first)
	if _, err := os.Stat(first); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the finished run's directory is still there: %v", err)
	}

	next := filepath.Join(runs, "b-1")
	if err := pool.intent(next); err != nil {
		t.Fatal(err)
	}
	want := []string{shim.ExitFile + ".tmp", shim.PIDFile + ".tmp", runFile + ".tmp", shim.StartingFile + ".tmp"}
	outputKept := runtime.GOOS == "linux" // elsewhere no process can be told to hold none
	if outputKept {
		want = append(want, shim.StderrFile, shim.StdoutFile)
	}
	slices.Sort(want)
	if got := names(t, next); !slices.Equal(got, want) {
		t.Fatalf("the next run's directory holds %v, want %v", got, want)
	}
	for _, f := range []string{runFile + ".tmp", shim.StdoutFile, shim.StderrFile} { // the env may hold secrets
		if info, err := os.Stat(filepath.Join(next, f)); (err == nil || outputKept) && (err != nil || info.Size() != 0) {
			t.Errorf("%s: %v, %v: want it empty", f, info, err)
		}
	}
	for f, ino := range inodes {
		path := filepath.Join(next, f+".tmp")
		if !slices.Contains(kept, f) {
			if !outputKept {
				continue
			}
			path = filepath.Join(next, f)
		}
		if got := inode(t, path); got != ino {
			t.Errorf("%s: inode %d, want the first run's %d", filepath.Base(path), got, ino)
		}
	}
	if names(t, runs)[0] != "b-1" || len(names(t, runs)) != 1 {
		t.Fatalf("runs holds %v, want the next run alone", names(t, runs))
	}
}

// A process that still holds a finished run's output (one the command left
// running past its shim, or handed the file to) writes nothing into the output of
// the run that takes the directory next.
func TestOutputWrittenAfterARunEndedStaysOutOfTheNextRun(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	first := finishedRun(t, runs, "a-1")
	out, err := os.OpenFile(filepath.Join(first, shim.StdoutFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A process of its own holds it, and writes to it once told to.
	holder := exec.Command("sh", "-c", `read _; echo "written by a process the first run left" >&3`)
	holder.ExtraFiles = []*os.File{out}
	tell, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	out.Close()
	defer func() { _ = holder.Process.Kill(); _ = holder.Wait() }()

	pool := newRunPool(runs, 4)
	pool.recycle(first)
	next := filepath.Join(runs, "b-1")
	if err := pool.intent(next); err != nil {
		t.Fatal(err)
	}
	if _, err := prepareRun(next, shimRun{TaskID: "b", Epoch: 1, Env: os.Environ(), Dir: t.TempDir()}, engine.Spec{Command: "true"}); err != nil {
		t.Fatal(err)
	}
	tell.Close()
	if err := holder.Wait(); err != nil {
		t.Fatalf("the process holding the first run's output: %v", err)
	}
	for _, f := range []string{shim.StdoutFile, shim.StderrFile} {
		if data, err := os.ReadFile(filepath.Join(next, f)); err != nil || len(data) != 0 {
			t.Errorf("the next run's %s: %q, %v: want it empty", f, data, err)
		}
	}
}

// A run directory is made only where none is: a free one is not put over it.
func TestARecycledIntentRefusesADirectoryThatExists(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	pool := newRunPool(runs, 4)
	pool.recycle(finishedRun(t, runs, "a-1"))
	held := filepath.Join(runs, "b-1")
	if err := writeIntent(held); err != nil {
		t.Fatal(err)
	}
	if err := pool.intent(held); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("intent over an existing run directory: %v, want fs.ErrExist", err)
	}
	if pool.take() == "" {
		t.Fatal("the free directory was not given back")
	}
}

// A directory whose shim still holds the start lock, or one past the pool's
// room, is removed rather than kept: the lock would be the next run's.
func TestARunDirectoryNotFitForAnotherRunIsRemoved(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	pool := newRunPool(runs, 1)
	locked := finishedRun(t, runs, "a-1")
	lock, err := os.Open(locked)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	pool.recycle(locked)
	pool.recycle(finishedRun(t, runs, "b-1"))
	pool.recycle(finishedRun(t, runs, "c-1")) // the pool holds one
	if got := names(t, runs); len(got) != 1 || pool.take() == "" {
		t.Fatalf("runs holds %v, want one free directory", got)
	}
	pool.drain()
}
