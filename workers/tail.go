package workers

import (
	"bytes"
	"strings"
	"sync"
)

// Tail keeps the last lines of a command's output. Each output stream writes
// through its own Stream, which collects a line until its newline, so a partial
// line on stderr (a progress bar) is never glued to a line of stdout. It never
// blocks and never fails, whatever the command prints (a 10 MB line, binary data, a
// flood), and its memory is bounded because each line is cut to maxLineBytes.
type Tail struct {
	mu           sync.Mutex
	maxLines     int
	maxLineBytes int
	ring         []string // complete lines; once full, next is the oldest
	next         int
	total        int64
	streams      []*tailStream
}

// NewTail keeps maxLines lines of at most maxLineBytes each.
func NewTail(maxLines, maxLineBytes int) *Tail {
	return &Tail{maxLines: maxLines, maxLineBytes: maxLineBytes}
}

// Stream returns a writer for one output stream.
func (t *Tail) Stream() OutputWriter {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &tailStream{t: t}
	t.streams = append(t.streams, s)
	return s
}

// Write writes to the tail's first stream: a Tail used as one io.Writer.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	if len(t.streams) == 0 {
		t.streams = append(t.streams, &tailStream{t: t})
	}
	s := t.streams[0]
	t.mu.Unlock()
	return s.Write(p)
}

type tailStream struct {
	t       *Tail
	partial []byte // the line being written, at most maxLineBytes
	cut     bool   // partial has lost bytes
}

func (s *tailStream) Write(p []byte) (int, error) {
	n := len(p)
	t := s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(n)
	for len(p) > 0 {
		chunk, rest, newline := bytes.Cut(p, []byte{'\n'})
		if room := t.maxLineBytes - len(s.partial); len(chunk) > room {
			s.partial = append(s.partial, chunk[:room]...)
			s.cut = true
		} else {
			s.partial = append(s.partial, chunk...)
		}
		if !newline {
			break
		}
		t.push(s.line())
		s.partial, s.cut = s.partial[:0], false
		p = rest
	}
	return n, nil
}

// Skip ends the line being written where the output has a gap: the line and the
// next one are kept, each marked cut.
func (s *tailStream) Skip(n int64) {
	t := s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += n
	if len(s.partial) > 0 {
		s.cut = true
		t.push(s.line())
		s.partial = s.partial[:0]
	}
	s.cut = true
}

func (s *tailStream) line() string {
	line := strings.ToValidUTF8(strings.TrimSuffix(string(s.partial), "\r"), "\uFFFD")
	if s.cut {
		line += " [line cut]"
	}
	return line
}

func (t *Tail) push(line string) {
	if t.maxLines <= 0 {
		return
	}
	if len(t.ring) < t.maxLines {
		t.ring = append(t.ring, line)
		return
	}
	t.ring[t.next] = line
	t.next = (t.next + 1) % t.maxLines
}

// Lines returns the kept lines, oldest first, with each stream's unfinished last
// line if any.
func (t *Tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.ring)+len(t.streams))
	out = append(out, t.ring[t.next:]...)
	out = append(out, t.ring[:t.next]...)
	for _, s := range t.streams {
		if len(s.partial) > 0 {
			out = append(out, s.line())
		}
	}
	if len(out) > t.maxLines {
		out = out[len(out)-t.maxLines:]
	}
	return out
}

// Bytes is how many bytes were written in all.
func (t *Tail) Bytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}
