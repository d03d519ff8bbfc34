package workers

import (
	"bytes"
	"path/filepath"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers/shim"
)

// noticeRereadBytes is how much of a run's stdout before where the log stands a
// worker reads again after a restart, for lines its notify rule matched after the
// last notice and before the restart.
const noticeRereadBytes = 256 << 10

// noticeRetry is how soon a notice that was not recorded is tried again.
const noticeRetry = time.Second

// noticeWatch gathers the stdout lines a notify rule matches into notices and
// says when the next is due: batch after its first line, and never sooner than
// min_interval after the last notice. The follow loop records them, one at a
// time, as the run's other events.
type noticeWatch struct {
	match              engine.LineMatcher
	batch, minInterval time.Duration
	ready              chan struct{} // a notice is due

	mu       sync.Mutex
	left     int   // notices the rule still allows
	offset   int64 // where the next byte written is in the run's stdout
	skipUpto int64 // lines that end at or before it were in an earlier notice
	line     []byte
	skipping bool // the current line's beginning is unknown: it is not matched
	pending  engine.Notice
	firstAt  time.Time // of the first pending line
	lastAt   time.Time // of the last notice
	inflight *engine.Notice
	timer    *time.Timer
}

// newNoticeWatch returns the notice watch of a run of s, nil without a notify
// rule. A run watched again after a restart goes on after the last notice it
// sent: its lines are not sent again, and those after it are.
func newNoticeWatch(s engine.State) *noticeWatch {
	n := s.Spec.Notify
	if n == nil {
		return nil
	}
	nw := &noticeWatch{
		match: s.Spec.NoticeMatcher(), batch: n.NoticeBatch(), minInterval: n.NoticeMinInterval(),
		ready: make(chan struct{}, 1), left: n.Max - s.Notices,
	}
	if s.LastNoticeAt != nil {
		nw.lastAt = *s.LastNoticeAt
	}
	if s.LastNotice != nil && s.NoticeEpoch == s.Epoch {
		nw.skipUpto = s.LastNotice.Upto
	}
	return nw
}

// resume feeds the watch what the run printed before from (where the log stands,
// and the output is copied from), after the last notice, so that lines a notice
// had not sent yet when the worker stopped are sent now.
func (nw *noticeWatch) resume(dir string, from int64) {
	start := max(nw.skipUpto, from-noticeRereadBytes)
	if start >= from {
		nw.offset = from
		return
	}
	data := lastData(filepath.Join(dir, shim.StdoutFile), from, from-start)
	nw.offset = from - int64(len(data))
	nw.skipping = nw.offset > 0 && nw.offset != nw.skipUpto
	_, _ = nw.Write(data)
}

func (nw *noticeWatch) Write(p []byte) (int, error) {
	n := len(p)
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for len(p) > 0 {
		chunk, rest, newline := bytes.Cut(p, []byte{'\n'})
		nw.offset += int64(len(chunk))
		if room := engine.MatchLineBytes - len(nw.line); !nw.skipping && room > 0 {
			nw.line = append(nw.line, chunk[:min(len(chunk), room)]...)
		}
		if !newline {
			break
		}
		nw.offset++
		if !nw.skipping && nw.offset > nw.skipUpto {
			nw.check()
		}
		nw.line, nw.skipping, p = nw.line[:0], false, rest
	}
	return n, nil
}

// Skip drops the line being read: its end was freed before it was read, and the
// next line's beginning is unknown, so neither is matched.
func (nw *noticeWatch) Skip(n int64) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.offset += n
	nw.line, nw.skipping = nw.line[:0], true
}

// check adds the line read to the pending notice if the rule matches it.
func (nw *noticeWatch) check() {
	line := bytes.TrimSuffix(nw.line, []byte{'\r'})
	if nw.left <= 0 || !nw.match(line) {
		return
	}
	if len(nw.pending.Lines) < engine.MaxNoticeLines {
		kept := line[:min(len(line), MaxLineBytes)]
		nw.pending.Lines = append(nw.pending.Lines, string(bytes.ToValidUTF8(kept, []byte("\uFFFD"))))
	} else {
		nw.pending.Dropped++
	}
	nw.pending.Upto = nw.offset
	if len(nw.pending.Lines) == 1 && nw.pending.Dropped == 0 {
		nw.firstAt = time.Now()
	}
	nw.schedule(time.Time{})
}

// schedule sets the timer of the next notice, if none is set: at the earliest
// time the rule allows, or at not (when set), whichever is later.
func (nw *noticeWatch) schedule(notBefore time.Time) {
	if nw.timer != nil || nw.inflight == nil && len(nw.pending.Lines) == 0 {
		return
	}
	due := nw.firstAt.Add(nw.batch)
	if !nw.lastAt.IsZero() {
		due = maxTime(due, nw.lastAt.Add(nw.minInterval))
	}
	due = maxTime(due, notBefore)
	nw.timer = time.AfterFunc(time.Until(due), func() {
		select {
		case nw.ready <- struct{}{}:
		default:
		}
	})
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// due returns the notice to record now: one that was not recorded yet, or the
// pending lines.
func (nw *noticeWatch) due() (engine.Notice, bool) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.timer = nil
	if nw.inflight == nil && len(nw.pending.Lines) > 0 && nw.left > 0 {
		n := nw.pending
		nw.inflight, nw.pending = &n, engine.Notice{}
	}
	if nw.inflight == nil {
		return engine.Notice{}, false
	}
	return *nw.inflight, true
}

// recorded says how recording the due notice went: on success the next one may
// follow; else it is tried again a little later.
func (nw *noticeWatch) recorded(err error) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if err != nil {
		nw.schedule(time.Now().Add(noticeRetry))
		return
	}
	nw.inflight, nw.lastAt = nil, time.Now()
	nw.left--
	nw.schedule(time.Time{})
}

// stop stops the timer: the run is over, or no longer watched.
func (nw *noticeWatch) stop() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.timer != nil {
		nw.timer.Stop()
		nw.timer = nil
	}
	nw.left = 0
}
