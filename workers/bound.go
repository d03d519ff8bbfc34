package workers

import (
	"errors"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// tailRereadBytes is how much of a run's output before where the log stands a
// worker reads again after a restart, to rebuild the tail.
const tailRereadBytes = 256 << 10

// outputKeepBytes is how much of each of a run's output files is kept on disk
// behind what the worker has read: what a worker that restarts reads again. It
// resumes where the log stands, which is at most the log writer's pending output
// (events.MaxLogBytes) behind what was read, and reads back from there the line a
// completion rule was matching and the tail.
const outputKeepBytes = events.MaxLogBytes + engine.MatchLineBytes + tailRereadBytes

// punchStep is how far the worker reads on between two frees of an output file.
const punchStep = 1 << 20

// boundOutput frees the disk blocks of a command's output file that the worker
// has read and no restart reads again: the command writes its output straight to
// the file (nothing may block it), so a command that prints a gigabyte would take
// a gigabyte of disk until its end. The file keeps its size and its offsets, with
// a hole where the old output was: the shim's stall check, the log's offsets and a
// restart's resume read it as before. A file system that cannot punch holes keeps
// the whole file, as it did before; the log still keeps only its last part.
type boundOutput struct {
	to      OutputWriter
	file    *os.File // nil: nothing is freed
	offset  int64    // how far into the file the worker has read
	punched int64    // the blocks before this are freed
	log     *slog.Logger
}

// newBoundOutput feeds to what the worker reads of the output file at path from
// offset, and frees what it has read.
func newBoundOutput(path string, offset int64, to OutputWriter, log *slog.Logger) *boundOutput {
	b := &boundOutput{to: to, offset: offset, log: log}
	if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
		b.file = f
	}
	return b
}

func (b *boundOutput) Write(p []byte) (int, error) {
	n, err := b.to.Write(p)
	b.offset += int64(len(p))
	upTo := (b.offset - outputKeepBytes) &^ (4<<10 - 1)
	if b.file != nil && upTo-b.punched >= punchStep {
		// A hole punched again is no harm: a worker after a restart starts at 0.
		perr := punchHole(int(b.file.Fd()), b.punched, upTo-b.punched)
		switch {
		case perr == nil:
			b.punched = upTo
		case errors.Is(perr, unix.EOPNOTSUPP) || errors.Is(perr, unix.ENOSYS):
			b.log.Warn("the file system cannot free a run's old output: its output file grows to the command's end", "file", b.file.Name())
			b.close()
		default:
			b.log.Warn("a run's old output not freed", "file", b.file.Name(), "err", perr)
		}
	}
	return n, err
}

// Skip passes on that the n bytes at the offset read were freed before they were
// read.
func (b *boundOutput) Skip(n int64) {
	b.to.Skip(n)
	b.offset += n
}

func (b *boundOutput) close() {
	if b.file != nil {
		b.file.Close()
		b.file = nil
	}
}

// dataFrom is where the output file at path has data again at or after offset:
// offset itself, unless a previous process of this worker freed the part it starts in.
func dataFrom(path string, offset int64) int64 {
	f, err := os.Open(path)
	if err != nil {
		return offset
	}
	defer f.Close()
	at, err := unix.Seek(int(f.Fd()), offset, unix.SEEK_DATA)
	if err != nil || at < offset {
		return offset // ENXIO: no data after offset, nothing freed past it either
	}
	return at
}

// freedAhead is how many bytes from offset in the output file f, just read there,
// are freed (a hole), which read as zeros, not output. The shim frees the start of
// a file past its last shim.OutputKeepBytes, read or not, whole blocks at a time,
// and never frees less than it freed before: where the file has data again now,
// the read had data.
func freedAhead(f *os.File, offset int64) int64 {
	at, err := unix.Seek(int(f.Fd()), offset, unix.SEEK_DATA)
	if err != nil || at <= offset {
		return 0 // ENXIO: no data from offset on (the file was emptied): nothing taken for freed
	}
	return at - offset
}

// lastData returns up to n bytes of the output file at path that end at offset,
// none of them from a part a worker freed.
func lastData(path string, offset, n int64) []byte {
	from := dataFrom(path, max(0, offset-n))
	if from >= offset {
		return nil
	}
	return lastBytes(path, offset, offset-from)
}
