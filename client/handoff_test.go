package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/events"
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
	got []string
}

func newHandoff(t *testing.T, c *client.Client, target string) *handoff {
	t.Helper()
	inbox, err := c.Inbox(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	h := &handoff{}
	h.Handoff = &client.Handoff{Inbox: inbox, Dir: t.TempDir(), Batch: 10, Deliver: func(_ context.Context, batch []client.Wakeup) error {
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
	n, err := h.Pending(ctx)
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
	if err := os.WriteFile(filepath.Join(h.Dir, h.Inbox.Target()+".handed"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAHandoffDeliversEachWakeupOnce(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ids := fired(t, c, "handoff-once", 3)
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
	if _, err := h.Pending(context.Background()); err == nil {
		t.Fatal("a failed Deliver is no error")
	}
	h.Deliver = deliver
	if n := h.pending(t); n != 1 || !slices.Equal(h.got, ids) {
		t.Fatalf("after a failed Deliver: handed %d: %v", n, h.got)
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
	if _, err := h.Pending(ctx); !errors.Is(err, context.Canceled) {
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
	go func() { n, _ := h.Pending(ctx); handed <- n }()
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
	other := &client.Handoff{Inbox: h.Inbox, Dir: h.Dir}
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
