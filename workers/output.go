package workers

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgtask/bgtask/engine"
)

// OutputWriter takes one stream of a command's output as the worker reads it
// from its file: its bytes, and a count of the bytes the worker never read
// (Skip), freed by the shim while the worker was away or far behind (see
// package shim's bound.go). What comes after a skip does not follow on from what
// came before it.
type OutputWriter interface {
	io.Writer
	Skip(n int64)
}

// output is where one stream of a command's output goes: every writer it feeds
// never blocks, so reading it never slows the command down more than a copy.
type output struct {
	writers []OutputWriter
	last    *atomic.Int64 // unix nanos of the last output on any stream
}

func (o output) Write(p []byte) (int, error) {
	o.last.Store(time.Now().UnixNano())
	for _, w := range o.writers {
		_, _ = w.Write(p) // Tail, LogWriter and lineWatch never fail
	}
	return len(p), nil
}

func (o output) Skip(n int64) {
	o.last.Store(time.Now().UnixNano())
	for _, w := range o.writers {
		w.Skip(n)
	}
}

// lineWatch applies a completion rule to each stdout line. A line longer than
// engine.MatchLineBytes is matched on its beginning; the rest is skipped without
// being kept, so no line is too long to read.
type lineWatch struct {
	match engine.LineMatcher
	// onMatch is called with the matched line before Write returns: what follows
	// the watch in an output (the log) gets the line only after it.
	onMatch  func(line string)
	mu       sync.Mutex
	line     []byte
	skipping bool    // the current line's beginning is unknown: it is not matched
	matched  *string // the first line that matched
	hit      chan struct{}
}

func newLineWatch(match engine.LineMatcher, onMatch func(string)) *lineWatch {
	return &lineWatch{match: match, onMatch: onMatch, hit: make(chan struct{})}
}

// resume starts the watch in the middle of the output, at offset in the stdout file
// at path: after a restart, the line the previous watch was reading when it
// stopped is read again from its beginning. A beginning more than
// engine.MatchLineBytes back is not looked for: that line is not matched.
func (l *lineWatch) resume(path string, offset int64) {
	if offset <= 0 {
		return
	}
	partial := lastData(path, offset, min(offset, engine.MatchLineBytes))
	if i := bytes.LastIndexByte(partial, '\n'); i >= 0 {
		partial = partial[i+1:]
	} else if int64(len(partial)) < offset { // the line began before what is left of it
		l.mu.Lock()
		l.skipping = true
		l.mu.Unlock()
		return
	}
	_, _ = l.Write(partial)
}

func (l *lineWatch) Write(p []byte) (int, error) {
	n := len(p)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.skipping {
		_, rest, newline := bytes.Cut(p, []byte{'\n'})
		if !newline {
			return n, nil
		}
		l.skipping, p = false, rest
	}
	for len(p) > 0 && l.matched == nil {
		chunk, rest, newline := bytes.Cut(p, []byte{'\n'})
		if room := engine.MatchLineBytes - len(l.line); len(chunk) > room {
			chunk = chunk[:room]
		}
		l.line = append(l.line, chunk...)
		if !newline {
			break
		}
		l.check()
		p = rest
	}
	return n, nil
}

// Skip drops the line being read: its end was freed before it was read, and the
// next line's beginning is unknown, so neither is matched.
func (l *lineWatch) Skip(int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.line, l.skipping = l.line[:0], true
}

// check matches the line collected so far and starts the next one.
func (l *lineWatch) check() {
	line := bytes.TrimSuffix(l.line, []byte{'\r'})
	if l.match(line) {
		kept := line[:min(len(line), MaxLineBytes)]
		s := string(bytes.ToValidUTF8(kept, []byte("\uFFFD")))
		l.matched = &s
		if l.onMatch != nil {
			l.onMatch(s)
		}
		close(l.hit)
	}
	l.line = l.line[:0]
}

// matchedBefore sets the line a previous watch of the same run matched.
func (l *lineWatch) matchedBefore(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.matched == nil {
		l.matched = &line
		close(l.hit)
	}
}

// finish matches a last line that ended without a newline.
func (l *lineWatch) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.matched == nil && len(l.line) > 0 {
		l.check()
	}
}

// result returns the matched line, if any.
func (l *lineWatch) result() (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.matched == nil {
		return "", false
	}
	return *l.matched, true
}

// growingFile is an output file that a command is still writing, copied into w;
// offset is how far.
type growingFile struct {
	path   string
	offset int64
	w      OutputWriter

	file  *os.File
	ended bool // a read failed: copied no further
}

// copier copies files that a command is still writing (a run's output files)
// into their writers, from their offsets, until stop; their offsets say where
// it reached. One look copies all of a run's files, each a buffer at a time in
// turn, so that a command that floods one never holds up the other. A look runs
// when a file grew (looks): no goroutine waits for a quiet command's output.
// What the shim freed before it was read is skipped, not copied: it reads as
// zeros.
type copier struct {
	files  []*growingFile
	grown  *waiter
	looks  looks
	looked time.Time // when the last look began
}

// copyGrowing starts copying files as they grow.
func copyGrowing(n *notifier, files []*growingFile) *copier {
	c := &copier{files: files}
	var paths []string
	for _, g := range files {
		f, err := os.Open(g.path)
		if err != nil {
			g.ended = true // no output, or the run is gone
			continue
		}
		g.file = f
		paths = append(paths, g.path)
	}
	c.grown = n.watchGrowth(c.looks.call, paths...)
	c.looks.start(c.look) // what the files hold already
	return c
}

// look copies what the files hold, at most one look each outputGather.
func (c *copier) look() (again bool) {
	if wait := outputGather - time.Since(c.looked); wait > 0 {
		time.Sleep(wait)
	}
	c.looked = time.Now()
	c.grown.arm() // before the look: a write the look misses calls the next
	if again = c.copyAll(); again {
		c.grown.looked()
	}
	return again
}

// copyAll copies all that the files hold, and reports false once none of them
// can be read any more.
func (c *copier) copyAll() (copying bool) {
	buf := copyBuffers.Get().(*[copyBufferBytes]byte)
	defer copyBuffers.Put(buf)
	for {
		copying, more := false, false
		for _, g := range c.files {
			if g.ended {
				continue
			}
			var err error
			g.offset, err = copyNext(g.file, g.offset, buf[:], g.w)
			if err != nil && !errors.Is(err, io.EOF) {
				g.ended = true
				c.grown.stopWatching(g.path)
				continue
			}
			copying, more = true, more || err == nil
		}
		if !more { // else a file filled the buffer: the next turn, at once
			return copying
		}
	}
}

// stop copies what the files hold once no look runs any more, and closes them:
// the command has ended, or the worker lets go of the run.
func (c *copier) stop() {
	c.looks.stop()
	c.copyAll()
	c.grown.close()
	for _, g := range c.files {
		if g.file != nil {
			g.file.Close()
		}
	}
}

// copyNext copies the next part of what the file f holds from offset into w,
// a buffer (buf) at most, and returns the offset it reached, with io.EOF once
// that is the end, nil where more may follow. A part the shim freed before it
// was read reads as zeros, which are no output: it is skipped.
func copyNext(f *os.File, offset int64, buf []byte, w OutputWriter) (int64, error) {
	got, err := f.ReadAt(buf, offset) // a read that does not fill buf ends with an error
	if got == 0 {
		return offset, err
	}
	data := buf[:got]
	if freed := freedAhead(f, offset); freed > 0 {
		w.Skip(freed)
		offset += freed
		data = data[min(freed, int64(got)):]
		err = nil // the output after the hole is read next
	}
	if len(data) > 0 {
		_, _ = w.Write(data)
		offset += int64(len(data))
	}
	return offset, err
}

// copyBuffers lend a copier its buffer for one look at a time (writers copy
// what they are given): a new 64 KiB buffer for each output file of each run was
// a third of all a burst of short tasks allocated (1.2 GB for 10,000 tasks), and
// a copy spends most of its life waiting for output, with no need of one.
var copyBuffers = sync.Pool{New: func() any { return new([copyBufferBytes]byte) }}

const copyBufferBytes = 64 << 10

// outputGather is the least time between two wake-ups for a growing output file: a
// command that writes all the time is looked at a thousand times a second at most,
// each look reading all it wrote meanwhile, rather than once for each of its writes.
// Output after a quiet spell is read at once.
const outputGather = time.Millisecond

// lastBytes returns up to n bytes of a file that end at offset.
func lastBytes(path string, offset, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	start := max(0, offset-n)
	buf := make([]byte, offset-start)
	m, _ := f.ReadAt(buf, start)
	return buf[:m]
}
