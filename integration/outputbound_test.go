package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers/shim"
)

// Output a command prints while its server, and the server's worker, is stopped
// (SIGSTOP) takes no more disk than a run's output files keep: the shim frees
// the rest on its own. The worker, continued, finds a hole where its copy of the
// output goes on, and skips it: a follower of the task's log never gets the zeros
// a hole reads as, and the task fires with the end of the output in its tail.
func TestOutputPrintedWhileTheServerIsStoppedStaysBoundedOnDisk(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	srv := startServer(t, home)
	makeGate(t, dir, "flood")
	makeGate(t, dir, "over")
	id := add(t, home, "--cwd", dir, "--", gate("flood")+"yes 0123456789abcdef | head -c 200000000; echo end; "+gate("over")+"echo after")
	run := filepath.Join(home, "worker", "runs", id+"-1")
	var pids struct{ Shim struct{ PID int } }
	testkit.Eventually(t, 30*time.Second, "the command started", func() bool {
		data, err := os.ReadFile(filepath.Join(run, shim.PIDFile))
		return err == nil && json.Unmarshal(data, &pids) == nil
	})
	followed, err := os.Create(filepath.Join(t.TempDir(), "followed"))
	if err != nil {
		t.Fatal(err)
	}
	defer followed.Close()
	follow := exec.Command(bin, "--home", home, "logs", "--follow", "--stdout", id)
	follow.Env, follow.Stdout, follow.Stderr = childEnv(home), followed, followed
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = follow.Process.Kill() }()

	srv.signal(syscall.SIGSTOP)
	defer srv.signal(syscall.SIGCONT) // where the test fails with the server stopped
	openGate(t, dir, "flood")
	// What the shim keeps, and an eighth more before it frees. While the command
	// prints, what it prints before the shim's next look comes on top: as fast as
	// this machine writes, on a machine busy enough to hold the shim up for a
	// fifth of a second (128 MiB at 640 MB/s), still well short of all it prints.
	const printed, kept, flooding int64 = 200_000_000 + int64(len("end\n")), shim.OutputKeepBytes + shim.OutputKeepBytes/8, 128 << 20
	disk := func() (used, size int64) {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(run, shim.StdoutFile), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512, st.Size
	}
	testkit.Eventually(t, 60*time.Second, "the command's output printed", func() bool {
		used, size := disk()
		if used > kept+flooding {
			t.Fatalf("stdout takes %d bytes of disk once %d are printed with the server stopped, want at most %d", used, size, kept+flooding)
		}
		return size >= printed
	})
	// Its look after the last write leaves what it keeps, and the file system's
	// own blocks of the file's map.
	testkit.Eventually(t, 30*time.Second, "the output freed but for what the shim keeps", func() bool {
		used, _ := disk()
		return used <= kept+64<<10
	})
	srv.signal(syscall.SIGCONT)
	openGate(t, dir, "over")

	w := waitFor(t, home, id)
	last := "0123456789abcdef"[:200_000_000%17] + "end"
	if n := len(w.Tail); w.Status != "succeeded" || n < 2 || w.Tail[n-1] != "after" || w.Tail[n-2] != last {
		t.Fatalf("woke with %s, tail %q: want succeeded, the tail ending %q, %q", w.Status, w.Tail, last, "after")
	}
	if err := waitExit(follow, 60*time.Second); err != nil {
		t.Fatalf("logs --follow: %v", err)
	}
	out, err := os.ReadFile(followed.Name())
	if err != nil {
		t.Fatal(err)
	}
	if zeros := bytes.Count(out, []byte{0}); zeros > 0 || !strings.HasSuffix(string(out), last+"\nafter\n") {
		t.Fatalf("logs --follow printed %d bytes, %d of them zeros, ending %q", len(out), zeros, out[max(0, len(out)-60):])
	}
	auditClean(t, home)
}

// waitExit waits for cmd to end, for at most timeout.
func waitExit(cmd *exec.Cmd, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		return <-done
	}
}
