package engine_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
)

func TestParseSpecChecksPlacementLabels(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, spec, field string
	}{
		{"placement not an object", `{"command":"ls","placement":"host-1"}`, "placement"},
		{"unknown placement field", `{"command":"ls","placement":{"lables":{"a":"b"}}}`, "placement.lables"},
		{"labels not an object", `{"command":"ls","placement":{"labels":["a"]}}`, "placement.labels"},
		{"empty label name", `{"command":"ls","placement":{"labels":{"":"b"}}}`, "placement.labels"},
		{"label name with a space", `{"command":"ls","placement":{"labels":{"a b":"c"}}}`, "placement.labels"},
		{"empty label value", `{"command":"ls","placement":{"labels":{"pool":""}}}`, "placement.labels"},
		{"label value with a space", `{"command":"ls","placement":{"labels":{"pool":"a b"}}}`, "placement.labels"},
		{"too many labels", `{"command":"ls","placement":{"labels":{` + manyLabels(17) + `}}}`, "placement.labels"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := engine.ParseSpec([]byte(c.spec))
			var fe *engine.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a field error", err)
			}
			if !strings.HasPrefix(fe.Field, c.field) {
				t.Errorf("field = %q (%v), want %q", fe.Field, err, c.field)
			}
		})
	}
	spec, err := engine.ParseSpec([]byte(`{"command":"ls","placement":{"labels":{"host":"build-1.example.com","pool":"gpu"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := spec.Placement.String(), "host=build-1.example.com, pool=gpu"; got != want {
		t.Errorf("placement = %q, want %q", got, want)
	}
}

func manyLabels(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return strings.Join(parts, ",")
}

func TestPlacementMatchesWorkersWithEveryLabel(t *testing.T) {
	t.Parallel()
	worker := map[string]string{"host": "a", "pool": "blue"}
	cases := []struct {
		placement *engine.Placement
		want      bool
	}{
		{nil, true},
		{&engine.Placement{}, true},
		{&engine.Placement{Labels: map[string]string{"host": "a"}}, true},
		{&engine.Placement{Labels: map[string]string{"host": "a", "pool": "blue"}}, true},
		{&engine.Placement{Labels: map[string]string{"host": "b"}}, false},
		{&engine.Placement{Labels: map[string]string{"pool": "blue", "gpu": "yes"}}, false},
	}
	for _, c := range cases {
		if got := c.placement.Matches(worker); got != c.want {
			t.Errorf("%v matches %v = %v, want %v", c.placement, worker, got, c.want)
		}
	}
}

func TestAnExclusiveWorkerAdmitsOnlyTasksPlacedOnItsLabels(t *testing.T) {
	t.Parallel()
	worker := map[string]string{"host": "a", "pool": "gpu", "zone": "eu"}
	cases := []struct {
		placement        *engine.Placement
		shared, excluded bool
	}{
		{nil, true, false},
		{&engine.Placement{Labels: map[string]string{"host": "a"}}, true, false},
		{&engine.Placement{Labels: map[string]string{"pool": "gpu"}}, true, false},
		{&engine.Placement{Labels: map[string]string{"pool": "gpu", "zone": "eu"}}, true, true},
		{&engine.Placement{Labels: map[string]string{"host": "a", "pool": "gpu", "zone": "eu"}}, true, true},
		{&engine.Placement{Labels: map[string]string{"pool": "gpu", "zone": "us"}}, false, false},
	}
	for _, c := range cases {
		if got := c.placement.Admits(worker, false); got != c.shared {
			t.Errorf("%v admitted by a shared worker %v = %v, want %v", c.placement, worker, got, c.shared)
		}
		if got := c.placement.Admits(worker, true); got != c.excluded {
			t.Errorf("%v admitted by an exclusive worker %v = %v, want %v", c.placement, worker, got, c.excluded)
		}
	}
}

func task(id string, labels map[string]string) engine.State {
	s := engine.State{ID: id, Phase: engine.PhaseArmed}
	if labels != nil {
		s.Spec.Placement = &engine.Placement{Labels: labels}
	}
	return s
}

func TestChoosePicksTheLeastLoadedMatchingWorkerWithASlot(t *testing.T) {
	t.Parallel()
	blue := map[string]string{"host": "a", "pool": "blue"}
	green := map[string]string{"host": "b", "pool": "green"}
	gpu := map[string]string{"host": "g", "pool": "gpu"}
	cases := []struct {
		name    string
		task    engine.State
		workers []engine.Candidate
		want    string
		waiting string
	}{
		{"no worker at all", task("t", nil), nil, "", "no worker is connected"},
		{"no worker has the labels", task("t", map[string]string{"pool": "red"}),
			[]engine.Candidate{{ID: "w1", Labels: blue, MaxTasks: 2, Accepting: true}}, "", "no live worker has these labels"},
		{"only the matching worker", task("t", map[string]string{"pool": "green"}), []engine.Candidate{
			{ID: "w1", Labels: blue, MaxTasks: 2, Accepting: true},
			{ID: "w2", Labels: green, MaxTasks: 2, Load: 1, Accepting: true},
		}, "w2", ""},
		{"the least loaded for its capacity", task("t", nil), []engine.Candidate{
			{ID: "w1", Labels: blue, MaxTasks: 2, Load: 1, Accepting: true},  // half full
			{ID: "w2", Labels: green, MaxTasks: 8, Load: 2, Accepting: true}, // a quarter
		}, "w2", ""},
		{"full workers are skipped", task("t", nil), []engine.Candidate{
			{ID: "w1", Labels: blue, MaxTasks: 2, Load: 2, Accepting: true},
			{ID: "w2", Labels: green, MaxTasks: 4, Load: 3, Accepting: true},
		}, "w2", ""},
		{"every matching worker full", task("t", map[string]string{"pool": "blue"}), []engine.Candidate{
			{ID: "w1", Labels: blue, MaxTasks: 2, Load: 2, Accepting: true},
			{ID: "w2", Labels: green, MaxTasks: 4, Accepting: true},
		}, "", "at capacity"},
		{"a draining worker takes nothing", task("t", map[string]string{"pool": "blue"}), []engine.Candidate{
			{ID: "w1", Labels: blue, MaxTasks: 2, Accepting: false},
		}, "", "starting, draining or stopping"},
		// An exclusive worker is kept for the tasks placed on its labels.
		{"an exclusive worker takes no unplaced task", task("t", nil), []engine.Candidate{
			{ID: "gpu-1", Labels: gpu, MaxTasks: 8, Accepting: true, Exclusive: true},
		}, "", "worker gpu-1, which has these labels, is exclusive: it takes only tasks placed on pool=gpu"},
		{"nor one placed on its host only", task("t", map[string]string{"host": "g"}), []engine.Candidate{
			{ID: "gpu-1", Labels: gpu, MaxTasks: 8, Accepting: true, Exclusive: true},
		}, "", "exclusive: it takes only tasks placed on pool=gpu"},
		{"an exclusive worker takes a task placed on its labels", task("t", map[string]string{"pool": "gpu"}), []engine.Candidate{
			{ID: "w1", Labels: blue, MaxTasks: 2, Accepting: true},
			{ID: "gpu-1", Labels: gpu, MaxTasks: 8, Accepting: true, Exclusive: true},
		}, "gpu-1", ""},
		{"an unplaced task goes to a busier shared worker", task("t", nil), []engine.Candidate{
			{ID: "gpu-1", Labels: gpu, MaxTasks: 8, Accepting: true, Exclusive: true},
			{ID: "w1", Labels: blue, MaxTasks: 2, Load: 1, Accepting: true},
		}, "w1", ""},
		{"or waits for its slot", task("t", nil), []engine.Candidate{
			{ID: "gpu-1", Labels: gpu, MaxTasks: 8, Accepting: true, Exclusive: true},
			{ID: "w1", Labels: blue, MaxTasks: 2, Load: 2, Accepting: true},
		}, "", "at capacity"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, why := engine.Choose(c.task, c.workers)
			if got != c.want {
				t.Errorf("Choose = %q (%s), want %q", got, why, c.want)
			}
			if !strings.Contains(why, c.waiting) || (c.waiting == "") != (why == "") {
				t.Errorf("waiting = %q, want it to say %q", why, c.waiting)
			}
		})
	}
}

// Engine replicas that see the same fleet choose the same worker for a task, and
// ties are spread over the workers rather than always going to one.
func TestChooseBreaksTiesTheSameWayForEveryReplica(t *testing.T) {
	t.Parallel()
	workers := []engine.Candidate{
		{ID: "w1", MaxTasks: 4, Accepting: true},
		{ID: "w2", MaxTasks: 4, Accepting: true},
		{ID: "w3", MaxTasks: 4, Accepting: true},
	}
	reversed := slices.Clone(workers)
	slices.Reverse(reversed)
	chosen := map[string]int{}
	for i := range 300 {
		s := task(fmt.Sprintf("task-%d", i), nil)
		a, _ := engine.Choose(s, workers)
		b, _ := engine.Choose(s, reversed)
		if a != b {
			t.Fatalf("task %s: %s in one order, %s in the other", s.ID, a, b)
		}
		chosen[a]++
	}
	for _, w := range workers {
		if chosen[w.ID] < 50 {
			t.Errorf("ties went %v, want each worker to get a share", chosen)
		}
	}
}

func TestFairOrderTakesTargetsAndKindsInTurn(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var tasks []engine.State
	add := func(id, target, kind string) {
		s := engine.State{ID: id, Phase: engine.PhaseArmed, ArmedAt: at, Seq: uint64(len(tasks) + 1)}
		s.Spec.Target, s.Spec.Kind = target, kind
		tasks = append(tasks, s)
		at = at.Add(time.Second)
	}
	// Target a queued five builds and two tests before b and c registered one each.
	for i := range 5 {
		add(fmt.Sprintf("a-build-%d", i), "a", "build")
	}
	add("a-test-0", "a", "test")
	add("a-test-1", "a", "test")
	add("b-0", "b", "")
	add("c-0", "c", "")
	slices.Reverse(tasks) // the input order does not matter

	order := func(tasks []engine.State, turns *engine.Turns) []string {
		var got []string
		for _, s := range engine.FairOrder(tasks, turns) {
			got = append(got, s.ID)
		}
		return got
	}
	want := []string{
		"a-build-0", "b-0", "c-0", // one of each target, the longest waiting first
		"a-test-0", // then a's kinds take turns
		"a-build-1", "a-test-1",
		"a-build-2", "a-build-3", "a-build-4",
	}
	if got := order(tasks, engine.NewTurns()); !slices.Equal(got, want) {
		t.Errorf("order\n got %v\nwant %v", got, want)
	}

	// With one slot free at a time, a's older tasks must not keep b and c waiting:
	// once a was served, b and c come first, and a's next task is a test.
	turns := engine.NewTurns()
	first := tasks[len(tasks)-1] // a-build-0
	turns.Served(first)
	rest := slices.DeleteFunc(slices.Clone(tasks), func(s engine.State) bool { return s.ID == first.ID })
	want = []string{"b-0", "c-0", "a-test-0", "a-build-1", "a-test-1", "a-build-2", "a-build-3", "a-build-4"}
	if got := order(rest, turns); !slices.Equal(got, want) {
		t.Errorf("order after a was served\n got %v\nwant %v", got, want)
	}
}
