package workers

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers/shim"
)

func noticeState(t *testing.T, notify string) engine.State {
	t.Helper()
	spec, err := engine.ParseSpec([]byte(`{"command":"x","notify":` + notify + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return engine.State{ID: "t", Spec: spec, Phase: engine.PhaseRunning, Epoch: 1}
}

// awaitDue waits for the watch to say a notice is due, and returns it.
func awaitDue(t *testing.T, nw *noticeWatch) engine.Notice {
	t.Helper()
	select {
	case <-nw.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("no notice came due")
	}
	n, ok := nw.due()
	if !ok {
		t.Fatal("due, but no notice")
	}
	return n
}

func TestNoticesGatherTheLinesOfABatch(t *testing.T) {
	t.Parallel()
	nw := newNoticeWatch(noticeState(t, `{"type":"line_pattern","regex":"^P","batch":"200ms"}`))
	defer nw.stop()
	start := time.Now()
	_, _ = nw.Write([]byte("P 1\nother\nP 2\r\nP "))
	_, _ = nw.Write([]byte("3\nP 4 not ended"))
	n := awaitDue(t, nw)
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("the batch's notice came after %s, before its 200ms", waited)
	}
	if strings.Join(n.Lines, "|") != "P 1|P 2|P 3" || n.Upto != int64(len("P 1\nother\nP 2\r\nP 3\n")) {
		t.Fatalf("notice %+v", n)
	}
	nw.recorded(nil)
	if _, ok := nw.due(); ok {
		t.Fatal("a notice with no lines")
	}
}

func TestNoticesKeepTheirMinimumIntervalAndMaximum(t *testing.T) {
	t.Parallel()
	s := noticeState(t, `{"type":"json_line","match":{"type":"progress"},"min_interval":"300ms","max":2}`)
	last := time.Now()
	s.Notices, s.LastNoticeAt = 1, &last
	nw := newNoticeWatch(s)
	defer nw.stop()
	_, _ = nw.Write([]byte(`{"type":"progress","n":1}` + "\n" + `{"type":"other"}` + "\n"))
	n := awaitDue(t, nw)
	if waited := time.Since(last); waited < 300*time.Millisecond || len(n.Lines) != 1 {
		t.Fatalf("notice %+v %s after the last one, want one line no sooner than 300ms", n, waited)
	}
	nw.recorded(nil)
	_, _ = nw.Write([]byte(`{"type":"progress","n":2}` + "\n"))
	if _, ok := nw.due(); ok || len(nw.pending.Lines) != 0 {
		t.Fatal("a third notice past max 2")
	}
}

func TestANoticeCarriesAtMostItsLinesAndCountsTheRest(t *testing.T) {
	t.Parallel()
	nw := newNoticeWatch(noticeState(t, `{"type":"line_pattern","regex":"^x","batch":"50ms"}`))
	defer nw.stop()
	long := "x" + strings.Repeat("y", 3*MaxLineBytes)
	for range engine.MaxNoticeLines + 5 {
		_, _ = nw.Write([]byte(long + "\n"))
	}
	n := awaitDue(t, nw)
	if len(n.Lines) != engine.MaxNoticeLines || n.Dropped != 5 || len(n.Lines[0]) != MaxLineBytes {
		t.Fatalf("%d lines (the first %d bytes), %d dropped", len(n.Lines), len(n.Lines[0]), n.Dropped)
	}
	// A notice not recorded is the one due again, before newer lines.
	_, _ = nw.Write([]byte("x later\n"))
	nw.recorded(fmt.Errorf("nats away"))
	if again := awaitDue(t, nw); again.Upto != n.Upto {
		t.Fatalf("after a failed record: notice up to %d, want the same notice up to %d", again.Upto, n.Upto)
	}
}

// A run watched again after a restart sends the lines after its last notice that
// were read before the restart, and not those of the notice.
func TestNoticesResumeAfterTheLastOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := "P 1\nP 2\nP 3\n"
	if err := os.WriteFile(filepath.Join(dir, shim.StdoutFile), []byte(out+"P 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := noticeState(t, `{"type":"line_pattern","regex":"^P"}`)
	s.Notices, s.LastNotice, s.NoticeEpoch = 2, &events.Notice{N: 2, Lines: []string{"P 2"}, Upto: int64(len("P 1\nP 2\n"))}, 1
	nw := newNoticeWatch(s)
	defer nw.stop()
	nw.resume(dir, int64(len(out)))
	_, _ = nw.Write([]byte("P 4\n")) // the copy goes on from where the log stood
	n := awaitDue(t, nw)
	nw.recorded(nil)
	if len(n.Lines) == 1 && n.Lines[0] == "P 3" {
		n.Lines = append(n.Lines, awaitDue(t, nw).Lines...)
	}
	if strings.Join(n.Lines, "|") != "P 3|P 4" {
		t.Fatalf("lines after the restart: %q, want P 3 and P 4", n.Lines)
	}

	// A run of another epoch (a respawn) starts with nothing to skip.
	s.Epoch = 2
	if nw := newNoticeWatch(s); nw.skipUpto != 0 {
		t.Fatalf("a new run skips up to %d", nw.skipUpto)
	}
}

// A gap in the output (bytes freed before they were read) breaks the line it fell
// in, which no notice takes, and counts in the offsets notices go up to.
func TestANoticeSkipsTheLineAGapBroke(t *testing.T) {
	t.Parallel()
	nw := newNoticeWatch(noticeState(t, `{"type":"line_pattern","regex":"^P","batch":"200ms"}`))
	defer nw.stop()
	_, _ = nw.Write([]byte("P 1\nP 2 "))
	nw.Skip(100)
	_, _ = nw.Write([]byte("P broken\nP 3\n"))
	n := awaitDue(t, nw)
	if strings.Join(n.Lines, "|") != "P 1|P 3" || n.Upto != int64(len("P 1\nP 2 ")+100+len("P broken\nP 3\n")) {
		t.Fatalf("notice %+v, want P 1 and P 3, up to the end", n)
	}
}
