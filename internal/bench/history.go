package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

// historySpec is the spec of a generated task: a test run with a target, an
// origin and a prompt, as an agent registers it.
const historySpec = `{"command":"go test ./...","kind":"test","target":"agent-7",
	"origin":{"session":"s-123","channel":"dev"},
	"prompt":"Tests {{status}} (exit {{exit_code}}) in session {{origin.session}}:\n{{result}}"}`

// historyMaker builds the histories of finished tasks the way bgtask writes them:
// every event is decided by the engine's Decide on the state its Apply folded from
// the events before it, so the stream is one the projector and audit accept.
type historyMaker struct {
	spec       engine.Spec
	seq        uint64 // the stream sequence of the last event made
	at         time.Time
	lastWakeup []byte // the wake-up of the last task, as the inbox holds it
	output     []byte // its output, as its log holds it
}

// genEvent is an event and its encoding.
type genEvent struct {
	event events.Event
	data  []byte
}

// newHistoryMaker returns a maker of up to tasks histories. They are one second
// apart and the last of them ends a day ago, so that each has finished long before
// the run: a server archiving every finished task takes them all at once (with
// 200,000 tasks starting a day ago, a sixth of them ended in the future, and were
// archived only as the clock reached them).
func newHistoryMaker(cwd string, tasks int) (*historyMaker, error) {
	spec, err := engine.ParseSpec([]byte(historySpec))
	if err != nil {
		return nil, err
	}
	spec.Cwd = cwd
	return &historyMaker{spec: spec, at: time.Now().Add(-24*time.Hour - time.Duration(tasks)*time.Second)}, nil
}

// task returns the history of one finished task i: armed, spawned, a first tick
// with the PID and ticks-1 more, exited with a tail, completion-persisted, fired.
func (h *historyMaker) task(i, ticks int) ([]genEvent, error) {
	spec := h.spec
	spec.Command = "go test ./pkg" + strconv.Itoa(i%97) + "/..."
	id, err := engine.TaskID(spec)
	if err != nil {
		return nil, err
	}
	const worker = "bench-worker"
	var tail []string
	for line := range 12 {
		tail = append(tail, fmt.Sprintf("ok  \tgithub.com/acme/app/pkg%d/part%d\t0.%03ds", i%97, line, (i*7+line)%1000))
	}
	code := 0
	if i%10 == 9 {
		code = 1
		tail = append(tail, "FAIL")
	}
	h.output = []byte(strings.Join(tail, "\n") + "\n")
	start := h.at.Add(20 * time.Millisecond)
	end := start.Add(time.Duration(ticks) * 10 * time.Second)
	steps := []struct {
		c      engine.Command
		writer string
		at     time.Time
	}{
		{engine.Arm{Spec: spec}, "engine@bench", h.at},
		{engine.Spawn{Host: "bench-host"}, worker, start},
		{engine.Tick{PID: 1000 + i%30000}, worker, start.Add(time.Millisecond)},
	}
	for t := 1; t < ticks; t++ {
		steps = append(steps, struct {
			c      engine.Command
			writer string
			at     time.Time
		}{engine.Tick{OutputBytes: int64(t * 100)}, worker, start.Add(time.Duration(t) * 10 * time.Second)})
	}
	run := events.Exited{ExitCode: code, Tail: tail, StartedAt: start, EndedAt: end, OutputBytes: int64(len(h.output))}
	steps = append(steps, []struct {
		c      engine.Command
		writer string
		at     time.Time
	}{
		{engine.Exit{Run: run}, worker, end.Add(25 * time.Millisecond)},
		{engine.PersistCompletion{}, "engine@bench", end.Add(27 * time.Millisecond)},
		{engine.Fire{InboxSeq: uint64(i + 1)}, "engine@bench", end.Add(28 * time.Millisecond)},
	}...)
	h.at = h.at.Add(time.Second)

	state := engine.State{ID: id}
	out := make([]genEvent, 0, len(steps))
	for _, st := range steps {
		ev, err := engine.Decide(state, st.c, engine.Meta{Writer: st.writer, Now: st.at})
		if err != nil {
			return nil, err
		}
		h.seq++
		if state, err = engine.Apply(state, events.Record{Seq: h.seq, Event: ev}); err != nil {
			return nil, err
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return nil, err
		}
		out = append(out, genEvent{event: ev, data: data})
	}
	if h.lastWakeup, err = json.Marshal(state.Wakeup); err != nil {
		return nil, err
	}
	return out, nil
}

// embeddedNATS starts a NATS server in this process on home's JetStream store, as
// `bgtask server` configures its own, without listening and without credentials.
func embeddedNATS(storeDir string) (*natsserver.Server, *nats.Conn, error) {
	ns, err := natsserver.NewServer(&natsserver.Options{
		ServerName: "bgtask",
		JetStream:  true,
		StoreDir:   storeDir,
		DontListen: true,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(time.Minute) {
		ns.Shutdown()
		return nil, nil, errors.New("embedded NATS did not start")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		ns.Shutdown()
		return nil, nil, err
	}
	return ns, nc, nil
}

func shutdownNATS(ns *natsserver.Server, nc *nats.Conn) {
	nc.Close()
	ns.Shutdown()
	ns.WaitForShutdown()
}

// generate fills home's store with the streams of a server that ran tasks
// finished tasks: their events, their output in the log stream and their
// wake-ups in the inbox. The server under test must not be running: its
// dispatcher and lease checks would act on the generated tasks as they arrive.
// Publishes are asynchronous and the store syncs on its interval: generating is
// not what is measured. It returns the number of events.
func (r *runner) generate(ctx context.Context, home string, tasks, ticks int) (int, error) {
	ns, nc, err := embeddedNATS(filepath.Join(home, r.opts.StoreDir))
	if err != nil {
		return 0, err
	}
	defer shutdownNATS(ns, nc)
	var failed atomic.Int64
	var firstErr atomic.Value
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}))
	if err != nil {
		return 0, err
	}
	if _, err := events.OpenStore(ctx, js, events.StreamConfig{}); err != nil {
		return 0, err
	}
	if _, err := events.OpenLogs(ctx, js, events.LogConfig{}); err != nil {
		return 0, err
	}
	if _, err := events.OpenInbox(ctx, js, events.InboxConfig{}); err != nil {
		return 0, err
	}
	publish := func(m *nats.Msg, opts ...jetstream.PublishOpt) error {
		// Waiting for room among the pending acks is the flow control: a loaded
		// machine's store may hold them for seconds.
		_, err := js.PublishMsgAsync(m, append(opts, jetstream.WithStallWait(time.Minute))...)
		return err
	}
	// One maker per core: building the events with the engine's own code costs more
	// than publishing them. Each publishes its tasks' events in order.
	makers := runtime.GOMAXPROCS(0)
	var count atomic.Int64
	errs := make([]error, makers)
	var wg sync.WaitGroup
	for m := range makers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[m] = r.generateShare(ctx, home, tasks, ticks, m, makers, publish, &count)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if n := failed.Load(); n > 0 {
		return 0, fmt.Errorf("%d generated messages not stored: %v", n, firstErr.Load())
	}
	return int(count.Load()), nil
}

// generateShare builds and publishes every makers-th task from first.
func (r *runner) generateShare(ctx context.Context, home string, tasks, ticks, first, makers int,
	publish func(*nats.Msg, ...jetstream.PublishOpt) error, count *atomic.Int64) error {
	h, err := newHistoryMaker(home, (tasks+makers-1)/makers)
	if err != nil {
		return err
	}
	for i := first; i < tasks; i += makers {
		if i%20000 < makers && i > 0 {
			if first == 0 {
				r.progress("generated %d of %d tasks", i, tasks)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		evs, err := h.task(i, ticks)
		if err != nil {
			return err
		}
		id := evs[0].event.TaskID
		for _, ev := range evs {
			msg := &nats.Msg{Subject: events.TaskSubject(id, ev.event.Type), Data: ev.data}
			if err := publish(msg, jetstream.WithMsgID(ev.event.ID)); err != nil {
				return err
			}
		}
		count.Add(int64(len(evs)))
		// Its output: one chunk of stdout, and the end marks of both streams.
		for _, chunk := range []struct {
			stream string
			data   []byte
			offset int
		}{{events.Stdout, h.output, 0}, {events.Stdout, nil, len(h.output)}, {events.Stderr, nil, 0}} {
			msg := &nats.Msg{Subject: events.LogSubject(id, chunk.stream), Data: chunk.data, Header: nats.Header{}}
			msg.Header.Set(events.LogOffsetHeader, strconv.Itoa(chunk.offset))
			if chunk.data == nil {
				msg.Header.Set(events.LogEOFHeader, "1")
			}
			if err := publish(msg); err != nil {
				return err
			}
		}
		if err := publish(&nats.Msg{Subject: events.InboxSubject("agent-7"), Data: h.lastWakeup}, jetstream.WithMsgID(id)); err != nil {
			return err
		}
	}
	return nil
}

// replayFigures are the parts of a restart measured in this process: the embedded
// NATS server recovering the store, and the projector replaying the stream.
type replayFigures struct {
	natsStart     time.Duration
	replay        time.Duration
	natsHeap      int64 // live heap of the NATS server holding the streams
	projectorHeap int64 // live heap of the projector's state
	tasks         int
}

// replayInProcess opens home's store in an embedded NATS server in this process
// and replays it with bgtask's projector, timing each and weighing the live heap
// each holds. The projector's is weighed after the settle time, when the NATS
// server has dropped the blocks the replay read from its caches (after 10 s).
func (r *runner) replayInProcess(ctx context.Context, home string) (replayFigures, error) {
	var f replayFigures
	before := settledHeap()
	start := time.Now()
	ns, nc, err := embeddedNATS(filepath.Join(home, r.opts.StoreDir))
	if err != nil {
		return f, err
	}
	defer shutdownNATS(ns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		return f, err
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return f, err
	}
	if _, err := store.LastSeq(ctx); err != nil {
		return f, err
	}
	f.natsStart = time.Since(start)
	withNATS := settledHeap()
	f.natsHeap = withNATS - before

	start = time.Now()
	p := projections.New(store, nil, engine.Base{})
	if err := p.Start(ctx); err != nil {
		return f, err
	}
	defer p.Stop()
	f.replay = time.Since(start)
	if err := sleepCtx(ctx, r.size.settle); err != nil {
		return f, err
	}
	f.projectorHeap = settledHeap() - withNATS
	_, f.tasks = p.List(engine.ListQuery{Limit: 1})
	return f, nil
}

// settledHeap is the heap still in use after a full collection, once it stops
// shrinking: a NATS server that was shut down lets go of its memory over a few
// hundred milliseconds.
func settledHeap() int64 {
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	last := heap()
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		now := heap()
		if now > last-last/100 {
			return min(now, last)
		}
		last = now
	}
	return last
}
