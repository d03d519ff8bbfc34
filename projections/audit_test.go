package projections_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

// history builds records of tasks through the engine's decisions.
type history struct {
	t    *testing.T
	seq  uint64
	recs []events.Record
	// now is the time of the next event; zero: the present.
	now time.Time
}

func (h *history) do(s engine.State, c engine.Command, who string) engine.State {
	h.t.Helper()
	now := h.now
	if now.IsZero() {
		now = time.Now()
	}
	ev, err := engine.Decide(s, c, engine.Meta{Writer: who, Now: now})
	if err != nil {
		h.t.Fatal(err)
	}
	return h.add(s, ev)
}

func (h *history) add(s engine.State, ev events.Event) engine.State {
	h.t.Helper()
	h.seq++
	rec := events.Record{Seq: h.seq, Event: ev}
	h.recs = append(h.recs, rec)
	next, _ := engine.Apply(s, rec)
	return next
}

func (h *history) task(id string) engine.State {
	return h.do(engine.State{ID: id}, engine.Arm{Spec: engine.Spec{Command: "true", Target: "default"}}, "engine")
}

func (h *history) fired(id string) engine.State {
	s := h.do(h.task(id), engine.Spawn{}, "w1")
	s = h.do(s, engine.Exit{Run: events.Exited{ExitCode: 0}}, "w1")
	s = h.do(s, engine.PersistCompletion{}, "engine")
	return h.do(s, engine.Fire{InboxSeq: 1}, "engine")
}

func audit(h *history, inbox ...string) projections.Report {
	a := projections.NewAudit()
	for _, rec := range h.recs {
		a.Add(rec, nil)
	}
	for _, id := range inbox {
		a.AddDelivery(id)
	}
	return a.Report()
}

func rules(r projections.Report) map[string]string {
	out := map[string]string{}
	for _, v := range r.Violations {
		out[v.Rule] = v.TaskID
	}
	return out
}

func TestAuditOfACleanLogFindsNothing(t *testing.T) {
	t.Parallel()
	h := &history{t: t}
	h.fired("a")
	h.do(h.task("b"), engine.Cancel{}, "engine")
	h.do(h.task("c"), engine.Spawn{}, "w1")
	r := audit(h, "a", "a.stalled")
	if len(r.Violations) != 0 {
		t.Fatalf("violations in a clean log: %+v", r.Violations)
	}
	if r.Tasks != 3 || r.Fired != 1 || r.Cancelled != 1 || len(r.Open) != 1 || r.Open[0].TaskID != "c" || r.Events != 9 {
		t.Fatalf("report = %+v", r)
	}
}

func TestAuditFindsEachBrokenInvariant(t *testing.T) {
	t.Parallel()
	forged := func(h *history, s engine.State, writer string, epoch uint64, p events.Payload) engine.State {
		ev, err := events.New(s.ID, writer, epoch, time.Now(), p)
		if err != nil {
			t.Fatal(err)
		}
		return h.add(s, ev)
	}
	tests := []struct {
		name  string
		build func(h *history) []string // returns the inbox
		rule  string
	}{
		{"second fired", func(h *history) []string {
			s := h.fired("t")
			forged(h, s, "engine", 1, &events.Fired{InboxSeq: 2})
			return []string{"t"}
		}, projections.RuleFiredTwice},
		{"fired before persisted", func(h *history) []string {
			s := h.do(h.task("t"), engine.Spawn{}, "w1")
			s = h.do(s, engine.Exit{}, "w1")
			forged(h, s, "engine", 1, &events.Fired{InboxSeq: 1})
			return nil
		}, projections.RuleFiredEarly},
		{"tick from a worker without the lease", func(h *history) []string {
			s := h.do(h.task("t"), engine.Spawn{}, "w1")
			forged(h, s, "w2", 1, &events.Tick{})
			return nil
		}, projections.RuleNotLeaseHolder},
		{"exit after cancel", func(h *history) []string {
			s := h.do(h.do(h.task("t"), engine.Spawn{}, "w1"), engine.Cancel{}, "engine")
			forged(h, s, "w1", 1, &events.Exited{})
			return nil
		}, projections.RuleOutOfOrder},
		{"fired without a wake-up", func(h *history) []string {
			h.fired("t")
			return nil
		}, projections.RuleInboxMissing},
		{"two wake-ups", func(h *history) []string {
			h.fired("t")
			return []string{"t", "t"}
		}, projections.RuleInboxDuplicate},
		{"two stall notices", func(h *history) []string {
			h.fired("t")
			return []string{"t", "t.stalled", "t.stalled"}
		}, projections.RuleInboxDuplicate},
		{"a timer due twice", func(h *history) []string {
			s := h.do(engine.State{ID: "t"}, engine.Arm{Spec: engine.Spec{StartAt: time.Now().Add(-time.Second).Format(time.RFC3339Nano), Target: "default"}}, "engine")
			s = h.do(s, engine.ComeDue{}, "engine")
			forged(h, s, "engine", 0, &events.Due{LateBy: "0s"})
			return nil
		}, projections.RuleTimerTwice},
		{"a retry past its count", func(h *history) []string {
			s := h.do(engine.State{ID: "t"}, engine.Arm{Spec: engine.Spec{Command: "false", Target: "default",
				Retry: &engine.Retry{Max: 1, Backoff: "1ms", MaxBackoff: "1ms", On: []string{engine.StatusFailed}}}}, "engine")
			s = h.do(h.do(s, engine.Spawn{}, "w1"), engine.Exit{Run: events.Exited{ExitCode: 1}}, "w1")
			s = h.do(s, engine.RetryLater{}, "engine")
			h.now = s.RetryAt.Add(time.Millisecond)
			s = h.do(h.do(s, engine.Spawn{}, "w1"), engine.Exit{Run: events.Exited{ExitCode: 1}}, "w1")
			forged(h, s, "engine", 2, &events.RetryScheduled{At: time.Now()})
			return nil
		}, projections.RuleRetryPastCount},
		{"a probe run again after it met its rule", func(h *history) []string {
			s := h.do(engine.State{ID: "t"}, engine.Arm{Spec: engine.Spec{Command: "check", Target: "default", ProbeEvery: "1s"}}, "engine")
			s = h.do(h.do(s, engine.Spawn{}, "w1"), engine.Exit{Run: events.Exited{ExitCode: 0}}, "w1")
			forged(h, s, "engine", 1, &events.ProbeScheduled{Probes: 1, At: time.Now()})
			return nil
		}, projections.RuleProbeAfterDone},
		{"a notice missing from the inbox", func(h *history) []string {
			s := h.do(engine.State{ID: "t"}, engine.Arm{Spec: engine.Spec{Command: "make", Target: "default",
				Notify: &engine.Notify{Type: engine.CompleteOnPattern, Regex: "^step", Max: 5}}}, "engine")
			s = h.do(s, engine.Spawn{}, "w1")
			s = h.do(h.do(s, engine.Notice{Lines: []string{"step 1"}}, "w1"), engine.Notice{Lines: []string{"step 2"}}, "w1")
			s = h.do(h.do(s, engine.Exit{Run: events.Exited{ExitCode: 0}}, "w1"), engine.PersistCompletion{}, "engine")
			h.do(s, engine.Fire{InboxSeq: 3}, "engine")
			return []string{"t", "t.n2"}
		}, projections.RuleNoticeMissing},
		{"two tasks for one schedule slot", func(h *history) []string {
			slot := engine.Occurrence{Schedule: "nightly", Slot: time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)}
			for _, id := range []string{"first", "t"} {
				s := h.do(engine.State{ID: id}, engine.Arm{Spec: engine.Spec{Command: "true", Target: "default", Occurrence: &slot}}, "engine")
				h.do(s, engine.Cancel{}, "engine")
			}
			return nil
		}, projections.RuleSlotTwice},
		{"wake-up of a cancelled task", func(h *history) []string {
			h.do(h.task("t"), engine.Cancel{}, "engine")
			return []string{"t"}
		}, projections.RuleInboxUnfired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := &history{t: t}
			h.fired("bystander")
			inbox := append(tt.build(h), "bystander")
			r := audit(h, inbox...)
			got := rules(r)
			if id, ok := got[tt.rule]; !ok || id != "t" || len(got) != 1 {
				t.Fatalf("violations = %+v, want exactly %s on task t", r.Violations, tt.rule)
			}
		})
	}
}

func TestAuditReportsACorruptEventAndGoesOn(t *testing.T) {
	t.Parallel()
	h := &history{t: t}
	h.fired("a")
	a := projections.NewAudit()
	a.Add(events.Record{Seq: 99}, errors.New("not JSON"))
	for _, rec := range h.recs {
		a.Add(rec, nil)
	}
	a.AddDelivery("a")
	r := a.Report()
	if len(r.Violations) != 1 || r.Violations[0].Rule != projections.RuleCorruptEvent || r.Fired != 1 {
		t.Fatalf("report = %+v", r)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func TestAuditFindsARunningTaskWhoseWorkerIsGone(t *testing.T) {
	t.Parallel()
	h := &history{t: t}
	h.do(h.task("kept"), engine.Spawn{}, "alive-worker")
	h.do(h.task("orphan"), engine.Spawn{}, "gone-worker")
	a := projections.NewAudit()
	for _, rec := range h.recs {
		a.Add(rec, nil)
	}
	a.CheckOwners(func(w string) bool { return w == "alive-worker" })
	r := a.Report()
	if got := rules(r); len(got) != 1 || got[projections.RuleOwnerGone] != "orphan" {
		t.Fatalf("violations = %+v, want owner-gone on orphan", r.Violations)
	}
}

func TestAuditFindsATaskStuckInItsPhase(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	bounds := projections.StuckBounds{Now: now, After: 2 * time.Minute, LeaseTTL: time.Minute}
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	ended := func(h *history, at time.Time) engine.State {
		s := h.do(h.task("t"), engine.Spawn{}, "w1")
		h.now = at
		return h.do(s, engine.Exit{Run: events.Exited{ExitCode: 3, EndedAt: at.Add(-time.Hour)}}, "w1")
	}
	running := func(h *history, deadline string, spawned time.Time) engine.State {
		h.now = spawned
		s := h.do(engine.State{ID: "t"}, engine.Arm{Spec: engine.Spec{Command: "sleep 1h", Target: "default", Deadline: deadline}}, "engine")
		return h.do(s, engine.Spawn{}, "w1")
	}
	tests := []struct {
		name  string
		build func(h *history)
		stuck string // in the detail; "": not stuck
	}{
		{"ended just now", func(h *history) { ended(h, ago(time.Minute)) }, ""},
		// Its run ended an hour before the worker could record it: the bound counts
		// from the record.
		{"ended late, recorded just now", func(h *history) { ended(h, ago(time.Second)) }, ""},
		{"ended long ago", func(h *history) { ended(h, ago(3*time.Minute)) },
			"ended (failed) since 2026-12-01T11:57:00Z (3m0s ago), over 2m0s: waits for its completion to be persisted"},
		{"persisted long ago", func(h *history) {
			s := ended(h, ago(time.Hour))
			h.now = ago(5 * time.Minute)
			h.do(s, engine.PersistCompletion{}, "engine")
		}, "persisted (failed) since 2026-12-01T11:55:00Z (5m0s ago), over 2m0s: waits for its wake-up to be fired"},
		{"running an hour, ticking", func(h *history) {
			s := running(h, "", ago(time.Hour))
			h.now = ago(10 * time.Second)
			h.do(s, engine.Tick{PID: 7}, "w1")
		}, ""},
		{"running, silent past the lease and the bound", func(h *history) {
			s := running(h, "", ago(time.Hour))
			h.now = ago(4 * time.Minute)
			h.do(s, engine.Tick{PID: 7}, "w1")
		}, "running on worker w1 with no event of its run since 2026-12-01T11:56:00Z (4m0s ago), over the lease TTL 1m0s + 2m0s: waits for a tick, its end or its loss"},
		{"running, silent within the lease and the bound", func(h *history) { running(h, "", ago(2*time.Minute+50*time.Second)) }, ""},
		{"running, its deadline passed a minute ago", func(h *history) {
			s := running(h, ago(time.Minute).Format(time.RFC3339), ago(time.Hour))
			h.now = ago(time.Second)
			h.do(s, engine.Tick{PID: 7}, "w1")
		}, ""},
		{"running, long past its deadline", func(h *history) {
			s := running(h, ago(10*time.Minute).Format(time.RFC3339), ago(time.Hour))
			h.now = ago(time.Second)
			h.do(s, engine.Tick{PID: 7}, "w1")
		}, "running on worker w1 past its deadline 2026-12-01T11:50:00Z (10m0s ago), over the lease TTL 1m0s + 2m0s: waits for its worker to stop it"},
		{"armed for a day", func(h *history) {
			h.now = ago(24 * time.Hour)
			h.task("t")
		}, ""},
		{"lost, armed again, long ago", func(h *history) {
			s := running(h, "", ago(time.Hour))
			h.add(s, lostEvent(t, ago(50*time.Minute)))
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := &history{t: t}
			tt.build(h)
			a := projections.NewAudit()
			for _, rec := range h.recs {
				a.Add(rec, nil)
			}
			a.CheckStuck(bounds)
			r := a.Report()
			if tt.stuck == "" {
				if len(r.Violations) != 0 {
					t.Fatalf("violations = %+v, want none", r.Violations)
				}
				return
			}
			if len(r.Violations) != 1 || r.Violations[0].Rule != projections.RuleStuck || r.Violations[0].TaskID != "t" || r.Violations[0].Detail != tt.stuck {
				t.Fatalf("violations = %+v, want %s on t: %q", r.Violations, projections.RuleStuck, tt.stuck)
			}
			if len(r.Open) != 1 || r.Open[0].Since.IsZero() {
				t.Fatalf("open = %+v, want t with the time of its phase", r.Open)
			}
		})
	}
}

// lostEvent is the engine's lost of w1's run, at, with on_lost respawn.
func lostEvent(t *testing.T, at time.Time) events.Event {
	ev, err := events.New("t", "engine", 1, at, &events.Lost{Worker: "w1", Action: engine.OnLostRespawn})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestAuditWithoutStuckBoundsListsOldTasksAsOpen(t *testing.T) {
	t.Parallel()
	h := &history{t: t, now: time.Now().Add(-time.Hour)}
	s := h.do(h.task("t"), engine.Spawn{}, "w1")
	h.do(s, engine.Exit{}, "w1")
	if r := audit(h); len(r.Violations) != 0 || len(r.Open) != 1 {
		t.Fatalf("report = %+v, want t open and no violation", r)
	}
}
