//go:build linux

package workers

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/workers/shim"
)

// copied records what a copy of an output file fed it.
type copied struct {
	data    bytes.Buffer
	skipped int64
}

func (c *copied) Write(p []byte) (int, error) { return c.data.Write(p) }
func (c *copied) Skip(n int64)                { c.skipped += n }

// A copy that comes to a part of an output file the shim freed before the worker
// read it (it was away, or far behind) skips it: the hole reads as zeros, which
// are no output. What follows is copied, at its own offset in the file.
func TestACopySkipsOutputFreedBeforeItWasRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), shim.StdoutFile)
	line := bytes.Repeat([]byte("x"), 1<<20-1)
	line = append(line, '\n')
	output := append(bytes.Repeat(line, 3), "last\n"...)
	if err := os.WriteFile(path, output, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const freed = 2 << 20 // the first two lines: whole blocks, as the shim frees them
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, freed)
	f.Close()
	if err != nil {
		t.Skipf("this file system cannot punch holes: %v", err)
	}
	n := newNotifier(slog.New(slog.DiscardHandler))
	defer n.close()
	var got copied
	file := &growingFile{path: path, w: &got}
	if copyGrowing(n, []*growingFile{file}).stop(); file.offset != int64(len(output)) {
		t.Fatalf("copied up to %d, want %d", file.offset, len(output))
	}
	if got.skipped != freed || !bytes.Equal(got.data.Bytes(), output[freed:]) {
		t.Fatalf("skipped %d and copied %d bytes (%d zeros), want %d skipped and the %d after them",
			got.skipped, got.data.Len(), bytes.Count(got.data.Bytes(), []byte{0}), freed, len(output)-freed)
	}
}

// The shim keeps more of each output file than a restarted worker reads again,
// so a worker that keeps up with its command never finds a hole the shim made.
func TestTheShimKeepsMoreThanARestartReads(t *testing.T) {
	if outputKeepBytes+punchStep > shim.OutputKeepBytes {
		t.Fatalf("the worker keeps %d bytes behind what it read (and frees %d at a time); the shim keeps %d",
			outputKeepBytes, punchStep, shim.OutputKeepBytes)
	}
}

// A line a gap in the output broke is matched by no rule: what is left of it,
// before or after the gap, is not the line the command printed.
func TestALineAGapBrokeIsNotMatched(t *testing.T) {
	watch := newLineWatch(func(line []byte) bool { return string(line) == "BUILD OK" }, nil)
	_, _ = watch.Write([]byte("BUILD OK, or not: "))
	watch.Skip(1 << 20)
	_, _ = watch.Write([]byte("BUILD OK\n"))
	if line, ok := watch.result(); ok {
		t.Fatalf("matched %q, the end of a line a gap broke", line)
	}
	_, _ = watch.Write([]byte("BUILD OK\n"))
	if line, ok := watch.result(); !ok || line != "BUILD OK" {
		t.Fatalf("matched %q, %v; want the whole line after the broken one", line, ok)
	}
}
