package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// fired registers timers for a target of the test's own and returns their ids
// once they have fired: their wake-ups are in its inbox.
func fired(t *testing.T, c *client.Client, target string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for i := range n {
		reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: fmt.Sprintf("wake-up %d", i), Target: target})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, reg.ID)
	}
	for _, id := range ids {
		if _, err := c.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// handoff is a hand-off of a target of the test's own, which records what it delivers.
type handoff struct {
	*client.Handoff
	c   *client.Client
	mu  sync.Mutex
	got []string
}

func newHandoff(t *testing.T, c *client.Client, target string) *handoff {
	t.Helper()
	h := &handoff{c: c}
	h.Handoff = &client.Handoff{Target: target, Dir: t.TempDir(), Batch: 10, Deliver: func(_ context.Context, batch []client.Wakeup) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, w := range batch {
			h.got = append(h.got, w.ID)
		}
		return nil
	}}
	return h
}

func (h *handoff) pending(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := h.Pending(ctx, h.c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ledger writes a target's ledger as a hand-off that died at a step leaves it.
func ledger(t *testing.T, h *handoff, state string, ids ...string) {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%s %d %s\n", state, time.Now().Unix(), id)
	}
	if err := os.WriteFile(filepath.Join(h.Dir, h.Target+".handed"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAHandoffDeliversEachWakeupOnce(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ids := fired(t, c, "handoff-once", 3)
	inbox, err := c.Inbox(context.Background(), "handoff-once")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := inbox.Unread(context.Background()); n != 3 || err != nil {
		t.Errorf("the inbox holds %d unacknowledged, want 3: %v", n, err)
	}
	h := newHandoff(t, c, "handoff-once")
	// Timers due together fire in any order.
	if n := h.pending(t); n != 3 || !slices.Equal(slices.Sorted(slices.Values(h.got)), slices.Sorted(slices.Values(ids))) {
		t.Fatalf("handed %d: %v, want %v", n, h.got, ids)
	}
	if n := h.pending(t); n != 0 || len(h.got) != 3 {
		t.Fatalf("a second hand-off handed %d: %v", n, h.got)
	}
	if _, err := os.Stat(filepath.Join(h.Dir, "handoff-once.handed")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ledger is left once all is acknowledged: %v", err)
	}
	if n, err := inbox.Unread(context.Background()); n != 0 || err != nil {
		t.Errorf("after the hand-off the inbox holds %d unacknowledged: %v", n, err)
	}
}

// A hand-off that died after Deliver returned, before its acknowledgement, left
// the wake-up handed in the ledger: the next one acknowledges it only.
func TestAWakeupHandedBeforeIsOnlyAcknowledged(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ids := fired(t, c, "handoff-handed", 2)
	h := newHandoff(t, c, "handoff-handed")
	ledger(t, h, "handed", ids[0])
	if n := h.pending(t); n != 1 || !slices.Equal(h.got, ids[1:]) {
		t.Fatalf("handed %d: %v, want %v alone", n, h.got, ids[1:])
	}
	if n := h.pending(t); n != 0 {
		t.Fatalf("the wake-up handed before was not acknowledged: handed %d more", n)
	}
}

// One that died within Deliver left it handing: at most once by default, at
// least once with Redeliver.
func TestAWakeupLeftHandingIsHandedAgainOnlyWithRedeliver(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	for _, redeliver := range []bool{false, true} {
		target := fmt.Sprintf("handoff-handing-%v", redeliver)
		ids := fired(t, c, target, 1)
		h := newHandoff(t, c, target)
		h.Redeliver = redeliver
		ledger(t, h, "handing", ids[0])
		if n := h.pending(t); (n == 1) != redeliver {
			t.Errorf("Redeliver %v: handed %d: %v", redeliver, n, h.got)
		}
		if n := h.pending(t); n != 0 {
			t.Errorf("Redeliver %v: handed %d more", redeliver, n)
		}
	}
}

// A Deliver that fails hands nothing over: the wake-up is back in the inbox for
// the next hand-off.
func TestAFailedDeliverLeavesTheWakeupInTheInbox(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ids := fired(t, c, "handoff-failed", 1)
	h := newHandoff(t, c, "handoff-failed")
	deliver := h.Deliver
	h.Deliver = func(context.Context, []client.Wakeup) error { return errors.New("the session is gone") }
	if _, err := h.Pending(context.Background(), c); err == nil {
		t.Fatal("a failed Deliver is no error")
	}
	h.Deliver = deliver
	// Given back, it is delivered again a moment after (the server's doing,
	// announced by nothing), well within the ack wait after which it would come
	// back anyway.
	testkit.Eventually(t, events.InboxAckWait/2, "the wake-up given back handed over", func() bool { return h.pending(t) > 0 })
	if !slices.Equal(h.got, ids) {
		t.Fatalf("after a failed Deliver: handed %v, want %v", h.got, ids)
	}
}

// A revocable hand-over cut short by its context goes back to the inbox.
func TestARevocableHandoverCutShortGoesBack(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ids := fired(t, c, "handoff-revocable", 1)
	h := newHandoff(t, c, "handoff-revocable")
	h.Revocable = true
	ctx, cancel := context.WithCancel(context.Background())
	h.Deliver = func(context.Context, []client.Wakeup) error { cancel(); return nil } // the hook was stopped
	if _, err := h.Pending(ctx, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("a hand-over cut short: %v", err)
	}
	h = newHandoff(t, c, "handoff-revocable")
	if n := h.pending(t); n != 1 || !slices.Equal(h.got, ids) {
		t.Fatalf("after a hand-over cut short: handed %d: %v", n, h.got)
	}
}

// A wake-up that a wait --consume returned and consumed is left to it.
func TestAWakeupAWaitConsumedIsLeftToIt(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Target: "handoff-waited"})
	if err != nil {
		t.Fatal(err)
	}
	release, err := c.HoldWakeup(reg.ID)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Wait(ctx, reg.ID)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandoff(t, c, "handoff-waited")
	h.LeaveToWaits = true
	handed := make(chan int, 1)
	go func() { n, _ := h.Pending(ctx, c); handed <- n }()
	if ok, err := c.ConsumeWakeup(ctx, task); !ok || err != nil {
		t.Fatalf("consume: %v %v", ok, err)
	}
	release()
	if n := <-handed; n != 0 || len(h.got) != 0 {
		t.Fatalf("the hand-off handed over %d wake-ups a wait consumed: %v", n, h.got)
	}
}

// One hand-off of a target runs at a time.
func TestOneHandoffOfATargetRunsAtATime(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	h := newHandoff(t, c, "handoff-lock")
	unlock, err := h.Lock(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	other := &client.Handoff{Target: h.Target, Dir: h.Dir}
	if _, err := other.Lock(context.Background(), false); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("a second lock: %v, want ErrLocked", err)
	}
	var took atomic.Bool
	done := make(chan error, 1)
	go func() {
		u, err := other.Lock(context.Background(), true)
		if err == nil {
			took.Store(true)
			u()
		}
		done <- err
	}()
	unlock()
	if err := <-done; err != nil || !took.Load() {
		t.Fatalf("a lock that waits: %v", err)
	}
}

// A message in the inbox that is no wake-up is dropped, and said.
func TestAMessageThatIsNoWakeupIsDropped(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	h := newHandoff(t, c, "handoff-garbage")
	if _, err := c.Conn().Request(events.InboxSubject("handoff-garbage"), []byte("not a wake-up"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var dropped []string
	h.Dropped = func(d *client.Delivery) { dropped = append(dropped, string(d.Raw)) }
	if n := h.pending(t); n != 0 || !slices.Equal(dropped, []string{"not a wake-up"}) {
		t.Fatalf("handed %d, dropped %q", n, dropped)
	}
	if n := h.pending(t); n != 0 || len(dropped) != 1 {
		t.Fatalf("the dropped message came back: dropped %q", dropped)
	}
}

// A hand-off removes its lock file as it lets go, and the lock still lets one
// hand-off run at a time: one that waited on the file removed takes the file
// there now.
func TestALockLetGoIsRemovedAndStillExcludes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "handoff-exclusive.lock")
	h := &client.Handoff{Target: "handoff-exclusive", Dir: dir}
	unlock, err := h.Lock(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	taken := make(chan func(), 1)
	go func() {
		u, err := h.Lock(context.Background(), true)
		if err != nil {
			t.Error(err)
		}
		taken <- u
	}()
	testkit.Eventually(t, 10*time.Second, "the second hand-off waiting on the lock file", func() bool { return opened(t, path) == 2 })
	unlock()
	unlockSecond := <-taken
	if _, err := h.Lock(context.Background(), false); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("a third hand-off while the second holds the lock: %v, want ErrLocked", err)
	}
	unlockSecond()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lock file is left: %v", err)
	}
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

// A hand-off that takes its lock removes the ledgers and locks of Dir that no
// hand-off touched for 30 days, but a lock another holds.
func TestOldLedgersAndLocksArePruned(t *testing.T) {
	dir := t.TempDir()
	held := &client.Handoff{Target: "held", Dir: dir}
	unlock, err := held.Lock(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	old := time.Now().Add(-31 * 24 * time.Hour)
	for _, name := range []string{"gone.handed", "gone.handed.1712345", "gone.lock", "held.lock", "live.handed", "live.lock", "gone.log"} {
		path := filepath.Join(dir, name)
		if name != "held.lock" {
			if err := os.WriteFile(path, []byte("handed 1 x\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if !strings.HasPrefix(name, "live") {
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	other := &client.Handoff{Target: "other", Dir: dir}
	unlockOther, err := other.Lock(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	unlockOther()
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"gone.log", "held.lock", "live.handed", "live.lock"}; !slices.Equal(left, want) {
		t.Fatalf("after pruning: %v, want %v", left, want)
	}
}

// A hand-off whose acknowledgement the server does not confirm (it stopped)
// says so; the next one acknowledges the wake-up and hands it over no more.
func TestAHandoverNotAcknowledgedIsOnlyAcknowledgedNext(t *testing.T) {
	testkit.FullOnly(t)
	dir := t.TempDir()
	srv := clienttest.Run(t, dir)
	c := connect(t, dir)
	ids := fired(t, c, "handoff-unacked", 1)
	h := newHandoff(t, c, "handoff-unacked")
	deliver := h.Deliver
	h.Deliver = func(ctx context.Context, batch []client.Wakeup) error {
		srv.Stop()
		return deliver(ctx, batch)
	}
	began := time.Now()
	if n, err := h.Pending(context.Background(), c); n != 1 || !errors.Is(err, client.ErrUnacknowledged) {
		t.Fatalf("a hand-over whose server stopped: %d, %v; want 1 and ErrUnacknowledged", n, err)
	}
	// The server is gone for good: the acknowledgement is not retried for its 10 s.
	if d := time.Since(began); d > 8*time.Second {
		t.Errorf("the hand-over took %v to give up its acknowledgement", d)
	}
	clienttest.Run(t, dir)
	c = connect(t, dir)
	h.Deliver = deliver
	ledger := filepath.Join(h.Dir, "handoff-unacked.handed")
	testkit.Eventually(t, time.Minute, "the wake-up acknowledged", func() bool {
		if n, err := h.Pending(context.Background(), c); n != 0 || err != nil {
			t.Fatalf("the next hand-off handed %d: %v", n, err)
		}
		_, err := os.Stat(ledger)
		return errors.Is(err, os.ErrNotExist)
	})
	if !slices.Equal(h.got, ids) {
		t.Fatalf("handed %v, want %v once", h.got, ids)
	}
}

// Await waits for a wake-up through restarts of the server, and while none
// runs, and hands it over.
func TestAwaitWaitsThroughRestartsOfTheServer(t *testing.T) {
	dir := t.TempDir()
	srv := clienttest.Run(t, dir)
	h := newHandoff(t, nil, "handoff-await")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := h.Await(ctx, client.Config{Home: dir})
		done <- result{n, err}
	}()
	waitsInTheInbox(t, dir, "handoff-await")
	srv.Stop()
	srv = clienttest.Run(t, dir)
	waitsInTheInbox(t, dir, "handoff-await")
	srv.Stop()
	clienttest.Run(t, dir)
	ids := fired(t, connect(t, dir), "handoff-await", 1)
	if r := <-done; r.n != 1 || r.err != nil || !slices.Equal(h.got, ids) {
		t.Fatalf("Await: %d, %v, handed %v; want %v", r.n, r.err, h.got, ids)
	}
}

// waitsInTheInbox returns once a reader waits for a wake-up of target.
func waitsInTheInbox(t *testing.T, dir, target string) {
	t.Helper()
	c := connect(t, dir)
	js, err := jetstream.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "a reader waiting in the inbox of "+target, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	c.Close()
}

// Await gives up at once where no server ever ran, and on an error of Deliver.
func TestAwaitGivesUpOnWhatWaitingDoesNotMend(t *testing.T) {
	h := newHandoff(t, nil, "handoff-await-none")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var absent *client.NoServerError
	if _, err := h.Await(ctx, client.Config{Home: t.TempDir()}); !errors.As(err, &absent) || !absent.Never {
		t.Fatalf("Await in a home where no server ran: %v", err)
	}

	c := connect(t, os.Getenv("BGTASK_HOME"))
	fired(t, c, "handoff-await-refused", 1)
	h = newHandoff(t, c, "handoff-await-refused")
	refused := errors.New("the session is gone")
	h.Deliver = func(context.Context, []client.Wakeup) error { return refused }
	if n, err := h.Await(ctx, client.Config{}); n != 0 || !errors.Is(err, refused) || ctx.Err() != nil {
		t.Fatalf("Await whose Deliver fails: %d, %v", n, err)
	}
}
