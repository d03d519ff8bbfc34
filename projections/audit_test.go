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
}

func (h *history) do(s engine.State, c engine.Command, who string) engine.State {
	h.t.Helper()
	ev, err := engine.Decide(s, c, engine.Meta{Writer: who, Now: time.Now()})
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
