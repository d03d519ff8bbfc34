package workers_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
	"github.com/bgtask/bgtask/workers"
)

// startDispatcher runs the engine's part that persists and delivers the wake-up
// of every task that ended, with the projector it learns of them from, until the
// test ends.
func (b *bundle) startDispatcher(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	inbox, err := events.OpenInbox(ctx, b.srv.JS, events.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var d *engine.Dispatcher
	proj := projections.New(b.store, func(s engine.State, _ events.Record) { d.Notify(s) }, engine.Base{})
	d = engine.NewDispatcher(b.store, inbox, proj, "test-engine", 2, engine.Base{})
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		proj.Stop()
	})
}

// untilTheTestEnds bounds a wait for what takes as long as the machine's load
// makes it (a command that prints megabytes, their tail cut, the wake-up
// rendered) by the test's own deadline alone, less a moment to report it.
func untilTheTestEnds(t *testing.T) time.Duration {
	deadline, ok := t.Deadline()
	if !ok {
		return 24 * time.Hour // go test -timeout 0: no bound
	}
	return time.Until(deadline) - 5*time.Second
}

// TestOutputOverTheBudgetStillFires: a command whose output the worker keeps
// whole is over NATS's max_payload once in an event (control bytes take six bytes
// as JSON; a thousand lines of 2,000 bytes take 2 MB). Its exit and its wake-up
// are cut to the budget: the task fires once, with its exit code and a tail that
// ends with its last line and says what it cut.
func TestOutputOverTheBudgetStillFires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	b.startDispatcher(t)
	cases := []struct {
		name string
		spec string
		code int
	}{
		{"NUL bytes", `{"command":"for i in $(seq 1 50); do head -c 2000 /dev/zero; echo; done; echo last; exit 3"}`, 3},
		// A line made once and printed by the shell: two thousand processes, one
		// pair a line, took over a minute on a loaded machine.
		{"ESC bytes", `{"command":"l=$(head -c 2000 /dev/zero | tr '\\0' '\\033'); for i in $(seq 1 60); do echo \"$l\"; done; echo last; exit 5"}`, 5},
		{"a thousand lines of 2,000 bytes", `{"command":"l=$(head -c 2000 /dev/zero | tr '\\0' x); for i in $(seq 1 1000); do echo \"$l\"; done; echo last; exit 4","result":{"type":"tail","lines":1000}}`, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec, err := engine.ParseSpec([]byte(tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			spec.Cwd = t.TempDir()
			id := b.arm(t, spec)
			st := b.waitFor(t, id, untilTheTestEnds(t), "fired", func(s engine.State) bool { return s.Phase == engine.PhaseFired })
			w := *st.Wakeup
			if w.ExitCode == nil || *w.ExitCode != tc.code || st.Run.ExitCode != tc.code {
				t.Fatalf("wake-up exit code %v, run's %d, want %d", w.ExitCode, st.Run.ExitCode, tc.code)
			}
			for what, tail := range map[string][]string{"exited": st.Run.Tail, "wake-up": w.Tail} {
				if tail[len(tail)-1] != "last" || !strings.HasSuffix(tail[0], "earlier lines cut to fit bgtask's byte budget]") {
					t.Fatalf("%s tail: %d lines from %.80q to %.80q, want a marker and the last line", what, len(tail), tail[0], tail[len(tail)-1])
				}
			}
			if !strings.HasSuffix(w.Prompt, "\nlast\n") {
				t.Fatalf("prompt ends %q, want the last line", w.Prompt[len(w.Prompt)-80:])
			}

			stream, err := b.srv.JS.Stream(context.Background(), events.InboxStreamName)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := stream.GetMsg(context.Background(), st.InboxSeq)
			if err != nil {
				t.Fatal(err)
			}
			var delivered events.Wakeup
			if err := json.Unmarshal(msg.Data, &delivered); err != nil || delivered.ID != id || *delivered.ExitCode != tc.code {
				t.Fatalf("inbox message at %d: %v, id %s", st.InboxSeq, err, delivered.ID)
			}
			if len(msg.Data) > engine.MaxWakeupBytes {
				t.Fatalf("delivered wake-up is %d bytes, over %d", len(msg.Data), engine.MaxWakeupBytes)
			}
			for _, rec := range b.history(t, id) {
				if raw, _ := json.Marshal(rec.Event); len(raw) > engine.MaxEventBytes {
					t.Fatalf("%s is %d bytes, over %d", rec.Type, len(raw), engine.MaxEventBytes)
				}
			}
		})
	}
}

// TestAnAmplifyingPromptFires: a 64 KiB template of {{tail}} repeated 8,000 times
// over a 100 KB tail (800 MB rendered whole) fires once, its prompt cut where it
// reached its budget.
func TestAnAmplifyingPromptFires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{})
	b.startDispatcher(t)
	spec, err := engine.ParseSpec([]byte(`{"command":"for i in $(seq 1 50); do head -c 2000 /dev/zero | tr '\\0' y; echo; done; exit 6","prompt":"` + strings.Repeat("{{tail}}", 8000) + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	spec.Cwd = t.TempDir()
	id := b.arm(t, spec)
	st := b.waitFor(t, id, untilTheTestEnds(t), "fired", func(s engine.State) bool { return s.Phase == engine.PhaseFired })
	w := *st.Wakeup
	if w.ExitCode == nil || *w.ExitCode != 6 || len(w.Tail) != 50 {
		t.Fatalf("wake-up exit code %v with %d lines of tail, want 6 and the whole tail", w.ExitCode, len(w.Tail))
	}
	if !strings.HasPrefix(w.Prompt, w.Tail[0]) || !strings.HasSuffix(w.Prompt, "\n[the rest of the prompt was cut to fit bgtask's byte budget]") {
		t.Fatalf("prompt of %d bytes starts %.40q and ends %q, want the tail, then a marker", len(w.Prompt), w.Prompt, w.Prompt[len(w.Prompt)-80:])
	}
}
