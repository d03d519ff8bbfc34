package workers_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/bgtask/bgtask/workers"
)

// write feeds p to the tail the way a pipe copier does and fails the test on any
// short write or error: a command's writer must never fail.
func write(t *testing.T, tail *workers.Tail, p string) {
	t.Helper()
	n, err := tail.Write([]byte(p))
	if err != nil {
		t.Fatalf("Write(%d bytes): %v", len(p), err)
	}
	if n != len(p) {
		t.Fatalf("Write(%d bytes) = %d: short write", len(p), n)
	}
}

func TestTailKeepsTheLastLinesInOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		max    int
		writes []string
		want   []string
	}{
		{name: "nothing written", max: 3, writes: nil, want: []string{}},
		{name: "fewer lines than kept", max: 3, writes: []string{"a\nb\n"}, want: []string{"a", "b"}},
		{name: "exactly as many lines as kept", max: 3, writes: []string{"a\nb\nc\n"}, want: []string{"a", "b", "c"}},
		{name: "older lines dropped", max: 3, writes: []string{"1\n2\n3\n4\n5\n6\n7\n"}, want: []string{"5", "6", "7"}},
		{name: "ring wrapped several times", max: 2, writes: []string{"1\n2\n3\n", "4\n5\n"}, want: []string{"4", "5"}},
		{name: "partial last line included", max: 3, writes: []string{"a\nb\nc"}, want: []string{"a", "b", "c"}},
		{name: "partial last line counts against the limit", max: 2, writes: []string{"a\nb\nc"}, want: []string{"b", "c"}},
		{name: "only a partial line", max: 2, writes: []string{"no newline"}, want: []string{"no newline"}},
		{name: "lines split across writes", max: 3, writes: []string{"he", "llo\nwo", "rld\n"}, want: []string{"hello", "world"}},
		{name: "one byte per write", max: 3, writes: strings.Split("ab\ncd\n", ""), want: []string{"ab", "cd"}},
		{name: "empty lines kept", max: 4, writes: []string{"a\n\nb\n"}, want: []string{"a", "", "b"}},
		{name: "CRLF trimmed", max: 3, writes: []string{"a\r\nb\r\n"}, want: []string{"a", "b"}},
		{name: "CR of a partial line trimmed", max: 3, writes: []string{"a\r\nb\r"}, want: []string{"a", "b"}},
		{name: "CR split from its LF", max: 3, writes: []string{"a\r", "\nb\n"}, want: []string{"a", "b"}},
		{name: "one line kept", max: 1, writes: []string{"a\nb\nc\n"}, want: []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tail := workers.NewTail(tt.max, workers.MaxLineBytes)
			total := 0
			for _, p := range tt.writes {
				write(t, tail, p)
				total += len(p)
			}
			if got := tail.Lines(); !slices.Equal(got, tt.want) {
				t.Errorf("Lines() = %q, want %q", got, tt.want)
			}
			if got, want := tail.Bytes(), int64(total); got != want {
				t.Errorf("Bytes() = %d, want %d", got, want)
			}
		})
	}
}

func TestTailLinesCanBeReadWhileWriting(t *testing.T) {
	t.Parallel()
	tail := workers.NewTail(2, workers.MaxLineBytes)
	write(t, tail, "a\nb")
	if got, want := tail.Lines(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("Lines() = %q, want %q", got, want)
	}
	// Reading does not consume the partial line: the rest of it still joins it.
	write(t, tail, "c\nd\n")
	if got, want := tail.Lines(), []string{"bc", "d"}; !slices.Equal(got, want) {
		t.Fatalf("Lines() = %q, want %q", got, want)
	}
}

func TestTailCutsLongLinesAndNeverFailsTheWriter(t *testing.T) {
	t.Parallel()
	const tenMB = 10 << 20
	long := strings.Repeat("x", tenMB)
	tests := []struct {
		name   string
		writes []string
		// want is the kept lines; cut marks a line kept cut to MaxLineBytes "x" bytes.
		want []string
	}{
		{name: "10 MB line in one write", writes: []string{long + "\n"}, want: []string{"cut"}},
		{name: "10 MB line in pipe-sized writes", writes: chunks(long+"\n", 64<<10), want: []string{"cut"}},
		{name: "10 MB partial line", writes: []string{long}, want: []string{"cut"}},
		{name: "lines after a long line are whole", writes: []string{"before\n", long, "\nafter\n"}, want: []string{"before", "cut", "after"}},
		{name: "line of exactly MaxLineBytes is not cut", writes: []string{strings.Repeat("y", workers.MaxLineBytes) + "\n"}, want: []string{strings.Repeat("y", workers.MaxLineBytes)}},
		{name: "CRLF after a long line", writes: []string{long + "\r\n"}, want: []string{"cut"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tail := workers.NewTail(10, workers.MaxLineBytes)
			total := 0
			for _, p := range tt.writes {
				write(t, tail, p)
				total += len(p)
			}
			if got, want := tail.Bytes(), int64(total); got != want {
				t.Errorf("Bytes() = %d, want %d", got, want)
			}
			got := tail.Lines()
			if len(got) != len(tt.want) {
				t.Fatalf("Lines() has %d lines, want %d", len(got), len(tt.want))
			}
			for i, want := range tt.want {
				if want != "cut" {
					if got[i] != want {
						t.Errorf("line %d = %.40q (%d bytes), want %.40q", i, got[i], len(got[i]), want)
					}
					continue
				}
				kept, marker, ok := strings.Cut(got[i], " ")
				if !ok || kept != strings.Repeat("x", workers.MaxLineBytes) {
					t.Errorf("line %d: want %d bytes of the line and a marker, got %d bytes: %.40q...",
						i, workers.MaxLineBytes, len(got[i]), got[i])
				}
				if marker == "" || strings.Contains(marker, "x") || len(marker) > 64 {
					t.Errorf("line %d: marker %q, want a short note that the line was cut", i, marker)
				}
			}
		})
	}
}

func chunks(s string, size int) []string {
	var out []string
	for len(s) > size {
		out = append(out, s[:size])
		s = s[size:]
	}
	return append(out, s)
}

func TestTailMakesBinaryOutputValidUTF8(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		write string
		// keep is text that must survive around the invalid bytes.
		keep []string
	}{
		{name: "invalid bytes", write: "\xff\xfeok\n", keep: []string{"ok"}},
		{name: "truncated multi-byte sequence", write: "caf\xc3\nnext\n", keep: []string{"caf", "next"}},
		{name: "NUL and control bytes", write: "a\x00b\x01c\n", keep: []string{"a", "b", "c"}},
		{name: "random binary", write: string([]byte{0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef}), keep: []string{"PNG"}},
		{name: "valid UTF-8 kept as is", write: "héllo wörld ✓\n", keep: []string{"héllo wörld ✓"}},
		// An odd prefix makes the cut at MaxLineBytes fall inside a two-byte rune.
		{name: "long line cut inside a rune", write: "a" + strings.Repeat("é", workers.MaxLineBytes) + "\n", keep: []string{"aéé"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tail := workers.NewTail(10, workers.MaxLineBytes)
			write(t, tail, tt.write)
			lines := tail.Lines()
			for i, line := range lines {
				if !utf8.ValidString(line) {
					t.Errorf("line %d = %q is not valid UTF-8", i, line)
				}
			}
			all := strings.Join(lines, "\n")
			for _, keep := range tt.keep {
				if !strings.Contains(all, keep) {
					t.Errorf("Lines() = %q, want it to keep %q", lines, keep)
				}
			}
		})
	}
}

func TestTailIsSafeForConcurrentWriters(t *testing.T) {
	t.Parallel()
	const (
		writers = 8
		perG    = 500
		keep    = 50
	)
	tail := workers.NewTail(keep, workers.MaxLineBytes)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for g := range writers {
		wg.Go(func() {
			n := 0
			for i := range perG {
				line := fmt.Sprintf("g%d-%d\n", g, i)
				// Whole lines per write, as a pipe delivers them from one writer.
				if w, err := tail.Write([]byte(line)); err != nil || w != len(line) {
					t.Errorf("Write = %d, %v; want %d, nil", w, err, len(line))
				}
				n += len(line)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	// Readers run alongside the writers.
	for range 2 {
		wg.Go(func() {
			for range perG {
				_ = tail.Lines()
				_ = tail.Bytes()
			}
		})
	}
	wg.Wait()

	lines := tail.Lines()
	if got, want := len(lines), keep; got != want {
		t.Fatalf("kept %d lines, want %d", got, want)
	}
	// Each kept line is one whole write, and each writer's lines keep their order.
	whole := regexp.MustCompile(`^g(\d+)-(\d+)$`)
	last := map[string]int{}
	for _, line := range lines {
		m := whole.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("line %q is not one whole written line", line)
			continue
		}
		i, _ := strconv.Atoi(m[2])
		if prev, ok := last[m[1]]; ok && i <= prev {
			t.Errorf("writer g%s: line %d kept after line %d", m[1], i, prev)
		}
		last[m[1]] = i
	}
	if got, want := tail.Bytes(), int64(total); got != want {
		t.Errorf("Bytes() = %d, want %d", got, want)
	}
}

func TestTailKeepsAPartialLineOfOneStreamApartFromTheOther(t *testing.T) {
	t.Parallel()
	tail := workers.NewTail(10, workers.MaxLineBytes)
	stdout, stderr := tail.Stream(), tail.Stream()
	stderr.Write([]byte("progress 10%\r"))
	stdout.Write([]byte("stdout line\n"))
	stderr.Write([]byte("progress 100%\n"))
	got := tail.Lines()
	want := []string{"stdout line", "progress 10%\rprogress 100%"}
	if !slices.Equal(got, want) {
		t.Fatalf("lines = %q, want %q", got, want)
	}
}

// Output freed before it was read (Skip) breaks the line it fell in: the part
// before and the part after are kept, each marked cut, and the bytes counted.
func TestTailMarksTheLinesAGapInTheOutputCut(t *testing.T) {
	t.Parallel()
	tail := workers.NewTail(10, workers.MaxLineBytes)
	stdout := tail.Stream()
	stdout.Write([]byte("whole\nbegins"))
	stdout.Skip(1000)
	stdout.Write([]byte("ends\nnext\n"))
	want := []string{"whole", "begins [line cut]", "ends [line cut]", "next"}
	if got := tail.Lines(); !slices.Equal(got, want) {
		t.Fatalf("lines = %q, want %q", got, want)
	}
	if got := tail.Bytes(); got != int64(len("whole\nbegins")+1000+len("ends\nnext\n")) {
		t.Fatalf("Bytes() = %d, want the bytes skipped counted", got)
	}
}
