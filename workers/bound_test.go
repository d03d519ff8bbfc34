package workers_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
	"github.com/bgtask/bgtask/workers/shim"
)

// A command's output files take a bounded part of the disk while it runs, however
// much it prints: what the worker has read and shipped is freed. The files keep
// their offsets, so the tail and the output's size are the command's.
func TestARunsOutputFilesAreBoundedWhileItRuns(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	b.startWorker(t, workers.Config{StateDir: state})
	// seq prints 46.9 and 22.9 MB.
	id := b.arm(t, engine.Spec{Command: `seq 1 6000000; seq 1 3000000 >&2; while [ ! -e go ]; do sleep 0.02; done`, Cwd: dir})
	run := filepath.Join(state, "runs", id+"-1")
	const printed, printedErr = 46_888_896, 22_888_896
	const bound = 12 << 20 // outputKeepBytes and a step of reading ahead
	for _, f := range []struct {
		name string
		size int64
	}{{"stdout", printed}, {"stderr", printedErr}} {
		var st syscall.Stat_t
		testkit.Eventually(t, 60*time.Second, f.name+" read and freed", func() bool {
			return syscall.Stat(filepath.Join(run, f.name), &st) == nil && st.Size == f.size && st.Blocks*512 <= bound
		})
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st := b.waitFor(t, id, 60*time.Second, "ended", ended)
	if st.Status != engine.StatusSucceeded || st.Run == nil || st.Run.OutputBytes != printed+printedErr {
		t.Fatalf("ended %s with run %+v, want succeeded with %d bytes of output", st.Status, st.Run, printed+printedErr)
	}
	// The two streams are read side by side: the tail ends with the last line of
	// the one read last.
	if tail := st.Run.Tail; len(tail) == 0 || tail[len(tail)-1] != "6000000" && tail[len(tail)-1] != "3000000" ||
		strings.ContainsRune(strings.Join(tail, ""), 0) {
		t.Fatalf("tail %q, want the last lines of stdout or stderr", tail)
	}
}

// A worker that restarts after it freed a run's old output resumes where the log
// stands, inside what it kept: the tail and the output's size are the command's.
func TestARunWhoseOutputWasFreedIsWatchedAgainAfterARestart(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	id := b.arm(t, engine.Spec{Command: `seq 1 3000000; while [ ! -e go ]; do sleep 0.02; done; echo after`, Cwd: dir})
	const printed = 22_888_896
	var st syscall.Stat_t
	testkit.Eventually(t, 60*time.Second, "stdout read and freed", func() bool {
		return syscall.Stat(filepath.Join(state, "runs", id+"-1", "stdout"), &st) == nil && st.Size == printed && st.Blocks*512 <= 12<<20
	})
	first.Stop()
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	end := b.waitFor(t, id, 30*time.Second, "ended", ended)
	if end.Status != engine.StatusSucceeded || end.Run == nil || end.Run.OutputBytes != printed+int64(len("after\n")) {
		t.Fatalf("ended %s with run %+v, want succeeded with %d bytes of output", end.Status, end.Run, printed+int64(len("after\n")))
	}
	if tail := end.Run.Tail; len(tail) < 2 || tail[len(tail)-1] != "after" || tail[len(tail)-2] != "3000000" || strings.ContainsRune(strings.Join(tail, ""), 0) {
		t.Fatalf("tail %q, want the command's last lines", tail)
	}
}

// A command that prints far more than a run's output files keep while no worker
// runs takes no more disk than they keep: its shim frees the rest, on its own.
// The worker that comes back goes on after what was freed: the task ends with the
// end of the output in its tail, and the output's size is the command's.
func TestOutputPrintedWhileNoWorkerRunsStaysBounded(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	b := setup(t)
	state, dir := t.TempDir(), t.TempDir()
	first := b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	const printed = 200_000_000 + len("end\n")
	id := b.arm(t, engine.Spec{Cwd: dir, Command: `while [ ! -e go ]; do sleep 0.01; done; yes 0123456789abcdef | head -c 200000000; echo end
while [ ! -e over ]; do sleep 0.01; done; echo after`})
	stdout := filepath.Join(state, "runs", id+"-1", "stdout")
	b.waitFor(t, id, 30*time.Second, "started", hasPID)
	first.Stop()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// What the shim keeps, an eighth more before it frees, and what a command
	// printing as fast as this machine writes adds before the shim's next look on
	// a busy machine (64 MiB: a tenth of a second at 640 MB/s).
	const bound = shim.OutputKeepBytes + shim.OutputKeepBytes/8 + 64<<20
	testkit.Eventually(t, 60*time.Second, "the command's output printed", func() bool {
		var st syscall.Stat_t
		if err := syscall.Stat(stdout, &st); err != nil {
			t.Fatal(err)
		}
		if disk := st.Blocks * 512; disk > bound {
			t.Fatalf("stdout takes %d bytes of disk once %d are printed with no worker running, want at most %d", disk, st.Size, bound)
		}
		return st.Size >= int64(printed)
	})
	b.startWorker(t, workers.Config{ID: "stable", StateDir: state})
	if err := os.WriteFile(filepath.Join(dir, "over"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	end := b.waitFor(t, id, 60*time.Second, "ended", ended)
	if end.Status != engine.StatusSucceeded || end.Run == nil || end.Run.OutputBytes != int64(printed+len("after\n")) {
		t.Fatalf("ended %s with run %+v, want succeeded with %d bytes of output", end.Status, end.Run, printed+len("after\n"))
	}
	tail := end.Run.Tail
	if len(tail) < 3 || tail[len(tail)-1] != "after" || tail[len(tail)-2] != "0123456789abcdef"[:200_000_000%17]+"end" || tail[len(tail)-3] != "0123456789abcdef" ||
		strings.ContainsRune(strings.Join(tail, ""), 0) {
		t.Fatalf("tail %q, want the command's last lines", tail)
	}
}
