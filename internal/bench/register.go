package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// rawStream is the baseline's own stream (rawJetStream), configured as the event
// stream, so a raw publish costs what an append costs.
const (
	rawStream = "BENCH_RAW"
	rawPrefix = "benchraw"
)

func createRawStream(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        rawStream,
		Subjects:    []string{rawPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
	})
	return err
}

// rawAppend publishes data as the event store appends: synchronously, with the
// event id as message id and the expected last sequence of the task's subjects.
func rawAppend(ctx context.Context, js jetstream.JetStream, task, kind, msgID string, data []byte, expect uint64) (uint64, error) {
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: rawPrefix + "." + task + "." + kind, Data: data},
		jetstream.WithMsgID(msgID),
		jetstream.WithExpectStream(rawStream),
		jetstream.WithExpectLastSequenceForSubject(expect, rawPrefix+"."+task+".>"))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

func runRegister(ctx context.Context, r *runner, s *Scenario) error {
	srv, err := r.startServer(ctx, "register", "--no-worker")
	if err != nil {
		return err
	}
	defer srv.stop()
	raw, err := srv.rawBaseline(ctx, true, 8)
	if err != nil {
		return err
	}
	n := r.size.registers
	s.param("registrations", n)
	s.param("sync", "always (the default)")
	s.param("server", "--no-worker: the tasks stay armed")
	spec := srv.spec("true", "bench")
	parsed, err := engine.ParseSpec(spec)
	if err != nil {
		return err
	}
	one, err := srv.clients(1)
	if err != nil {
		return err
	}
	eight, err := srv.clients(8)
	if err != nil {
		return err
	}
	js := raw.js
	var reg1, reg8, raw1, raw8 []float64
	for i := range r.repeats {
		r.progress("register: repeat %d of %d", i+1, r.repeats)
		for _, m := range []struct {
			out  *[]float64
			rate func() (float64, error)
		}{
			{&reg1, func() (float64, error) { return registerRate(ctx, one, n, spec) }},
			{&raw1, func() (float64, error) { return rawRate(ctx, js[:1], n, parsed) }},
			{&reg8, func() (float64, error) { return registerRate(ctx, eight, n, spec) }},
			{&raw8, func() (float64, error) { return rawRate(ctx, js, n, parsed) }},
		} {
			rate, err := m.rate()
			if err != nil {
				return err
			}
			*m.out = append(*m.out, rate)
		}
	}
	const against = "raw sync publish + expected-last-subject-seq"
	one1 := s.compare("1 client", "tasks/s", summarize(reg1, false), against, summarize(raw1, false))
	all8 := s.compare("8 clients", "tasks/s", summarize(reg8, false), against, summarize(raw8, false))
	for _, row := range []*Row{one1, all8} {
		s.target("≥ 50% of the raw rate, "+row.Name, *row.Ratio >= 0.5, "%.0f%%", *row.Ratio*100)
	}
	return nil
}

// registerRate registers n tasks through the clients concurrently and returns
// tasks armed per second.
func registerRate(ctx context.Context, clients []*api.Client, n int, spec []byte) (float64, error) {
	start := time.Now()
	if _, err := registerAll(ctx, clients, n, spec); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// rawRate appends n armed events of new tasks, as registration does, through the
// publishers concurrently, and returns appends per second. The events are built
// before the clock starts: the baseline is the publish alone.
func rawRate(ctx context.Context, publishers []jetstream.JetStream, n int, spec engine.Spec) (float64, error) {
	type armed struct {
		id, msgID string
		data      []byte
	}
	evs := make([]armed, n)
	for i := range evs {
		id, err := engine.TaskID(spec)
		if err != nil {
			return 0, err
		}
		ev, err := engine.Decide(engine.State{ID: id}, engine.Arm{Spec: spec}, engine.Meta{Writer: "bench", Now: time.Now()})
		if err != nil {
			return 0, err
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return 0, err
		}
		evs[i] = armed{id: id, msgID: ev.ID, data: data}
	}
	start := time.Now()
	errs := make([]error, len(publishers))
	var wg sync.WaitGroup
	for p, js := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < n; i += len(publishers) {
				if _, err := rawAppend(ctx, js, evs[i].id, string(events.TypeArmed), evs[i].msgID, evs[i].data, 0); err != nil {
					errs[p] = fmt.Errorf("raw publish: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
