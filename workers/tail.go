package workers

import (
	"bytes"
	"strings"
	"sync"
)

// Tail keeps the last lines of a command's output. It is the command's stdout and
// stderr writer: it never blocks and never fails, whatever the command prints (a
// 10 MB line, binary data, a flood), and its memory is bounded because each line is
// cut to maxLineBytes.
type Tail struct {
	mu           sync.Mutex
	maxLines     int
	maxLineBytes int
	ring         []string // complete lines; once full, next is the oldest
	next         int
	partial      []byte // the line being written, at most maxLineBytes
	cut          bool   // partial has lost bytes
	total        int64
}

// NewTail keeps maxLines lines of at most maxLineBytes each.
func NewTail(maxLines, maxLineBytes int) *Tail {
	return &Tail{maxLines: maxLines, maxLineBytes: maxLineBytes}
}

// Write implements io.Writer.
func (t *Tail) Write(p []byte) (int, error) {
	n := len(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(n)
	for len(p) > 0 {
		chunk, rest, newline := bytes.Cut(p, []byte{'\n'})
		if room := t.maxLineBytes - len(t.partial); len(chunk) > room {
			t.partial = append(t.partial, chunk[:room]...)
			t.cut = true
		} else {
			t.partial = append(t.partial, chunk...)
		}
		if !newline {
			break
		}
		t.push()
		p = rest
	}
	return n, nil
}

func (t *Tail) push() {
	line := t.line()
	t.partial, t.cut = t.partial[:0], false
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

func (t *Tail) line() string {
	line := strings.ToValidUTF8(strings.TrimSuffix(string(t.partial), "\r"), "\uFFFD")
	if t.cut {
		line += " [line cut]"
	}
	return line
}

// Lines returns the kept lines, oldest first, with an unfinished last line if any.
func (t *Tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.ring)+1)
	out = append(out, t.ring[t.next:]...)
	out = append(out, t.ring[:t.next]...)
	if len(t.partial) > 0 {
		out = append(out, t.line())
		if len(out) > t.maxLines {
			out = out[1:]
		}
	}
	return out
}

// Bytes is how many bytes were written in all.
func (t *Tail) Bytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}
