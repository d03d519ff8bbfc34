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

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"
)

// Handoff hands the wake-ups of one target to an agent runtime (a hook that
// gives a session a turn, a program that queues a message in a thread), each
// once. Its state is two files in Dir: TARGET.lock, held by the one hand-off of
// the target that runs (and removed when it lets go), and TARGET.handed, a
// ledger of the wake-ups handed over and not yet known acknowledged, each line
// synced before the step it records. A hand-off that takes the lock removes the
// files of Dir that no hand-off touched for 30 days (a wake-up is kept as long).
//
// A wake-up goes through: (1) a wake-up that a `wait --consume` of its task holds
// is left to it (LeaveToWaits); (2) one the ledger marks handed is only
// acknowledged; (3) it is recorded as handing; (4) Deliver hands it over; (5) it
// is recorded handed; (6) it is acknowledged, and taken out of the ledger. A
// hand-off that dies between (5) and (6), or whose acknowledgement the server
// does not confirm (ErrUnacknowledged), leaves it to the next, which only
// acknowledges it: exactly once. One that dies within (4) leaves "handing", and
// whether the runtime got it is not known: the next hand-off hands it over again
// if Redeliver is set (at least once), else only acknowledges it (at most once).
// A Deliver that returns an error did not hand it over: it goes back to the
// inbox, and so does, with Revocable, a hand-over cut short by its context.
type Handoff struct {
	// Target names the inbox whose wake-ups are handed over, and the files in Dir.
	Target string
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

	inbox *Inbox // the inbox of the client last used
}

// ErrLocked: another hand-off of the target runs.
var ErrLocked = errors.New("another hand-off of this target runs")

// ErrUnacknowledged: wake-ups were handed over, and the server did not confirm
// their acknowledgement in time (it went away). The ledger has them handed: the
// next hand-off of the target acknowledges them, and hands them over no more.
var ErrUnacknowledged = errors.New("wake-ups handed over and not acknowledged yet (the next hand-off acknowledges them)")

// handedKeep is how long a ledger entry is kept: as long as the inbox keeps a
// wake-up, after which it cannot come back.
const handedKeep = 30 * 24 * time.Hour

// ackBound is how long a hand-off retries the acknowledgement of a wake-up
// handed over, while its connection lasts; one not made by then is made by the
// next hand-off, which the ledger keeps from handing it over again.
const ackBound = 10 * time.Second

// consumeBound is how long a wake-up is left to a `wait --consume` that holds
// it: its print and consume take milliseconds.
const consumeBound = time.Minute

// awaitFetch bounds each of Await's waits for a wake-up: a wait that a restart
// of the server cut short is made again within it.
const awaitFetch = 20 * time.Second

// Lock takes the target's lock, held until unlock: with wait, waiting for it
// until ctx ends; without, failing with ErrLocked while another holds it. The
// kernel drops it when the process ends, however it ends.
func (h *Handoff) Lock(ctx context.Context, wait bool) (unlock func(), err error) {
	if err := CheckTarget(h.Target); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(h.Dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(h.Dir, h.Target+".lock")
	f, err := lockFile(ctx, path, wait)
	if err != nil {
		return nil, err
	}
	prune(h.Dir, time.Now())
	return func() { _ = os.Remove(path); f.Close() }, nil
}

// lockFile takes the lock of the file at path (made if need be): with wait,
// waiting for it until ctx ends; without, failing with ErrLocked while another
// holds it. A holder removes the file as it lets go, so a lock taken on a file
// that is no longer the one at path is let go, and the one there now taken.
func lockFile(ctx context.Context, path string, wait bool) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := flock(ctx, f, wait); err != nil {
			f.Close()
			return nil, err
		}
		locked, serr := f.Stat()
		now, perr := os.Stat(path)
		if serr == nil && perr == nil && os.SameFile(locked, now) {
			return f, nil
		}
		f.Close()
	}
}

// flock takes f's lock, trying again while another holds it with wait.
func flock(ctx context.Context, f *os.File, wait bool) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, unix.EWOULDBLOCK):
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		case !wait:
			return ErrLocked
		case !pause(ctx, 50*time.Millisecond):
			return ctx.Err()
		}
	}
}

// prune removes the ledgers and locks in dir that no hand-off touched for
// handedKeep: every entry of such a ledger is past, and a lock that no one holds
// is only a file.
func prune(dir string, now time.Time) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		lock := strings.HasSuffix(e.Name(), ".lock")
		if !lock && !strings.Contains(e.Name(), ".handed") { // a ledger, or the temp file of one
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < handedKeep {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !lock {
			_ = os.Remove(path)
		} else if f, err := lockFile(context.Background(), path, false); err == nil {
			_ = os.Remove(path)
			f.Close()
		}
	}
}

// Pending hands over the wake-ups in c's inbox of the target now, until there
// are none, and returns how many it handed over (not counting those only
// acknowledged). Hold the lock.
func (h *Handoff) Pending(ctx context.Context, c *Client) (int, error) {
	total := 0
	for {
		n, got, err := h.round(ctx, c, 0)
		total += n
		if err != nil || !got {
			return total, err
		}
	}
}

// Next waits up to wait for wake-ups, hands over those that came together, and
// returns how many it handed over; 0 with no error when none came, or when all
// that came were handed over before. Hold the lock.
func (h *Handoff) Next(ctx context.Context, c *Client, wait time.Duration) (int, error) {
	n, _, err := h.round(ctx, c, wait)
	return n, err
}

// Await waits for wake-ups, as long as ctx lasts, and hands over the first that
// come with those that came together (Next); it returns how many it handed over.
// It waits through restarts of the server and while none runs, connecting with
// cfg, and again whenever the connection fails. It gives up on an error of
// Deliver, and on cfg's home when no server ever ran there (a *NoServerError).
// Hold the lock.
func (h *Handoff) Await(ctx context.Context, cfg Config) (int, error) {
	for {
		n, again, err := h.awaitOn(ctx, cfg)
		switch {
		case n > 0:
			return n, err
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case !again:
			return 0, err
		}
		if !pause(ctx, retryEvery) {
			return 0, ctx.Err()
		}
	}
}

// awaitOn waits on one connection; again says whether another may mend its
// failure.
func (h *Handoff) awaitOn(ctx context.Context, cfg Config) (n int, again bool, err error) {
	c, err := Connect(ctx, cfg)
	if err != nil {
		// A server absent, even gone, may start again; a home that cannot be read,
		// or where none ever ran, will not change.
		var absent *NoServerError
		return 0, errors.As(err, &absent) && !absent.Never, err
	}
	defer c.Close()
	for {
		n, err := h.Next(ctx, c, awaitFetch)
		switch {
		case errors.As(err, new(deliverError)):
			return n, false, err
		case err != nil:
			return n, true, err // of the connection, the inbox or the ledger
		case n > 0, ctx.Err() != nil:
			return n, false, nil
		}
	}
}

// deliverError is an error of Deliver: the runtime's, which no new connection
// mends.
type deliverError struct{ error }

func (e deliverError) Unwrap() error { return e.error }

// round fetches one batch (waiting up to wait for its first) and hands it over.
func (h *Handoff) round(ctx context.Context, c *Client, wait time.Duration) (handed int, got bool, err error) {
	inbox, err := h.inboxOf(ctx, c)
	if err != nil {
		return 0, false, err
	}
	batch := max(h.Batch, 1)
	ds, err := inbox.Fetch(ctx, 1, wait)
	if err != nil || len(ds) == 0 {
		return 0, false, err
	}
	if batch > 1 {
		more, err := inbox.Fetch(ctx, batch-1, 0)
		if err != nil {
			giveBack(ds)
			return 0, true, err
		}
		ds = append(ds, more...)
	}
	ledger, err := openLedger(filepath.Join(h.Dir, h.Target+".handed"))
	if err != nil {
		giveBack(ds)
		return 0, true, err
	}
	fresh := h.sort(ctx, c, ledger, ds)
	if len(fresh) == 0 {
		return 0, true, nil
	}
	return h.handOver(ctx, ledger, fresh)
}

// inboxOf is c's inbox of the target.
func (h *Handoff) inboxOf(ctx context.Context, c *Client) (*Inbox, error) {
	if h.inbox == nil || h.inbox.c != c {
		inbox, err := c.Inbox(ctx, h.Target)
		if err != nil {
			return nil, err
		}
		h.inbox = inbox
	}
	return h.inbox, nil
}

// sort takes out of ds what is not to be handed over, and does with it what it
// needs: a message that is no wake-up is dropped, one a wait holds is left to
// it, one handed over before is acknowledged. It returns the rest.
func (h *Handoff) sort(ctx context.Context, c *Client, ledger *ledger, ds []*Delivery) []*Delivery {
	var fresh []*Delivery
	for _, d := range ds {
		key := handedKey(d.Wakeup)
		switch {
		case d.Err != nil:
			_ = d.Drop()
			if h.Dropped != nil {
				h.Dropped(d)
			}
		case h.LeaveToWaits && consumedByAWait(ctx, c, d.Wakeup):
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
	acked := make([]bool, len(ds))
	switch {
	case err != nil:
		revoke(ledger, ds, keys, acked)
		return 0, true, deliverError{err}
	case h.Revocable && ctx.Err() != nil:
		revoke(ledger, ds, keys, acked)
		return 0, true, ctx.Err()
	}
	if err := ledger.set(handed, keys...); err != nil {
		return len(ds), true, err // the next hand-off acknowledges them, or hands them again
	}
	deadline := time.Now().Add(ackBound)
	unacked := 0
	for i, d := range ds {
		if acked[i] = ackUntil(ctx, d, deadline); acked[i] {
			_ = ledger.set("", keys[i])
		} else {
			unacked++
		}
		if h.Revocable && ctx.Err() != nil {
			return len(ds) - unacked - revoke(ledger, ds, keys, acked), true, ctx.Err()
		}
	}
	if unacked > 0 {
		return len(ds), true, fmt.Errorf("%w: %d of %d", ErrUnacknowledged, unacked, len(ds))
	}
	return len(ds), true, nil
}

// revoke takes the deliveries not acknowledged out of the ledger and gives them
// back to the inbox, and returns how many those were.
func revoke(ledger *ledger, ds []*Delivery, keys []string, acked []bool) int {
	var back []string
	for i, d := range ds {
		if !acked[i] {
			back = append(back, keys[i])
			_ = d.Nak()
		}
	}
	_ = ledger.set("", back...)
	return len(back)
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
// waited has it. It waits while the task's holder answers, then asks whether the
// task was consumed (a wait may have consumed it and let go before the first
// question); a wake-up whose wait ended without consuming it (killed, timed out,
// failed) is not.
func consumedByAWait(ctx context.Context, c *Client, w Wakeup) bool {
	if w.Notice != "" {
		return false
	}
	waitWhileHeld(ctx, c, w.ID)
	t, err := c.Get(ctx, w.ID)
	return err == nil && t.Consumed
}

// waitWhileHeld waits, up to consumeBound, while a holder of task id's wake-up
// answers.
func waitWhileHeld(ctx context.Context, c *Client, id string) {
	deadline := time.Now().Add(consumeBound)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.nc.RequestWithContext(rctx, ConsumingPrefix+"."+id, nil)
		cancel()
		if err != nil || time.Now().After(deadline) || !pause(ctx, 20*time.Millisecond) {
			return
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

// ackUntil acknowledges d, again and again until it works, ctx ends, the
// deadline passes or the connection is closed (the server is gone for good).
func ackUntil(ctx context.Context, d *Delivery, deadline time.Time) bool {
	for {
		actx, cancel := context.WithDeadline(ctx, deadline)
		err := d.Ack(actx)
		cancel()
		switch {
		case err == nil:
			return true
		case errors.Is(err, nats.ErrConnectionClosed), ctx.Err() != nil, time.Now().After(deadline), !pause(ctx, retryEvery):
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
