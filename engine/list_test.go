package engine_test

import (
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
)

// A list query selects a task only if every filter it gives holds: since is in,
// until is not, and the labels asked for are a part of the task's placement.
func TestListQuerySelectsByEveryFilter(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	task := engine.Listed{Phase: engine.PhaseFired, Status: engine.StatusFailed, Target: "agent-1", Kind: "build",
		Placement: &engine.Placement{Labels: map[string]string{"pool": "blue", "host": "h1"}}, ArmedAt: at}
	for _, tc := range []struct {
		q    engine.ListQuery
		want bool
	}{
		{engine.ListQuery{}, true},
		{engine.ListQuery{Phase: engine.PhaseFired, Status: engine.StatusFailed, Target: "agent-1", Kind: "build"}, true},
		{engine.ListQuery{Status: engine.StatusSucceeded}, false},
		{engine.ListQuery{Target: "agent-2"}, false},
		{engine.ListQuery{Kind: "test"}, false},
		{engine.ListQuery{Labels: map[string]string{"pool": "blue"}}, true},
		{engine.ListQuery{Labels: map[string]string{"pool": "blue", "zone": "eu"}}, false},
		{engine.ListQuery{Labels: map[string]string{"pool": "green"}}, false},
		{engine.ListQuery{Since: at}, true},
		{engine.ListQuery{Since: at.Add(time.Nanosecond)}, false},
		{engine.ListQuery{Until: at}, false},
		{engine.ListQuery{Until: at.Add(time.Nanosecond)}, true},
	} {
		if got := tc.q.Selects(task); got != tc.want {
			t.Errorf("%+v selects the task: %v, want %v", tc.q, got, tc.want)
		}
	}
	if (engine.ListQuery{Labels: map[string]string{"pool": "blue"}}).Selects(engine.Listed{}) {
		t.Error("a label selects a task with no placement")
	}
}
