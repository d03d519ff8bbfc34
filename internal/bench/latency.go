package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers"
)

// startCommand prints when it started, in Unix nanoseconds: the one moment both
// bgtask and the baseline can observe the same way.
const startCommand = "date +%s%N"

// seqResult is what sequential tasks on one server measured, in milliseconds.
type seqResult struct {
	start     []float64 // register called → the command printed its start
	wake      []float64 // the shim's exit record (ended_at) → the wake-up seen
	baseStart []float64 // exec.Command started → the command printed its start
	baseWake  []float64 // the three writes of the wake-up's path, as raw appends
	// baseWakeLogged is baseWake after a fourth write before them: the output's last
	// chunk, published as the worker flushes it before it appends the exit.
	baseWakeLogged []float64
	peerStart      []float64 // before the tsp client's exec → the command printed its start
	stages         []stage   // where the time of start and wake goes
}

// stage is a step between two events of a task, from their event times.
type stage struct {
	name    string
	samples []float64
}

// sequentialTasks runs tasks one at a time on the shared server of mode, each
// printing its start time, and measures their start and wake-up latencies with
// their baselines, in interleaved rounds. The latency and start scenarios share
// them: one run of tasks measures both.
func (r *runner) sequentialTasks(ctx context.Context, mode string, alsoStart ...string) (*seqResult, error) {
	if res := r.samples[mode]; res != nil {
		return res, nil
	}
	srv, err := r.sharedServer(ctx, mode, alsoStart...)
	if err != nil {
		return nil, err
	}
	raw, err := srv.rawBaseline(ctx, mode == "always", 1)
	if err != nil {
		return nil, err
	}
	const target = "bench-seq"
	w, err := watchInbox(srv.nc, target)
	if err != nil {
		return nil, err
	}
	defer w.close()
	chain, err := wakeupPath()
	if err != nil {
		return nil, err
	}
	var peer *tspServer
	if r.tsp != "" && r.selected("start") {
		if peer, err = r.startTSP(ctx, "start", workers.DefaultMaxTasks); err != nil {
			return nil, err
		}
		defer peer.stop()
	}
	spec := srv.spec(startCommand, target)
	res := &seqResult{}
	var tasks []seqTask
	n := r.size.sequential
	for round := range r.repeats {
		k := share(n, r.repeats, round)
		r.progress("sequential tasks, --sync %s: round %d of %d, %d tasks", mode, round+1, r.repeats, k)
		for range k {
			called := time.Now()
			reg, err := srv.api.Register(ctx, spec)
			if err != nil {
				return nil, err
			}
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			a, err := w.wait(wctx, reg.ID)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("task %s: %w", reg.ID, err)
			}
			printed, err := printedStart(a.wakeup)
			if err != nil {
				return nil, fmt.Errorf("task %s: %w", reg.ID, err)
			}
			tasks = append(tasks, seqTask{id: reg.ID, called: called, arrived: a, printed: printed})
			res.start = append(res.start, ms(printed.Sub(called)))
			res.wake = append(res.wake, ms(a.at.Sub(*a.wakeup.EndedAt)))
		}
		if err := res.baselines(ctx, k, raw.js[0], chain, peer); err != nil {
			return nil, err
		}
	}

	// Where the time goes, from the times of the tasks' events (each is when its
	// writer decided it, just before the append).
	r.progress("sequential tasks, --sync %s: reading the event stream", mode)
	times, err := eventTimes(ctx, srv, len(tasks))
	if err != nil {
		return nil, err
	}
	if res.stages, err = stagesOf(tasks, times); err != nil {
		return nil, err
	}
	r.samples[mode] = res
	return res, nil
}

// seqTask is one task of the sequential run: when it was registered, when its
// wake-up arrived, when its command printed its start.
type seqTask struct {
	id      string
	called  time.Time
	arrived arrival
	printed time.Time
}

// baselines runs k of each baseline: a plain process start and the raw chain of
// JetStream appends a wake-up takes; and k starts through the peer, when there is
// one.
func (res *seqResult) baselines(ctx context.Context, k int, js jetstream.JetStream, chain [3][]byte, peer *tspServer) error {
	for range k {
		d, err := execStart(ctx)
		if err != nil {
			return err
		}
		res.baseStart = append(res.baseStart, ms(d))
	}
	output := []byte(strconv.FormatInt(time.Now().UnixNano(), 10) + "\n") // what the command prints
	for range k {
		d, err := rawChain(ctx, js, chain, nil)
		if err != nil {
			return err
		}
		res.baseWake = append(res.baseWake, ms(d))
		if d, err = rawChain(ctx, js, chain, output); err != nil {
			return err
		}
		res.baseWakeLogged = append(res.baseWakeLogged, ms(d))
	}
	if peer == nil {
		return nil
	}
	for range k {
		d, err := peer.start(ctx)
		if err != nil {
			return err
		}
		res.peerStart = append(res.peerStart, ms(d))
	}
	return peer.clear(ctx)
}

// stagesOf is where the tasks' time went, from the times of their events.
func stagesOf(tasks []seqTask, times map[string]map[events.Type]time.Time) ([]stage, error) {
	names := []string{
		"start: register → spawned (worker takes the task)",
		"start: spawned → command printed (shim starts it)",
		"wake: exit record → exited (worker sees the exit file, flushes the log)",
		"wake: exited → completion-persisted (append, projector, dispatcher)",
		"wake: completion-persisted → wake-up seen (append, inbox publish)",
	}
	samples := make([][]float64, len(names))
	for _, t := range tasks {
		at := times[t.id]
		if len(at) == 0 {
			return nil, fmt.Errorf("task %s: no events in the stream", t.id)
		}
		ended := *t.arrived.wakeup.EndedAt
		for i, d := range []time.Duration{
			at[events.TypeSpawned].Sub(t.called),
			t.printed.Sub(at[events.TypeSpawned]),
			at[events.TypeExited].Sub(ended),
			at[events.TypeCompletionPersisted].Sub(at[events.TypeExited]),
			t.arrived.at.Sub(at[events.TypeCompletionPersisted]),
		} {
			samples[i] = append(samples[i], ms(d))
		}
	}
	stages := make([]stage, len(names))
	for i, name := range names {
		stages[i] = stage{name: name, samples: samples[i]}
	}
	return stages, nil
}

// eventTimes reads the whole event stream once and returns, for each task, the
// time of the first event of each type. One ordered consumer reads it all: a
// history request per task would create a consumer each, and a stream takes at
// most 1,000 (nats-server's default) while they wait out their inactivity.
func eventTimes(ctx context.Context, srv *server, tasks int) (map[string]map[events.Type]time.Time, error) {
	stream, err := srv.js.Stream(ctx, events.StreamName)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	out := make(map[string]map[events.Type]time.Time, tasks)
	for range info.State.Msgs {
		msg, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("read the event stream: %w", err)
		}
		var ev events.Event
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			return nil, fmt.Errorf("read the event stream: %w", err)
		}
		if out[ev.TaskID] == nil {
			out[ev.TaskID] = map[events.Type]time.Time{}
		}
		if _, seen := out[ev.TaskID][ev.Type]; !seen {
			out[ev.TaskID][ev.Type] = ev.Time
		}
	}
	return out, nil
}

// printedStart reads the start time the command printed from the wake-up's tail.
func printedStart(w events.Wakeup) (time.Time, error) {
	if w.Status != engine.StatusSucceeded || len(w.Tail) == 0 || w.EndedAt == nil {
		return time.Time{}, fmt.Errorf("unexpected wake-up: status %s, tail %q", w.Status, w.Tail)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(w.Tail[len(w.Tail)-1]), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("the command printed no time: %q", w.Tail)
	}
	return time.Unix(0, ns), nil
}

// execStart starts the command the way a plain Go program would and returns how
// long it took until it printed its start.
func execStart(ctx context.Context) (time.Duration, error) {
	called := time.Now()
	out, err := exec.CommandContext(ctx, "bash", "-c", startCommand).Output()
	if err != nil {
		return 0, fmt.Errorf("baseline %s: %w", startCommand, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("baseline %s printed %q", startCommand, out)
	}
	return time.Unix(0, ns).Sub(called), nil
}

// wakeupPath is what bgtask writes between a command's exit and its wake-up being
// readable: the exited event, the completion-persisted event and the wake-up,
// taken from a real task history.
func wakeupPath() ([3][]byte, error) {
	h, err := newHistoryMaker("/", 1)
	if err != nil {
		return [3][]byte{}, err
	}
	evs, err := h.task(1, 1)
	if err != nil {
		return [3][]byte{}, err
	}
	var path [3][]byte
	for _, ev := range evs {
		switch ev.event.Type {
		case events.TypeExited:
			path[0] = ev.data
		case events.TypeCompletionPersisted:
			path[1] = ev.data
			path[2] = h.lastWakeup
		}
	}
	return path, nil
}

// rawChain appends the wake-up's path as three sequential conditional appends, as
// fast as JetStream takes them, and returns how long they took. With output, the
// output's last chunk is published first, as the worker publishes it to the log
// stream (a plain publish, with its offset and end mark) before it appends the
// exit.
func rawChain(ctx context.Context, js jetstream.JetStream, path [3][]byte, output []byte) (time.Duration, error) {
	task := uuid.NewString()
	start := time.Now()
	if output != nil {
		msg := &nats.Msg{Subject: rawPrefix + ".log." + task, Data: output, Header: nats.Header{}}
		msg.Header.Set(events.LogOffsetHeader, "0")
		msg.Header.Set(events.LogEOFHeader, "1")
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return 0, fmt.Errorf("raw log publish: %w", err)
		}
	}
	var seq uint64
	for i, data := range path {
		var err error
		if seq, err = rawAppend(ctx, js, task, strconv.Itoa(i), uuid.NewString(), data, seq); err != nil {
			return 0, fmt.Errorf("raw append: %w", err)
		}
	}
	return time.Since(start), nil
}

func runLatency(ctx context.Context, r *runner, s *Scenario) error {
	s.param("tasks", r.size.sequential)
	s.param("command", startCommand)
	s.param("from", "ended_at: the shim's clock when it reaped the command, before it writes exit.json (rename, fsync)")
	s.param("to", "the wake-up's publish to the inbox, seen by a core NATS subscription on bgtask.deliver.<target>")
	for _, mode := range []string{"always", "interval"} {
		res, err := r.sequentialTasks(ctx, mode, "interval")
		if err != nil {
			return err
		}
		row := s.compare("exit → wake-up, --sync "+mode, "ms", summarize(res.wake, true),
			"exited + completion-persisted + wake-up as 3 sequential raw appends", summarize(res.baseWake, true))
		logged := s.compare("  the same, against the 4 writes of a command that prints", "ms", summarize(res.wake, true),
			"its output's last chunk published, then the 3 appends", summarize(res.baseWakeLogged, true))
		for _, st := range res.stages {
			if strings.HasPrefix(st.name, "wake:") {
				s.add("  "+st.name, "ms", summarize(st.samples, true))
			}
		}
		if mode == "always" {
			s.target("p50 ≤ 2 ms (--sync always, the default)", row.Bgtask.Median <= 2, "p50 %s ms", num(row.Bgtask.Median))
			s.target("p99 ≤ 10 ms (--sync always, the default)", *row.Bgtask.P99 <= 10, "p99 %s ms", num(*row.Bgtask.P99))
			for _, r := range []struct {
				goal string
				row  *Row
			}{{"p50 ≤ 1.5× the 3 appends (issue 23)", row}, {"p50 ≤ 1.5× the 4 writes, the output's chunk counted (issue 23)", logged}} {
				if r.row.Ratio != nil {
					s.target(r.goal, *r.row.Ratio <= 1.5, "%s×", num(*r.row.Ratio))
				}
			}
		}
	}
	s.note("the baseline runs over TCP from the bench; bgtask's own appends run in-process in the server")
	return nil
}

func runStart(ctx context.Context, r *runner, s *Scenario) error {
	s.param("tasks", r.size.sequential)
	s.param("command", startCommand+" (run by bash -c, in bgtask and in the baseline)")
	s.param("to", "the start time the command printed, read from the wake-up's tail")
	if r.tsp != "" {
		s.param("peer", fmt.Sprintf("task-spooler: tsp -S %d, its own socket and TMPDIR, `tsp bash -c '%s'` one at a time, the time read from its output file (tsp -w, tsp -o); the client's start included", workers.DefaultMaxTasks, startCommand))
	}
	for _, mode := range []string{"always", "interval"} {
		res := r.samples[mode]
		if res == nil && mode == "always" {
			var err error
			if res, err = r.sequentialTasks(ctx, mode); err != nil {
				return err
			}
		}
		if res == nil {
			continue // measured only when the latency scenario ran too
		}
		row := s.compare("register → started, --sync "+mode, "ms", summarize(res.start, true),
			"exec.Command → started", summarize(res.baseStart, true))
		if len(res.peerStart) > 0 {
			row.against(fmt.Sprintf("tsp -S %d: before the client's exec → started, one at a time", workers.DefaultMaxTasks), summarize(res.peerStart, true))
			if mode == "always" && row.Peer.Ratio != nil {
				s.target("p50 ≤ 1.5× task-spooler's, its client's start included (--sync always, issue 23)", *row.Peer.Ratio <= 1.5,
					"p50 %s ms against %s ms: %s×; %s", num(row.Bgtask.Median), num(row.Peer.Stat.Median), num(*row.Peer.Ratio), r.processStart)
			}
		}
		for _, st := range res.stages {
			if strings.HasPrefix(st.name, "start:") {
				s.add("  "+st.name, "ms", summarize(st.samples, true))
			}
		}
		if mode == "always" {
			overhead := row.Bgtask.Median - row.Baseline.Median
			s.target("overhead p50 ≤ 5 ms", overhead <= 5, "p50 %s ms against %s ms: %s ms more",
				num(row.Bgtask.Median), num(row.Baseline.Median), num(overhead))
		}
	}
	return nil
}
