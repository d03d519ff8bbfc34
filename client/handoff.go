package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Handoff hands the wake-ups of one target to an agent runtime (a hook that
// gives a session a turn, a program that queues a message in a thread), each
// once. Its state is two files in Dir: TARGET.lock, held by the one hand-off of
// the target that runs, and TARGET.handed, a ledger of the wake-ups handed over
// and not yet known acknowledged, each line synced before the step it records.
//
// A wake-up goes through: (1) a wake-up that a `wait --consume` of its task holds
// is left to it (LeaveToWaits); (2) one the ledger marks handed is only
// acknowledged; (3) it is recorded as handing; (4) Deliver hands it over; (5) it
// is recorded handed; (6) it is acknowledged, and taken out of the ledger. A
// hand-off that dies between (5) and (6) leaves it to the next, which only
// acknowledges it: exactly once. One that dies within (4) leaves "handing", and
// whether the runtime got it is not known: the next hand-off hands it over again
// if Redeliver is set (at least once), else only acknowledges it (at most once).
// A Deliver that returns an error did not hand it over: it goes back to the
// inbox.
type Handoff struct {
	// Inbox is the target's inbox.
	Inbox *Inbox
	// Dir holds the lock and the ledger; it is made (0700) if need be.
	Dir string
	// Deliver hands wake-ups to the runtime: nil means the runtime has them all.
	Deliver func(ctx context.Context, batch []Wakeup) error
	// Batch is how many wake-ups that came together Deliver gets at most (default 1).
	Batch int
	// Redeliver: a hand-over that died within Deliver is made again.
	Redeliver bool
	// Revocable: a hand-over whose context ends before it is acknowledged did
	// not happen (a runtime drops what a hook it stopped wrote), and goes back.
	Revocable bool
	// LeaveToWaits leaves a wake-up to a `wait --consume` that holds it.
	LeaveToWaits bool
	// Dropped, if set, is told of each message of the inbox that is no wake-up,
	// which is dropped.
	Dropped func(d *Delivery)
}

// ErrLocked: another hand-off of the target runs.
var ErrLocked = errors.New("another hand-off of this target runs")

// handedKeep is how long a ledger entry is kept: as long as the inbox keeps a
// wake-up, after which it cannot come back.
const handedKeep = 30 * 24 * time.Hour

// ackBound is how long a hand-off retries the acknowledgement of a wake-up
// handed over; one not made by then is made by the next hand-off, which the
// ledger keeps from handing it over again.
const ackBound = 10 * time.Second

// consumeBound is how long a wake-up is left to a `wait --consume` that holds
// it: its print and consume take milliseconds.
const consumeBound = time.Minute

// Lock takes the target's lock, held until unlock: with wait, waiting for it
// until ctx ends; without, failing with ErrLocked while another holds it. The
// kernel drops it when the process ends, however it ends.
func (h *Handoff) Lock(ctx context.Context, wait bool) (unlock func(), err error) {
	if err := os.MkdirAll(h.Dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(h.Dir, h.Inbox.target+".lock")
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !wait {
			return nil, ErrLocked
		}
		if !pause(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// Pending hands over the wake-ups in the inbox now, until there are none, and
// returns how many it handed over (not counting those only acknowledged). Hold
// the lock.
func (h *Handoff) Pending(ctx context.Context) (int, error) {
	total := 0
	for {
		n, got, err := h.round(ctx, 0)
		total += n
		if err != nil || !got {
			return total, err
		}
	}
}

// Next waits up to wait for wake-ups, hands over those that came together, and
// returns how many it handed over; 0 with no error when none came, or when all
// that came were handed over before. Hold the lock.
func (h *Handoff) Next(ctx context.Context, wait time.Duration) (int, error) {
	n, _, err := h.round(ctx, wait)
	return n, err
}

// round fetches one batch (waiting up to wait for its first) and hands it over.
func (h *Handoff) round(ctx context.Context, wait time.Duration) (handed int, got bool, err error) {
	batch := max(h.Batch, 1)
	ds, err := h.Inbox.Fetch(ctx, 1, wait)
	if err != nil || len(ds) == 0 {
		return 0, false, err
	}
	if batch > 1 {
		more, err := h.Inbox.Fetch(ctx, batch-1, 0)
		if err != nil {
			giveBack(ds)
			return 0, true, err
		}
		ds = append(ds, more...)
	}
	ledger, err := openLedger(filepath.Join(h.Dir, h.Inbox.target+".handed"))
	if err != nil {
		giveBack(ds)
		return 0, true, err
	}
	fresh := h.sort(ctx, ledger, ds)
	if len(fresh) == 0 {
		return 0, true, nil
	}
	return h.handOver(ctx, ledger, fresh)
}

// sort takes out of ds what is not to be handed over, and does with it what it
// needs: a message that is no wake-up is dropped, one a wait holds is left to
// it, one handed over before is acknowledged. It returns the rest.
func (h *Handoff) sort(ctx context.Context, ledger *ledger, ds []*Delivery) []*Delivery {
	var fresh []*Delivery
	for _, d := range ds {
		key := handedKey(d.Wakeup)
		switch {
		case d.Err != nil:
			_ = d.Drop()
			if h.Dropped != nil {
				h.Dropped(d)
			}
		case h.LeaveToWaits && h.consumedByAWait(ctx, d.Wakeup):
			h.ack(ctx, ledger, d, key)
		case ledger.state(key) == handed, ledger.state(key) == handing && !h.Redeliver:
			h.ack(ctx, ledger, d, key)
		default:
			fresh = append(fresh, d)
		}
	}
	return fresh
}

// handOver records the deliveries as handing, delivers them, records them
// handed and acknowledges them.
func (h *Handoff) handOver(ctx context.Context, ledger *ledger, ds []*Delivery) (int, bool, error) {
	keys := make([]string, len(ds))
	batch := make([]Wakeup, len(ds))
	for i, d := range ds {
		keys[i], batch[i] = handedKey(d.Wakeup), d.Wakeup
	}
	if err := ledger.set(handing, keys...); err != nil {
		giveBack(ds)
		return 0, true, err
	}
	stop := keepInProgress(ds)
	err := h.Deliver(ctx, batch)
	stop()
	if err != nil || (h.Revocable && ctx.Err() != nil) {
		_ = ledger.set("", keys...)
		giveBack(ds)
		if err == nil {
			err = ctx.Err()
		}
		return 0, true, err
	}
	if err := ledger.set(handed, keys...); err != nil {
		return len(ds), true, err // the next hand-off acknowledges them, or hands them again
	}
	deadline := time.Now().Add(ackBound)
	for i, d := range ds {
		if !ackUntil(ctx, d, deadline) {
			if h.Revocable && ctx.Err() != nil {
				_ = ledger.set("", keys[i:]...)
				giveBack(ds[i:])
				return i, true, ctx.Err()
			}
			continue // the next hand-off acknowledges it
		}
		_ = ledger.set("", keys[i])
	}
	return len(ds), true, nil
}

// ack acknowledges a wake-up not to be handed over, and takes it out of the
// ledger once that is done.
func (h *Handoff) ack(ctx context.Context, ledger *ledger, d *Delivery, key string) {
	if ackUntil(ctx, d, time.Now().Add(ackBound)) {
		_ = ledger.set("", key)
	}
}

// consumedByAWait reports whether a `wait --consume` returned and consumed the
// wake-up: it fetched it at once as it saw the task fire, and the turn that
// waited has it. It asks the task's holder until none answers; a wake-up whose
// wait ended without consuming it (killed, timed out, failed) is not.
func (h *Handoff) consumedByAWait(ctx context.Context, w Wakeup) bool {
	if w.Notice != "" || !h.heldByAWait(ctx, w.ID) {
		return false
	}
	t, err := h.Inbox.c.Get(ctx, w.ID)
	return err == nil && t.Consumed
}

// heldByAWait reports whether a holder of task id's wake-up answered, and then
// waits, up to consumeBound, until none does.
func (h *Handoff) heldByAWait(ctx context.Context, id string) bool {
	deadline := time.Now().Add(consumeBound)
	for asked := false; ; asked = true {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := h.Inbox.c.nc.RequestWithContext(rctx, ConsumingPrefix+"."+id, nil)
		cancel()
		if err != nil || time.Now().After(deadline) || !pause(ctx, 20*time.Millisecond) {
			return asked // no one answers (any more): it is the wait's if one did
		}
	}
}

// handedKey names a wake-up in a ledger: its task, and its notice, as a task's
// notice and its end are two wake-ups.
func handedKey(w Wakeup) string {
	if w.Notice != "" {
		return w.ID + "/" + w.Notice
	}
	return w.ID
}

func giveBack(ds []*Delivery) {
	for _, d := range ds {
		_ = d.Nak()
	}
}

// ackUntil acknowledges d, again and again until it works, ctx ends or the
// deadline passes.
func ackUntil(ctx context.Context, d *Delivery, deadline time.Time) bool {
	for {
		actx, cancel := context.WithDeadline(ctx, deadline)
		err := d.Ack(actx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil || time.Now().After(deadline) || !pause(ctx, retryEvery) {
			return false
		}
	}
}

// keepInProgress tells the inbox, until stop, that the deliveries are being
// handed over, so no other reader gets them meanwhile.
func keepInProgress(ds []*Delivery) (stop func()) {
	const every = 3 * time.Second // well within the inbox's ack wait
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, d := range ds {
					_ = d.InProgress()
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// The states of a wake-up in a ledger.
const (
	handing = "handing" // Deliver was called: the runtime may have it
	handed  = "handed"  // Deliver returned: the runtime has it
)

// ledger is a target's file of wake-ups handed over and not yet known
// acknowledged, one "STATE UNIX-SECONDS KEY" a line; removed when empty.
type ledger struct {
	path    string
	entries map[string]ledgerEntry
}

type ledgerEntry struct {
	state string
	at    time.Time
}

func openLedger(path string) (*ledger, error) {
	l := &ledger{path: path, entries: map[string]ledgerEntry{}}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	now := time.Now()
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) != 3 || (f[0] != handing && f[0] != handed) {
			continue
		}
		sec, err := strconv.ParseInt(f[1], 10, 64)
		if at := time.Unix(sec, 0); err == nil && now.Sub(at) < handedKeep {
			l.entries[f[2]] = ledgerEntry{state: f[0], at: at}
		}
	}
	return l, nil
}

// state is a key's state: handing, handed, or "" for none.
func (l *ledger) state(key string) string { return l.entries[key].state }

// set gives keys a state ("" takes them out) and writes the ledger, synced.
func (l *ledger) set(state string, keys ...string) error {
	now := time.Now()
	for _, k := range keys {
		if state == "" {
			delete(l.entries, k)
		} else {
			l.entries[k] = ledgerEntry{state: state, at: now}
		}
	}
	return l.write()
}

func (l *ledger) write() error {
	if len(l.entries) == 0 {
		if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	var b strings.Builder
	for k, e := range l.entries {
		fmt.Fprintf(&b, "%s %d %s\n", e.state, e.at.Unix(), k)
	}
	tmp := fmt.Sprintf("%s.%d", l.path, time.Now().UnixNano())
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, l.path)
}
