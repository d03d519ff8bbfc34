package codex

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// standInCodex is a `codex` program that parses `queue` as codex 0.169.0 does
// (clap: an argument after --message that starts with '-' is refused), and
// appends each message it takes to dir/queued, NUL-terminated, and each start of
// the daemon to dir/daemon. While dir/hold exists it waits after taking one, and
// says so with dir/holding; while dir/refuse exists it refuses the message.
const standInCodex = `#!/bin/sh
d=$(dirname "$0")
case "$1" in
app-server) echo start >> "$d/daemon"; exit 0 ;;
queue) shift ;;
*) echo "error: unrecognized subcommand '$1'" >&2; exit 2 ;;
esac
have=
while [ $# -gt 0 ]; do
	case "$1" in
	--message=*) msg=${1#--message=}; have=1 ;;
	--message)
		case "$2" in -*) echo "error: unexpected argument '$2' found" >&2; exit 2 ;; esac
		msg=$2; have=1; shift ;;
	--thread) shift ;;
	--resume) ;;
	*) echo "error: unexpected argument '$1' found" >&2; exit 2 ;;
	esac
	shift
done
[ -n "$have" ] || { echo "error: --message <TEXT> is required" >&2; exit 2; }
[ -e "$d/refuse" ] && { echo "error: the thread is gone" >&2; exit 1; }
printf '%s\0' "$msg" >> "$d/queued"
if [ -e "$d/hold" ]; then
	: > "$d/holding"
	while [ -e "$d/hold" ]; do sleep 0.05; done
	rm -f "$d/holding"
fi
echo "Queued message m1 for thread t."
`

// syncBuffer is a deliver's stderr that a test reads while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// world is a server, a stand-in codex and a thread's inbox.
type world struct {
	home, codex, dir, thread string
	server                   *clienttest.Server
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{home: t.TempDir(), dir: t.TempDir(), thread: "019a-t1"}
	w.codex = filepath.Join(w.dir, "codex")
	if err := os.WriteFile(w.codex, []byte(standInCodex), 0o755); err != nil {
		t.Fatal(err)
	}
	w.server = clienttest.Run(t, w.home)
	return w
}

func (w *world) connect(t *testing.T) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{Home: w.home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// wake fires a timer whose wake-up, with prompt, goes to the thread's inbox,
// and returns its id once it is there.
func (w *world) wake(t *testing.T, prompt string) string {
	t.Helper()
	c := w.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: prompt, Target: TargetPrefix + w.thread})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, reg.ID); err != nil {
		t.Fatal(err)
	}
	return reg.ID
}

// unread is how many of the thread's wake-ups are not acknowledged.
func (w *world) unread(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inbox, err := w.connect(t).Inbox(ctx, TargetPrefix+w.thread)
	if err != nil {
		t.Fatal(err)
	}
	n, err := inbox.Unread(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type delivered struct {
	err            error
	stdout, stderr string
}

// deliver runs a deliver of the thread to its end.
func (w *world) deliver(t *testing.T) delivered {
	t.Helper()
	return w.deliverWithin(t, time.Minute)
}

func (w *world) deliverWithin(t *testing.T, bound time.Duration) delivered {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var stdout, stderr syncBuffer
	d := &Delivery{Thread: w.thread, Codex: w.codex, CodexHome: w.dir, Dir: filepath.Join(w.home, StateDir), Stdout: &stdout, Stderr: &stderr}
	err := d.Run(ctx, w.connect(t))
	return delivered{err, stdout.String(), stderr.String()}
}

// file is dir/name, or "" when it is not there.
func (w *world) file(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(w.dir, name))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(data)
}

// queued is what the stand-in codex took, in order.
func (w *world) queued(t *testing.T) []string {
	t.Helper()
	data := w.file(t, "queued")
	if data == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(data, "\x00"), "\x00")
}

func (w *world) touch(t *testing.T, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(w.dir, name), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (w *world) ledger() string {
	return filepath.Join(w.home, StateDir, TargetPrefix+w.thread+".handed")
}

func TestDeliverHandsOverPromptsThatLookLikeFlagsOrAreHuge(t *testing.T) {
	w := newWorld(t)
	w.wake(t, "--- FAIL: TestX")
	// Some 170 KiB: more than one argument carries, with characters of two bytes.
	huge := w.wake(t, strings.Repeat("{{task_id}}é", 4700))
	w.wake(t, "after")
	if d := w.deliver(t); d.err != nil {
		t.Fatalf("deliver: %v\n%s", d.err, d.stderr)
	}
	got := w.queued(t)
	if len(got) != 3 || got[0] != "--- FAIL: TestX" || got[2] != "after" {
		t.Fatalf("Codex took %d messages %.80q, want the 3 prompts in order", len(got), got)
	}
	if len(got[1]) >= maxArg || len(got[1]) < maxArg-200 || !strings.HasPrefix(got[1], huge+"é"+huge+"é") ||
		!strings.Contains(got[1], "[bgtask: prompt cut from ") || !utf8.ValidString(got[1]) {
		t.Errorf("the huge prompt was handed as %d bytes ending %q", len(got[1]), got[1][max(0, len(got[1])-120):])
	}
	if n := w.unread(t); n != 0 {
		t.Errorf("%d wake-ups left in the inbox", n)
	}
	if starts := strings.Count(w.file(t, "daemon"), "start"); starts != 1 {
		t.Errorf("Codex's daemon was started %d times, want once", starts)
	}
}

func TestDeliverNeverQueuesAHandedWakeupAgain(t *testing.T) {
	testkit.FullOnly(t)
	w := newWorld(t)
	w.wake(t, "only once")
	w.touch(t, "hold")
	done := make(chan delivered, 1)
	go func() { done <- w.deliver(t) }()
	testkit.Eventually(t, 30*time.Second, "codex queue running", func() bool { return fileExists(filepath.Join(w.dir, "holding")) })
	// Codex took it; the server goes away before the acknowledgement.
	w.server.Stop()
	os.Remove(filepath.Join(w.dir, "hold"))
	if d := <-done; d.err == nil {
		t.Fatalf("deliver acknowledged with the server down: %+v", d)
	}
	handed, err := os.ReadFile(w.ledger())
	if err != nil || !strings.HasPrefix(string(handed), "handed ") {
		t.Fatalf("the ledger: %q %v", handed, err)
	}
	if st, _ := os.Stat(w.ledger()); st.Mode().Perm() != 0o600 {
		t.Errorf("the ledger's mode is %v", st.Mode().Perm())
	}
	w.server = clienttest.Run(t, w.home)
	// Redelivered after the ack wait: acknowledged, not queued again.
	testkit.Eventually(t, time.Minute, "the inbox empty", func() bool {
		if d := w.deliver(t); d.err != nil {
			t.Fatalf("deliver after the restart: %v", d.err)
		}
		return w.unread(t) == 0
	})
	if got := w.queued(t); len(got) != 1 {
		t.Errorf("Codex took %q, want it once", got)
	}
	if fileExists(w.ledger()) {
		t.Errorf("the ledger is left after the acknowledgement")
	}
}

// A deliver killed while `codex queue` ran left the wake-up handing: whether
// Codex took it is not known, and the next deliver queues it again.
func TestDeliverQueuesAgainAWakeupWhoseQueueWasCutShort(t *testing.T) {
	w := newWorld(t)
	id := w.wake(t, "again")
	if err := os.MkdirAll(filepath.Dir(w.ledger()), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.ledger(), fmt.Appendf(nil, "handing %d %s\n", time.Now().Unix(), id), 0o600); err != nil {
		t.Fatal(err)
	}
	if d := w.deliver(t); d.err != nil {
		t.Fatal(d.err)
	}
	if got := w.queued(t); !slices.Equal(got, []string{"again"}) {
		t.Fatalf("Codex took %q, want the wake-up queued again", got)
	}
}

// A wake-up Codex did not take stays in the inbox, and deliver fails, so that
// the exec sink tries again.
func TestDeliverLeavesWhatCodexDidNotTake(t *testing.T) {
	w := newWorld(t)
	w.wake(t, "refused")
	w.touch(t, "refuse")
	if d := w.deliver(t); d.err == nil || !strings.Contains(d.err.Error(), "the thread is gone") {
		t.Fatalf("deliver that Codex refused: %v", d.err)
	}
	if n := w.unread(t); n != 1 {
		t.Fatalf("the inbox holds %d wake-ups, want 1", n)
	}
	if fileExists(w.ledger()) {
		t.Errorf("the ledger is left for a wake-up Codex did not take")
	}
	os.Remove(filepath.Join(w.dir, "refuse"))
	// Given back at once: the next deliver hands it over.
	if d := w.deliver(t); d.err != nil || !slices.Equal(w.queued(t), []string{"refused"}) {
		t.Fatalf("the next deliver: %v, Codex took %q", d.err, w.queued(t))
	}
}

// A message in the inbox that is no wake-up is dropped, with a line on stderr,
// and does not hold the wake-ups after it.
func TestDeliverDropsAnUnreadableWakeup(t *testing.T) {
	w := newWorld(t)
	if _, err := w.connect(t).Conn().Request(events.InboxSubject(TargetPrefix+w.thread), []byte("not a wake-up"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	w.wake(t, "after it")
	d := w.deliver(t)
	if d.err != nil || !strings.Contains(d.stderr, `dropped an unreadable wake-up from inbox codex-019a-t1`) || !strings.Contains(d.stderr, "not a wake-up") {
		t.Fatalf("deliver: %v, stderr %q", d.err, d.stderr)
	}
	if got := w.queued(t); !slices.Equal(got, []string{"after it"}) || w.unread(t) != 0 {
		t.Fatalf("Codex took %q, %d left", got, w.unread(t))
	}
}

func TestDeliverRunsOneAtATimePerThread(t *testing.T) {
	w := newWorld(t)
	w.wake(t, "first")
	w.wake(t, "second")
	w.touch(t, "hold")
	first := make(chan delivered, 1)
	go func() { first <- w.deliver(t) }()
	testkit.Eventually(t, 30*time.Second, "codex queue running", func() bool { return fileExists(filepath.Join(w.dir, "holding")) })
	type ended struct {
		d      delivered
		queued []string
	}
	second := make(chan ended, 1)
	go func() {
		d := w.deliver(t)
		second <- ended{d, w.queued(t)}
	}()
	// The second run waits for the first: ending now, it would leave its
	// wake-up with the first and be counted delivered.
	testkit.Eventually(t, 30*time.Second, "the second deliver waiting for the thread's lock", func() bool {
		return opened(t, filepath.Join(w.home, StateDir, TargetPrefix+w.thread+".lock")) == 2
	})
	select {
	case e := <-second:
		t.Fatalf("a second deliver ended while the first handed over: %+v, Codex had %q", e.d, e.queued)
	default:
	}
	os.Remove(filepath.Join(w.dir, "hold"))
	if d := <-first; d.err != nil {
		t.Fatal(d.err)
	}
	e := <-second
	if e.d.err != nil || !slices.Equal(e.queued, []string{"first", "second"}) {
		t.Errorf("the second deliver: %v, Codex took %q", e.d.err, e.queued)
	}
}

// A deliver behind another's lock gives up when its time is up, and says why.
func TestDeliverIsBounded(t *testing.T) {
	w := newWorld(t)
	other := &client.Handoff{Target: TargetPrefix + w.thread, Dir: filepath.Join(w.home, StateDir)}
	unlock, err := other.Lock(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	start := time.Now()
	if d := w.deliverWithin(t, time.Second); d.err == nil || time.Since(start) > 10*time.Second || !strings.Contains(d.err.Error(), "other deliver") {
		t.Errorf("deliver behind a lock: %v after %v", d.err, time.Since(start))
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// opened is how many of this process's files are open on path.
func opened(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd here:", err)
	}
	n := 0
	for _, fd := range fds {
		if dest, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && dest == path {
			n++
		}
	}
	return n
}
