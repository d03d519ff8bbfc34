package integration

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// Two engine replicas on a 3-node cluster run one schedule, and one of them is
// killed midway: every slot from the first to the last runs once, and no slot is
// missed.
func TestTwoEnginesRunEverySlotOfAScheduleOnce(t *testing.T) {
	t.Parallel()
	d := startDeployment(t, 3)
	engineArgs := []string{"server", "--no-worker", "--replicas", "3", "--client-user", "client", "--log-level", "warn"}
	engines := []*proc{d.start(t, "engine", engineArgs...), d.start(t, "engine", engineArgs...)}
	d.start(t, "worker", "worker", "--tick", "500ms", "--log-level", "warn")
	d.workersReady(t, 1)

	d.ok(t, "client", "schedule", "add", "every-second", "--every", "1s", "--overlap", "allow", "--catch-up", "all", "--no-cwd", "--anywhere", "--", "true")
	show := func() scheduleShown {
		return decodeJSON[scheduleShown](t, d.ok(t, "client", "schedule", "show", "every-second", "--json"))
	}
	testkit.Eventually(t, time.Minute, "three occurrences", func() bool { return len(show().Occurrences) >= 3 })
	engines[0].stop(syscall.SIGKILL)
	before := len(show().Occurrences)
	testkit.Eventually(t, time.Minute, "three more occurrences with one engine", func() bool { return len(show().Occurrences) >= before+3 })
	d.ok(t, "client", "schedule", "pause", "every-second")

	occ := show().Occurrences
	slots := map[time.Time]string{}
	for _, o := range occ {
		if other, twice := slots[o.Slot]; twice {
			t.Fatalf("slot %s ran as %s and as %s", o.Slot, other, o.ID)
		}
		slots[o.Slot] = o.ID
	}
	times := slices.SortedFunc(func(yield func(time.Time) bool) {
		for s := range slots {
			if !yield(s) {
				return
			}
		}
	}, time.Time.Compare)
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap != time.Second {
			t.Fatalf("slots %s and %s are %s apart: a slot was missed", times[i-1], times[i], gap)
		}
	}
	for _, o := range occ {
		d.ok(t, "client", "wait", o.ID, "--timeout", "60s")
	}
	for _, o := range occ {
		w := decodeJSON[struct {
			Status string `json:"status"`
		}](t, d.ok(t, "client", "show", o.ID, "--json"))
		if w.Status != "succeeded" {
			t.Fatalf("occurrence %s at %s: %s", o.ID, o.Slot, w.Status)
		}
	}
}

// scheduleShown is the part of `schedule show --json` the tests read.
type scheduleShown struct {
	Next        []time.Time `json:"next"`
	Occurrences []struct {
		ID   string    `json:"id"`
		Slot time.Time `json:"slot"`
	} `json:"occurrences"`
}
