package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/projections"
)

// scheduleBundle is the store, a projector and the schedules bucket on one server.
type scheduleBundle struct {
	*bundle
	proj      *projections.Projector
	schedules *events.Schedules
	svc       *engine.Service

	mu      sync.Mutex
	created map[string]int // by idempotency key: registrations that armed a task

	// ahead is how far the runners' clock is ahead of the wall clock.
	ahead atomic.Int64
}

// now is the runners' clock.
func (b *scheduleBundle) now() time.Time { return time.Now().Add(time.Duration(b.ahead.Load())) }

func setupSchedules(t *testing.T) *scheduleBundle {
	t.Helper()
	b := &scheduleBundle{bundle: setup(t), created: map[string]int{}}
	ctx := context.Background()
	var err error
	if b.schedules, err = events.OpenSchedules(ctx, b.srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	b.proj = projections.New(b.store, nil, engine.Base{})
	if err := b.proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.proj.Stop)
	b.svc = engine.NewService(b.store, engineWriter, engine.Base{})
	return b
}

// register is Service.Register, counting the tasks it arms by key.
func (b *scheduleBundle) register(ctx context.Context, raw []byte) (string, bool, error) {
	id, created, err := b.svc.Register(ctx, raw)
	if created {
		var spec engine.Spec
		_ = json.Unmarshal(raw, &spec)
		b.mu.Lock()
		b.created[spec.IdempotencyKey]++
		b.mu.Unlock()
	}
	return id, created, err
}

func (b *scheduleBundle) runner(t *testing.T) *engine.ScheduleRunner {
	t.Helper()
	r := engine.NewScheduleRunner(b.schedules, b.register, b.proj, b.svc.Cancel, engine.Base{Now: b.now})
	r.TestSignals.Ran.Init(t) // a pass a second or two: a test may leave them unread
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// awaitPassAfter waits for a pass of r begun after at: any pass that read the
// schedules before is over.
func awaitPassAfter(t *testing.T, r *engine.ScheduleRunner, at time.Time) {
	t.Helper()
	r.TestSignals.Ran.WaitFor(15*time.Second, "a pass over the schedules begun after "+at.Format(time.StampMilli), func(began time.Time) bool {
		return began.After(at)
	})
}

func (b *scheduleBundle) add(t *testing.T, s engine.Schedule) engine.Schedule {
	t.Helper()
	s.Spec = json.RawMessage(`{"command":"echo tick"}`)
	s, err := engine.AddSchedule(context.Background(), b.schedules, s, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *scheduleBundle) stored(t *testing.T, name string) engine.Schedule {
	t.Helper()
	e, err := b.schedules.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.DecodeSchedule(e.Value)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Two engines run one schedule: every slot is registered, each once, and a
// pause holds.
func TestTwoScheduleRunnersRegisterEverySlotOnce(t *testing.T) {
	b := setupSchedules(t)
	runners := []*engine.ScheduleRunner{b.runner(t), b.runner(t)}
	s := b.add(t, engine.Schedule{Name: "tick", Every: "1s", Overlap: engine.OverlapAllow, CatchUp: engine.CatchUpAll})
	testkit.Eventually(t, 15*time.Second, "five slots", func() bool { return b.stored(t, "tick").After.Sub(s.CreatedAt) >= 5*time.Second })
	pausedAt := time.Now()
	if _, err := engine.PauseSchedule(context.Background(), b.schedules, "tick", true, pausedAt); err != nil {
		t.Fatal(err)
	}
	// The clock moves once no pass that read the schedule before the pause runs:
	// one would register the slots of the time it moved over.
	for _, r := range runners {
		awaitPassAfter(t, r, pausedAt)
	}
	// Two slots' time passes for the runners, then a change to the schedules
	// wakes each to a pass that reads the pause: a runner that wrote back what
	// it read before the pause, or registered the slots of a paused schedule,
	// has done so by its end.
	b.ahead.Add(int64(2 * time.Second))
	woken := b.now()
	b.add(t, engine.Schedule{Name: "yearly", Cron: "0 0 1 1 *"})
	for _, r := range runners {
		awaitPassAfter(t, r, woken)
	}
	if got := b.stored(t, "tick"); !got.Paused {
		t.Fatal("a runner unpaused the schedule, writing back what it read before")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var last time.Time
	for key := range b.created {
		slot, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(key, "schedule/tick/"))
		if err != nil {
			t.Fatal(err)
		}
		last = maxTime(last, slot)
	}
	// A runner may have been registering a slot as the pause came: one at most.
	if last.After(pausedAt.Add(time.Second)) {
		t.Errorf("slot %s registered after the pause at %s", last, pausedAt)
	}
	slots, n := s.SlotsBetween(s.CreatedAt, last, engine.MaxCatchUp)
	for _, slot := range slots {
		if k := engine.OccurrenceKey("tick", slot); b.created[k] != 1 {
			t.Errorf("slot %s registered %d times", slot, b.created[k])
		}
	}
	if len(b.created) != n || n < 5 {
		t.Errorf("%d occurrences registered for %d slots: %v", len(b.created), n, b.created)
	}
	testkit.Eventually(t, 15*time.Second, "every occurrence in the projection", func() bool { return len(b.proj.Occurrences("tick", 0)) >= n })
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// With overlap skip, a slot is skipped while the previous occurrence runs (no
// worker takes it here), and runs once it is over.
func TestScheduleOverlapSkipWaitsForThePrevious(t *testing.T) {
	b := setupSchedules(t)
	b.runner(t)
	b.add(t, engine.Schedule{Name: "slow", Every: "1s"})
	testkit.Eventually(t, 15*time.Second, "a first occurrence", func() bool { return b.stored(t, "slow").LastID != "" })
	first := b.stored(t, "slow")
	testkit.Eventually(t, 15*time.Second, "two skipped slots", func() bool { return b.stored(t, "slow").After.Sub(first.LastSlot) >= 2*time.Second })
	if got := b.stored(t, "slow"); got.LastID != first.LastID {
		t.Fatalf("a second occurrence while the first is armed: %s", got.LastID)
	}
	if _, err := b.svc.Cancel(context.Background(), first.LastID, "done"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "the next occurrence", func() bool { return b.stored(t, "slow").LastID != first.LastID })
	if occ := b.proj.Occurrences("slow", 0); len(occ) < 1 {
		t.Fatalf("occurrences: %v", occ)
	}
}

// With overlap cancel_previous, the next slot cancels the previous occurrence.
func TestScheduleOverlapCancelPrevious(t *testing.T) {
	b := setupSchedules(t)
	b.runner(t)
	b.add(t, engine.Schedule{Name: "latest", Every: "1s", Overlap: engine.OverlapCancelPrevious})
	testkit.Eventually(t, 15*time.Second, "a first occurrence", func() bool { return b.stored(t, "latest").LastID != "" })
	first := b.stored(t, "latest").LastID
	testkit.Eventually(t, 15*time.Second, "the first cancelled", func() bool {
		st, ok := b.proj.Task(first)
		return ok && st.Phase == engine.PhaseCancelled
	})
}

// A trigger registers an occurrence now; a paused schedule registers none.
func TestScheduleTriggerAndPause(t *testing.T) {
	b := setupSchedules(t)
	ctx := context.Background()
	b.add(t, engine.Schedule{Name: "manual", Cron: "0 0 1 1 *"})
	if _, err := engine.PauseSchedule(ctx, b.schedules, "manual", true, time.Now()); err != nil {
		t.Fatal(err)
	}
	id, err := engine.TriggerSchedule(ctx, b.schedules, b.register, "manual", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := b.stored(t, "manual"); got.LastID != id || !got.Paused {
		t.Fatalf("after trigger: %+v", got)
	}
	testkit.Eventually(t, 15*time.Second, "the occurrence", func() bool {
		occ := b.proj.Occurrences("manual", 0)
		return len(occ) == 1 && occ[0].ID == id
	})
}

// pausingStore pauses the schedule between the runner's read and its update,
// once: as a client's pause racing an engine would.
type pausingStore struct {
	*events.Schedules
	once sync.Once
	// paused is closed once the pause is stored, at pausedAt.
	paused   chan struct{}
	pausedAt time.Time
}

func (p *pausingStore) Update(ctx context.Context, name string, value []byte, rev uint64) (uint64, error) {
	p.once.Do(func() {
		if _, err := engine.PauseSchedule(ctx, p.Schedules, name, true, time.Now()); err != nil {
			panic(err)
		}
		p.pausedAt = time.Now()
		close(p.paused)
	})
	return p.Schedules.Update(ctx, name, value, rev)
}

// A runner's advance is conditional on what it read: a pause made meanwhile stands.
func TestScheduleRunnerKeepsAChangeMadeMeanwhile(t *testing.T) {
	b := setupSchedules(t)
	b.add(t, engine.Schedule{Name: "raced", Every: "1s", Overlap: engine.OverlapAllow})
	store := &pausingStore{Schedules: b.schedules, paused: make(chan struct{})}
	r := engine.NewScheduleRunner(store, b.register, b.proj, b.svc.Cancel, engine.Base{})
	r.TestSignals.Ran.Init(t)
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	select {
	case <-store.paused:
	case <-time.After(15 * time.Second):
		t.Fatal("the runner did not store its first advance")
	}
	// A pass begun after the pause reads it: the one that raced it is over.
	awaitPassAfter(t, r, store.pausedAt)
	if got := b.stored(t, "raced"); !got.Paused {
		t.Fatalf("the runner undid the pause made while it registered: %+v", got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.created) != 1 {
		t.Fatalf("%d occurrences after the pause, want the one in flight", len(b.created))
	}
}
