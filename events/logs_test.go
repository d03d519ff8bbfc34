package events_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
)

func openLogs(t *testing.T) *events.Logs {
	t.Helper()
	srv := eventstest.Run(t)
	logs, err := events.OpenLogs(context.Background(), srv.JS, events.LogConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return logs
}

var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

type readResult struct {
	data    map[string]*bytes.Buffer
	first   map[string]int64
	eof     map[string]int64
	chunks  int
	offsets map[string]int64 // next expected offset per stream
}

func readAll(t *testing.T, logs *events.Logs, task string, follow bool, streams ...string) readResult {
	t.Helper()
	r := readResult{data: map[string]*bytes.Buffer{}, first: map[string]int64{}, eof: map[string]int64{}, offsets: map[string]int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var until <-chan struct{} // follow: until the end marks
	if !follow {
		until = closed
	}
	err := logs.Follow(ctx, task, streams, 0, until, func(c events.LogChunk) error {
		if c.EOF {
			r.eof[c.Stream] = c.Offset
			return nil
		}
		if r.data[c.Stream] == nil {
			r.data[c.Stream] = &bytes.Buffer{}
			r.first[c.Stream] = c.Offset
		} else if c.Offset != r.offsets[c.Stream] {
			t.Fatalf("%s chunk at offset %d, want %d: a gap in kept output", c.Stream, c.Offset, r.offsets[c.Stream])
		}
		r.offsets[c.Stream] = c.Offset + int64(len(c.Data))
		r.data[c.Stream].Write(c.Data)
		r.chunks++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLogWriterKeepsEveryByteInOrder(t *testing.T) {
	t.Parallel()
	logs := openLogs(t)
	out := logs.Writer("t1", events.Stdout, 0)
	errw := logs.Writer("t1", events.Stderr, 0)
	var want bytes.Buffer
	for i := range 3000 {
		line := fmt.Sprintf("line-%d\n", i)
		want.WriteString(line)
		out.Write([]byte(line))
	}
	errw.Write([]byte("oops\n"))
	ctx := context.Background()
	if total, dropped := out.Close(ctx, true); total != int64(want.Len()) || dropped != 0 {
		t.Fatalf("stdout total %d dropped %d, want %d and 0", total, dropped, want.Len())
	}
	errw.Close(ctx, true)

	r := readAll(t, logs, "t1", false)
	if got := r.data[events.Stdout].String(); got != want.String() {
		t.Fatalf("stdout differs: %d bytes, want %d", len(got), want.Len())
	}
	if got := r.data[events.Stderr].String(); got != "oops\n" {
		t.Fatalf("stderr = %q", got)
	}
	only := readAll(t, logs, "t1", false, events.Stderr)
	if only.data[events.Stdout] != nil || only.data[events.Stderr].String() != "oops\n" {
		t.Fatal("reading stderr alone returned stdout")
	}
}

// A writer holds a goroutine only while it has output to publish: a running
// task whose command is quiet costs none for its output. Not parallel: it
// counts the writers' goroutines of the whole test binary.
func TestALogWriterHoldsAGoroutineOnlyWhileItPublishes(t *testing.T) {
	logs := openLogs(t)
	w := logs.Writer("quiet", events.Stdout, 0)
	none := func() bool { return writerGoroutines() == 0 }
	// Eventually: a writer another test closed may still be on its way out.
	testkit.Eventually(t, 10*time.Second, "no goroutine for a writer with no output", none)
	w.Write([]byte("one line\n"))
	if writerGoroutines() == 0 {
		t.Fatal("a writer with output to publish holds no goroutine")
	}
	testkit.Eventually(t, 10*time.Second, "the writer's goroutine gone once its output went", none)
	if r := readAll(t, logs, "quiet", false); r.data[events.Stdout] == nil || r.data[events.Stdout].String() != "one line\n" {
		t.Fatalf("the log holds %v, want the line", r.data)
	}
	w.Write([]byte("two\n"))
	if total, dropped := w.Close(context.Background(), true); total != 13 || dropped != 0 {
		t.Fatalf("closed at %d with %d dropped, want 13 and none", total, dropped)
	}
	if r := readAll(t, logs, "quiet", false); r.data[events.Stdout].String() != "one line\ntwo\n" || r.eof[events.Stdout] != 13 {
		t.Fatalf("the log holds %q, end mark at %d; want both lines and the mark at 13", r.data[events.Stdout], r.eof[events.Stdout])
	}
}

// writerGoroutines counts the goroutines of LogWriters that publish.
func writerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			stacks := string(buf[:n])
			return strings.Count(stacks, "events.(*LogWriter).run(") + strings.Count(stacks, "events.(*LogWriter).startFlushing.gowrap")
		}
		buf = make([]byte, 2*len(buf))
	}
}

func TestLogWriterKeepsTheLastBytesAndCountsTheDrop(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	logs := openLogs(t)
	w := logs.Writer("flood", events.Stdout, 0)
	block := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	const blocks = 160                                      // 10 MiB, over the 4 MiB kept
	for i := range blocks {
		block[0] = byte('A' + i%26)
		w.Write(block)
	}
	total, dropped := w.Close(context.Background(), true)
	if total != int64(blocks*len(block)) {
		t.Fatalf("total = %d, want %d", total, blocks*len(block))
	}
	r := readAll(t, logs, "flood", false)
	kept := int64(r.data[events.Stdout].Len())
	if kept > events.MaxLogBytes || kept == 0 {
		t.Fatalf("kept %d bytes, want at most %d", kept, events.MaxLogBytes)
	}
	if r.first[events.Stdout]+kept != total {
		t.Fatalf("kept output is not the end: first offset %d + %d kept != %d", r.first[events.Stdout], kept, total)
	}
	if dropped < r.first[events.Stdout] {
		t.Fatalf("dropped %d, but output before offset %d is gone", dropped, r.first[events.Stdout])
	}
}

// Output the writer never had (freed before a worker read it) is skipped: what
// follows is kept at its own offset, the total counts it, and so does the drop.
func TestLogWriterSkipsOutputItNeverHad(t *testing.T) {
	t.Parallel()
	logs := openLogs(t)
	w := logs.Writer("gap", events.Stdout, 0)
	w.Write([]byte("before\n"))
	w.Skip(100)
	w.Write([]byte("after\n"))
	total, dropped := w.Close(context.Background(), true)
	if total != 113 || dropped < 100 {
		t.Fatalf("total %d, dropped %d: want 113 and at least the 100 skipped", total, dropped)
	}
	var chunks []events.LogChunk
	err := logs.Read(context.Background(), "gap", nil, func(c events.LogChunk) error {
		chunks = append(chunks, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// "before" went with the skip, unless it was published before it.
	if n := len(chunks); n < 2 || chunks[n-2].Offset != 107 || string(chunks[n-2].Data) != "after\n" || !chunks[n-1].EOF ||
		n == 3 && (chunks[0].Offset != 0 || string(chunks[0].Data) != "before\n") || n > 3 {
		t.Fatalf("chunks %+v, want \"after\\n\" at offset 107, and \"before\\n\" at 0 at most before it", chunks)
	}
}

// A follower of a task's output reads what comes until the task has ended, then
// what the log holds, and returns: its output was published before its end.
func TestLogFollowEndsWithTheTask(t *testing.T) {
	t.Parallel()
	logs := openLogs(t)
	w := logs.Writer("live", events.Stdout, 0)
	w.Write([]byte("first\n"))
	ended := make(chan struct{})
	got := make(chan string, 1)
	read := make(chan struct{}, 16)
	go func() {
		var out bytes.Buffer
		err := logs.Follow(context.Background(), "live", nil, 0, ended, func(c events.LogChunk) error {
			out.Write(c.Data)
			read <- struct{}{}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		got <- out.String()
	}()
	<-read // "first", on a tick: the follower has it and waits for more
	w.Write([]byte("second\n"))
	w.Close(context.Background(), false) // not final: no end mark at all
	select {
	case s := <-got:
		t.Fatalf("follow ended before the task, with %q", s)
	case <-time.After(time.Second): // four of its fetches
	}
	close(ended)
	select {
	case s := <-got:
		if s != "first\nsecond\n" {
			t.Fatalf("followed %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("follow did not end with the task")
	}
}

// The end mark of an output that ends with something left to publish rides on its
// last chunk: one message, not two. Read hands it on as before, a chunk without
// data at the output's total size after the last data.
func TestTheEndMarkRidesOnTheLastChunk(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	logs, err := events.OpenLogs(ctx, srv.JS, events.LogConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w := logs.Writer("ends", events.Stdout, 3)
	w.Write([]byte("last\n"))
	if total, dropped := w.Close(ctx, true); total != 8 || dropped != 0 {
		t.Fatalf("Close = %d, %d dropped, want 8, 0", total, dropped)
	}
	empty := logs.Writer("ends", events.Stderr, 0)
	empty.Close(ctx, true)

	stream, err := srv.JS.Stream(ctx, events.LogStreamName)
	if err != nil {
		t.Fatal(err)
	}
	messages := func() map[string]uint64 {
		t.Helper()
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(events.LogSubject("ends", ">")))
		if err != nil {
			t.Fatal(err)
		}
		return map[string]uint64{events.Stdout: info.State.Subjects[events.LogSubject("ends", events.Stdout)], events.Stderr: info.State.Subjects[events.LogSubject("ends", events.Stderr)]}
	}
	// An output with nothing left at its end gets no end mark: the task's end says it.
	if n := messages(); n[events.Stdout] != 1 || n[events.Stderr] != 0 {
		t.Errorf("after Close: %v messages, want stdout's one (its end mark on its last chunk) and none of stderr", n)
	}
	var got []events.LogChunk
	if err := logs.Read(ctx, "ends", nil, func(c events.LogChunk) error {
		got = append(got, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []events.LogChunk{
		{Stream: events.Stdout, Offset: 3, Data: []byte("last\n")},
		{Stream: events.Stdout, Offset: 8, EOF: true},
	}
	if len(got) != len(want) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Stream != want[i].Stream || got[i].Offset != want[i].Offset || got[i].EOF != want[i].EOF || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("chunk %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	for s, want := range map[string]int64{events.Stdout: 8, events.Stderr: 0} {
		if end, err := logs.End(ctx, "ends", s); err != nil || end != want {
			t.Errorf("End(%s) = %d, %v, want %d", s, end, err, want)
		}
	}
}

// Each chunk carries its sequence in the log stream, and ReadAfter a sequence
// reads the chunks after it: a reader resumes where it stopped.
func TestLogReadAfterASequenceResumesThere(t *testing.T) {
	t.Parallel()
	logs := openLogs(t)
	ctx := context.Background()
	offset := int64(0)
	for _, part := range []string{"one\n", "two\n", "three\n"} {
		w := logs.Writer("resumed", events.Stdout, offset)
		w.Write([]byte(part))
		w.Close(ctx, false) // one chunk each
		offset += int64(len(part))
	}
	var all []events.LogChunk
	if err := logs.Read(ctx, "resumed", nil, func(c events.LogChunk) error {
		all = append(all, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].Seq == 0 || all[1].Seq <= all[0].Seq || all[2].Seq <= all[1].Seq {
		t.Fatalf("chunks %+v: want three, in the order of their sequences", all)
	}
	var after []string
	if err := logs.ReadAfter(ctx, "resumed", nil, all[0].Seq, func(c events.LogChunk) error {
		after = append(after, string(c.Data))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(after, "") != "two\nthree\n" {
		t.Fatalf("after sequence %d: %q", all[0].Seq, after)
	}
}
