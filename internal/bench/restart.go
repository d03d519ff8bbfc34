package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

func runRestart(ctx context.Context, r *runner, s *Scenario) error {
	tasks := r.size.restartTasks
	home, err := r.newHome("restart")
	if err != nil {
		return err
	}
	r.progress("restart: generating %d finished tasks", tasks)
	start := time.Now()
	count, err := r.generate(ctx, home, tasks, r.size.restartTicks)
	if err != nil {
		return err
	}
	generated := time.Now()
	s.param("tasks", tasks)
	s.param("events", count)
	s.param("generated_in_s", fmt.Sprintf("%.1f", time.Since(start).Seconds()))
	s.param("server", "--no-worker, --sync always; ready = `list` answers with every task")

	r.progress("restart: replaying in this process")
	fig, err := r.replayInProcess(ctx, home)
	if err != nil {
		return err
	}
	if fig.tasks != tasks {
		return fmt.Errorf("the projector holds %d tasks, want %d", fig.tasks, tasks)
	}
	// The first start replays the whole stream, then writes a snapshot of its state
	// in the background; the next starts read it.
	r.progress("restart: the first start, replaying the whole stream")
	var snapWrite time.Duration
	var snapSize int64
	cold, _, err := r.restartServer(ctx, home, tasks, r.size.snapshotEvery, func(*server) error {
		start := time.Now()
		snapSize, err = r.awaitSnapshot(ctx, home, uint64(count))
		snapWrite = time.Since(start)
		return err
	})
	if err != nil {
		return err
	}
	if err := r.awaitDedupeWindow(ctx, s, generated); err != nil {
		return err
	}
	ready, raw, rss, err := r.restartsFromSnapshot(ctx, home, tasks, count)
	if err != nil {
		return err
	}
	rawRead := summarize(raw, false)
	readyRow := s.compare("server start → serving every task, from its snapshot", "s", summarize(ready, false),
		"raw ordered-consumer read of the stream over TCP", rawRead)
	rate := s.compare("events served per second of start (all of the stream's events / the time to ready)", "events/s", summarize(perSecond(count, ready), false),
		"raw ordered-consumer read", summarize(perSecond(count, raw), false))
	s.add("server RSS when ready, from its snapshot", "MiB", summarize(rss, false))
	coldRow := s.compare("first start: replaying the whole stream (no snapshot yet)", "s", summarize([]float64{cold.Seconds()}, false),
		"raw ordered-consumer read of the stream over TCP", rawRead)
	s.add("  of which: embedded NATS recovers the store (in the bench's process)", "s", summarize([]float64{fig.natsStart.Seconds()}, false))
	s.add("  of which: projector replays the stream (in the bench's process)", "s", summarize([]float64{fig.replay.Seconds()}, false))
	s.add("snapshot: written in the background after the first start's ready, in", "s", summarize([]float64{snapWrite.Seconds()}, false))
	s.add("snapshot: size", "MiB", summarize([]float64{mib(snapSize)}, false))
	s.target("≥ 50% of the raw read rate", *rate.Ratio >= 0.5, "%.0f%%", *rate.Ratio*100)
	coldRatio := "no raw read to compare"
	if coldRow.Ratio != nil {
		coldRatio = num(*coldRow.Ratio) + "× the raw read's time"
	}
	s.target("ready in < 10 s", readyRow.Bgtask.Median < 10, "%s s (the first start, with no snapshot: %s s, %s)",
		num(readyRow.Bgtask.Median), num(cold.Seconds()), coldRatio)
	return nil
}

// awaitDedupeWindow waits, at full size, until the events generated are past
// NATS's dedupe window.
func (r *runner) awaitDedupeWindow(ctx context.Context, s *Scenario, generated time.Time) error {
	// A restart rebuilds NATS's dedupe state of the events of its last two
	// minutes. A generated stream has all of its events in them; a real one, but
	// right after a burst, has few. At full size the restarts are measured once
	// the generated events are past the window (the first start is not).
	if !r.opts.Quick {
		wait := time.Until(generated.Add(events.DefaultDuplicates + 5*time.Second))
		s.param("restarts_from", "the stream's events older than NATS's dedupe window ("+events.DefaultDuplicates.String()+")")
		if wait > 0 {
			r.progress("restart: waiting %v until the generated events are past NATS's dedupe window", wait.Round(time.Second))
			if err := sleepCtx(ctx, wait); err != nil {
				return err
			}
		}
	}
	return nil
}

// restartsFromSnapshot restarts the server of home r.repeats times, each from its
// snapshot, and measures its time to ready, a raw read of the stream, and its RSS.
func (r *runner) restartsFromSnapshot(ctx context.Context, home string, tasks, count int) (ready, raw, rss []float64, err error) {
	for i := range r.repeats {
		r.progress("restart: repeat %d of %d, from the snapshot", i+1, r.repeats)
		d, mem, err := r.restartServer(ctx, home, tasks, r.size.snapshotEvery, func(srv *server) error {
			d, err := rawRead(ctx, srv.js, count)
			raw = append(raw, d.Seconds())
			return err
		})
		if err != nil {
			return nil, nil, nil, err
		}
		ready = append(ready, d.Seconds())
		rss = append(rss, mib(mem.RSS))
	}
	return ready, raw, rss, nil
}

// awaitSnapshot waits until the server of home has written a snapshot of its
// projection at seq, and returns its size.
func (r *runner) awaitSnapshot(ctx context.Context, home string, seq uint64) (int64, error) {
	path := filepath.Join(home, r.opts.SnapshotFile)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		// The file is renamed into place whole: once it names seq, it is written.
		if at, err := projections.SnapshotSeq(path); err == nil && at >= seq {
			info, err := os.Stat(path)
			if err != nil {
				return 0, err
			}
			return info.Size(), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no snapshot at seq %d in %s after 5 minutes", seq, path)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

func perSecond(count int, seconds []float64) []float64 {
	out := make([]float64, len(seconds))
	for i, d := range seconds {
		out[i] = float64(count) / d
	}
	return out
}

// restartServer starts `bgtask server --no-worker` on a home holding tasks tasks
// and returns how long it took until it served a list of all of them, and its
// memory then, with --snapshot-every snapshotEvery (0: none). during runs while it
// is up. Without a worker: the generated stream has no worker consumer, and a new
// one would be handed every armed event ever.
func (r *runner) restartServer(ctx context.Context, home string, tasks, snapshotEvery int, during func(*server) error) (time.Duration, memInfo, error) {
	start := time.Now()
	p, err := r.spawn(home, "server", "server", "--log-level", "warn", "--no-worker",
		"--snapshot-every", strconv.Itoa(snapshotEvery))
	if err != nil {
		return 0, memInfo{}, err
	}
	srv := &server{proc: p, r: r}
	defer srv.stop()
	if err := srv.waitReady(ctx, 5*time.Minute); err != nil {
		return 0, memInfo{}, err
	}
	for {
		total, err := srv.listTotal(ctx)
		if err != nil {
			return 0, memInfo{}, err
		}
		if total == tasks {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return 0, memInfo{}, srv.failure("lists %d tasks, want %d", total, tasks)
		}
	}
	ready := time.Since(start)
	mem, err := readMem(srv.pid())
	if err != nil {
		return 0, memInfo{}, err
	}
	if during != nil {
		if err := during(srv); err != nil {
			return 0, memInfo{}, err
		}
	}
	return ready, mem, nil
}

// rawRead reads the whole event stream with an ordered consumer, as fast as the
// client library pulls it, without decoding.
func rawRead(ctx context.Context, js jetstream.JetStream, count int) (time.Duration, error) {
	start := time.Now()
	stream, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return 0, err
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return 0, err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for range count {
		if _, err := it.Next(); err != nil {
			return 0, fmt.Errorf("raw read: %w", err)
		}
	}
	return time.Since(start), nil
}

func runGrowth(ctx context.Context, r *runner, s *Scenario) error {
	tasks, settle := r.size.growthTasks, r.size.settle
	var empty memSamples
	for i := range r.repeats {
		r.progress("growth: empty server, repeat %d of %d", i+1, r.repeats)
		home, err := r.newHome("growth-empty")
		if err != nil {
			return err
		}
		if err := r.measureMem(ctx, home, 0, settle, &empty); err != nil {
			return err
		}
	}
	home, err := r.newHome("growth")
	if err != nil {
		return err
	}
	r.progress("growth: generating %d finished tasks", tasks)
	count, err := r.generate(ctx, home, tasks, r.size.growthTicks)
	if err != nil {
		return err
	}
	s.param("tasks", tasks)
	s.param("events", count)
	s.param("subjects", fmt.Sprintf("%d: one per task in %s, its stdout and stderr in %s", 3*tasks, events.StreamName, events.LogStreamName))
	s.param("server", "--no-worker, restarted on the stream; memory read when `list` answers with every task, and after "+settle.String()+" idle")
	fig, err := r.replayInProcess(ctx, home)
	if err != nil {
		return err
	}
	var full memSamples
	for i := range r.repeats {
		r.progress("growth: server with %d tasks, repeat %d of %d", tasks, i+1, r.repeats)
		if err := r.measureMem(ctx, home, tasks, settle, &full); err != nil {
			return err
		}
	}
	// Archiving takes as long again as the rest: what came before it is shown now.
	r.progress("growth: %d tasks: %s MiB after %v idle (empty: %s MiB): %s bytes a task; live heaps a task: NATS %d, projector %d",
		tasks, num(summarize(full.idle, false).Median), settle, num(summarize(empty.idle, false).Median),
		num((summarize(full.idle, false).Median-summarize(empty.idle, false).Median)*(1<<20)/float64(tasks)),
		fig.natsHeap/int64(tasks), fig.projectorHeap/int64(tasks))
	r.progress("growth: archiving the %d tasks", tasks)
	took, err := r.archiveAll(ctx, home, tasks)
	if err != nil {
		return err
	}
	var archived memSamples
	for i := range r.repeats {
		r.progress("growth: server with %d archived tasks, repeat %d of %d", tasks, i+1, r.repeats)
		if err := r.measureMem(ctx, home, tasks, settle, &archived); err != nil {
			return err
		}
	}
	idle := summarize(empty.idle, false)
	perTask := func(idleRSS []float64) []float64 {
		var out []float64
		for _, v := range idleRSS {
			out = append(out, (v-idle.Median)*(1<<20)/float64(tasks))
		}
		return out
	}
	s.compare("server RSS when ready", "MiB", summarize(full.ready, false), "empty server", summarize(empty.ready, false))
	s.compare("server RSS after "+settle.String()+" idle", "MiB", summarize(full.idle, false), "empty server", idle)
	s.compare("server peak RSS (VmHWM)", "MiB", summarize(full.peak, false), "empty server", summarize(empty.peak, false))
	s.add("idle RSS per finished task, over the empty server's", "bytes", summarize(perTask(full.idle), false))
	s.add("  of which: NATS live heap holding the streams (in the bench's process)", "bytes", summarize([]float64{float64(fig.natsHeap) / float64(tasks)}, false))
	s.add("  of which: projector live heap (in the bench's process)", "bytes", summarize([]float64{float64(fig.projectorHeap) / float64(tasks)}, false))
	s.compare("after archiving: server RSS after "+settle.String()+" idle", "MiB", summarize(archived.idle, false), "before archiving", summarize(full.idle, false))
	s.compare("after archiving: server peak RSS (VmHWM)", "MiB", summarize(archived.peak, false), "before archiving", summarize(full.peak, false))
	s.add("after archiving: idle RSS per finished task, over the empty server's", "bytes", summarize(perTask(archived.idle), false))
	s.add("archiving rate (a server archiving every finished task, from when it is ready)", "tasks/s", summarize([]float64{float64(tasks) / took.Seconds()}, false))
	s.note("archiving (server --archive-after, 7 days by default) leaves each task one event and a summary in " + events.StreamName + ", its history gzipped in " + events.ArchiveStreamName + " (docs/operations.md, Retention)")
	return nil
}

// memSamples are a server's RSS when ready, after the settle time idle, and at its
// peak, in MiB, one per restart.
type memSamples struct{ ready, idle, peak []float64 }

// measureMem restarts a server on home and reads its memory when it is ready and
// after settle, once it has given back what the replay's garbage took. No
// snapshots: the memory of the stream and of a replay of it, without a snapshot's
// write in the idle time.
func (r *runner) measureMem(ctx context.Context, home string, tasks int, settle time.Duration, m *memSamples) error {
	var settled memInfo
	_, mem, err := r.restartServer(ctx, home, tasks, 0, func(srv *server) error {
		if err := sleepCtx(ctx, settle); err != nil {
			return err
		}
		var err error
		settled, err = readMem(srv.pid())
		return err
	})
	if err != nil {
		return err
	}
	m.ready, m.idle, m.peak = append(m.ready, mib(mem.RSS)), append(m.idle, mib(settled.RSS)), append(m.peak, mib(settled.HWM))
	return nil
}

// archiveAll runs a server on home that archives every finished task at once,
// until the event stream holds only their archived events.
func (r *runner) archiveAll(ctx context.Context, home string, tasks int) (time.Duration, error) {
	srv, err := r.startServerIn(ctx, home, "growth-archive", "--no-worker", "--archive-after", "1ms")
	if err != nil {
		return 0, err
	}
	defer srv.stop()
	// From the server ready, not started: its replay of the stream is restart's
	// measure. Its first sweep may begin a moment before.
	start := time.Now()
	for {
		// A server busy archiving may not answer in time: that is no failure, the
		// next look may find it done.
		var left uint64
		stream, err := srv.js.Stream(ctx, events.StreamName)
		switch {
		case err == nil:
			left = stream.CachedInfo().State.Msgs
		case !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
			return 0, err
		}
		if left == uint64(tasks) {
			return time.Since(start), nil
		} else if time.Since(start) > time.Hour {
			return 0, srv.failure("%d events left in %s after an hour of archiving, want %d (last look: %v)", left, events.StreamName, tasks, err)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return 0, err
		}
	}
}
