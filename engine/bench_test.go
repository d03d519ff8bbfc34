package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// finishedHistory is a whole task's life as the projector folds it on a restart:
// armed, spawned, the first tick with the PID, exited with a tail, completion
// persisted and fired.
func finishedHistory(b *testing.B) []events.Record {
	b.Helper()
	spec, err := engine.ParseSpecAt([]byte(`{"command":"go test ./...","kind":"test","target":"agent-7",
		"origin":{"session":"s-123"},"prompt":"Tests {{status}} (exit {{exit_code}}):\n{{result}}"}`), t0)
	if err != nil {
		b.Fatal(err)
	}
	tail := make([]string, 12)
	for i := range tail {
		tail[i] = "ok  \tgithub.com/acme/app/pkg\t0.123s"
	}
	steps := []struct {
		c      engine.Command
		writer string
	}{
		{engine.Arm{Spec: spec}, engineWriter},
		{engine.Spawn{Host: "host"}, workerA},
		{engine.Tick{PID: 4242}, workerA},
		{engine.Exit{Run: events.Exited{Tail: tail, StartedAt: t0, EndedAt: t0.Add(time.Minute)}}, workerA},
		{engine.PersistCompletion{}, engineWriter},
		{engine.Fire{InboxSeq: 1}, engineWriter},
	}
	state := engine.State{ID: taskID}
	var history []events.Record
	for i, st := range steps {
		ev, err := engine.Decide(state, st.c, engine.Meta{Writer: st.writer, Now: t0})
		if err != nil {
			b.Fatal(err)
		}
		rec := events.Record{Seq: uint64(i + 1), Event: ev}
		if state, err = engine.Apply(state, rec); err != nil {
			b.Fatal(err)
		}
		history = append(history, rec)
	}
	return history
}

// BenchmarkApply folds a finished task's history, event by event: the
// projector's work per event on a restart (payload decoding included).
func BenchmarkApply(b *testing.B) {
	history := finishedHistory(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, problems := engine.Replay(history); len(problems) > 0 {
			b.Fatal(problems)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(history)), "ns/event")
}

// BenchmarkMatcher matches one stdout line against each kind of completion rule,
// as the worker does for every line a command prints.
func BenchmarkMatcher(b *testing.B) {
	for _, bc := range []struct {
		name, spec, line string
	}{
		{"line_pattern", `{"command":"x","completion":{"type":"line_pattern","regex":"^(ok|FAIL)\\s"}}`,
			"ok  \tgithub.com/acme/app/pkg\t0.123s"},
		{"line_pattern/no_match", `{"command":"x","completion":{"type":"line_pattern","regex":"^(ok|FAIL)\\s"}}`,
			"=== RUN   TestSomethingLong/with_a_subtest_name"},
		{"json_line", `{"command":"x","completion":{"type":"json_line","match":{"type":"watch.complete","run.status":"success*"}}}`,
			`{"type":"watch.complete","run":{"id":12345,"status":"success","url":"https://example.com/runs/12345"}}`},
		{"json_line/not_json", `{"command":"x","completion":{"type":"json_line","match":{"type":"watch.complete"}}}`,
			"Waiting for the run to finish: 3 of 7 jobs done"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			spec, err := engine.ParseSpecAt([]byte(bc.spec), t0)
			if err != nil {
				b.Fatal(err)
			}
			match, line := spec.Matcher(), []byte(bc.line)
			want := match(line)
			b.ReportAllocs()
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				if match(line) != want {
					b.Fatal("the match changed")
				}
			}
		})
	}
}

// BenchmarkFairOrder orders 2,000 waiting tasks of 20 targets, as the scheduler
// does whenever a slot frees while tasks queue.
func BenchmarkFairOrder(b *testing.B) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tasks := make([]engine.State, 2000)
	for i := range tasks {
		tasks[i] = engine.State{ID: fmt.Sprintf("t-%d", i), Phase: engine.PhaseArmed, ArmedAt: at.Add(time.Duration(i) * time.Millisecond), Seq: uint64(i + 1)}
		tasks[i].Spec.Target, tasks[i].Spec.Kind = fmt.Sprintf("target-%d", i%20), []string{"build", "test"}[i%2]
	}
	turns := engine.NewTurns()
	b.ReportAllocs()
	for b.Loop() {
		active := engine.ActiveTurns{}
		for i := range tasks {
			active.Add(&tasks[i])
		}
		turns.Keep(active)
		turns.Served(engine.FairOrder(tasks, turns)[0])
	}
}

// BenchmarkDecodeSpec reads a spec as `bgtask add` sends it, with the caller's
// environment (60 variables, 4 KiB): the engine's work per registration.
func BenchmarkDecodeSpec(b *testing.B) {
	env := map[string]string{}
	for i := range 60 {
		env[fmt.Sprintf("VARIABLE_%02d", i)] = fmt.Sprintf("/home/user/.local/share/value-%d:%s", i, strings.Repeat("x", 30))
	}
	spec, err := json.Marshal(map[string]any{
		"command": "go test ./...", "cwd": "/home/user/src/app", "environment": "caller", "env": env,
		"origin": map[string]string{"session": "s-123"}, "deliver": []map[string]string{{"type": "inbox"}},
		"prompt": "Tests {{status}} (exit {{exit_code}}):\n{{result}}",
	})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(spec)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := engine.DecodeSpec(spec); err != nil {
			b.Fatal(err)
		}
	}
}
