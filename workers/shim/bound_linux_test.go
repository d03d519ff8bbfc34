//go:build linux

package shim

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// floodBytes is what floodRun's command prints before its last line, "end".
const floodBytes = 200_000_000

// floodRun is a run whose command prints floodBytes and then "end" once the file
// gate exists, and waits for gate.end to exist before it exits.
func floodRun(t *testing.T, env []byte, gate string) Run {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	script := `while [ ! -e "$0" ]; do sleep 0.01; done; yes 0123456789abcdef | head -c ` +
		string(appendInt(nil, floodBytes)) + `; echo end; while [ ! -e "$0.end" ]; do sleep 0.01; done`
	return Run{Dir: t.TempDir(), Cwd: "/", Path: sh, Args: []string{"sh", "-c", script, gate}, EnvBytes: int64(len(env))}
}

// outputBound is the most disk an output file may take: what the shim keeps, an
// eighth more before it frees, and what a command printing as fast as this
// machine writes adds before the shim's next look on a busy machine (64 MiB: a
// tenth of a second at 640 MB/s).
const outputBound = OutputKeepBytes + OutputKeepBytes/8 + 64<<20

// peakWhileFlooding opens gate and returns the most disk the run's stdout took
// (blocks allocated) until the command printed all of it, which is then whole at
// its end.
func peakWhileFlooding(t *testing.T, r Run, gate string) int64 {
	t.Helper()
	path, size := filepath.Join(r.Dir, StdoutFile), int64(floodBytes+len("end\n"))
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var peak int64
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("the command's %d bytes printed", size), func() bool {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, st.Blocks*512)
		return st.Size == size
	})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	end := make([]byte, OutputKeepBytes)
	if _, err := f.ReadAt(end, size-int64(len(end))); err != nil {
		t.Fatal(err)
	}
	if want := floodEnd(len(end)); !bytes.Equal(end, want) {
		t.Fatalf("the last %d bytes of the output are not the command's: %d zeros, ending %q", len(end), bytes.Count(end, []byte{0}), end[len(end)-40:])
	}
	return peak
}

// floodEnd is the last n bytes that floodRun's command prints.
func floodEnd(n int) []byte {
	const line = "0123456789abcdef\n"
	end := make([]byte, 0, n)
	for off := floodBytes + len("end\n") - n; off < floodBytes; off++ {
		end = append(end, line[off%len(line)])
	}
	return append(end, "end\n"...)
}

// A shim keeps its command's output files within their bound with no worker
// reading them: a command that prints 200 MB takes a few MiB of disk, and the
// end of its output is kept, at its offsets; the shim looks once the output
// changes, or, in the portable build, on a timer.
func TestAShimBoundsTheOutputNoWorkerReads(t *testing.T) {
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	gate := filepath.Join(t.TempDir(), "go")
	r := floodRun(t, env, gate)
	sock, cmd := testShim(t, nil)
	handRun(t, sock, r, env, nil)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if peak := peakWhileFlooding(t, r, gate); peak > outputBound {
		t.Fatalf("the output file took %d bytes of disk while its command printed %d, want at most %d", peak, floodBytes, outputBound)
	}
	if err := os.WriteFile(gate+".end", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v", err)
	}
}
