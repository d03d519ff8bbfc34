// Package metrics is an engine's Prometheus metrics, on a registry of its own:
// what happened to tasks (counted from the events the projector applies live),
// how long their steps took, what the tasks, workers and slots are now (read at
// each scrape), and how many of the engine's appends lost a race. No label
// carries a task id or any other free text: every label has a fixed set of
// values. The engine's own packages know nothing of Prometheus; the node feeds
// this package.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Label values. A value outside its set is counted as other, so that a label
// never grows with what the stream holds.
var (
	// statuses are the outcomes a fired task can have.
	statuses = []string{engine.StatusSucceeded, engine.StatusFailed, engine.StatusStalled,
		engine.StatusTimedOut, engine.StatusLost, engine.StatusSkipped}
	// lostReasons say who found a run lost: the engine, when its worker was gone
	// past its lease, or the worker, when the run's shim died.
	lostReasons = []string{reasonLeaseExpired, reasonShimDied}
	// lostActions are what on_lost did.
	lostActions = []string{engine.OnLostFail, engine.OnLostRespawn}
	// sinkTypes are the push sinks.
	sinkTypes = []string{engine.SinkWebhook, engine.SinkExec}
	// results are how a delivery attempt ended: delivered, failed with another
	// attempt to come, or failed for the last time.
	results = []string{resultOK, resultRetry, resultGaveUp}
)

// The values of the reason label of lost tasks and of the result label of
// delivery attempts.
const (
	reasonLeaseExpired = "lease_expired"
	reasonShimDied     = "shim_died"
	resultOK           = "ok"
	resultRetry        = "retry"
	resultGaveUp       = "gave_up"
	other              = "other"
)

// Metrics are one engine's metrics. Applied feeds them; Handler serves them.
type Metrics struct {
	reg        *prometheus.Registry
	registered prometheus.Counter
	fired      *prometheus.CounterVec
	lost       *prometheus.CounterVec
	cancelled  prometheus.Counter
	queue      prometheus.Histogram
	run        prometheus.Histogram
	wakeup     prometheus.Histogram
	deliveries *prometheus.CounterVec
	gaveUp     *prometheus.CounterVec
	redelivers *prometheus.CounterVec
	conflicts  prometheus.Counter
}

// New returns the metrics of an engine whose tasks in each phase phases counts
// and whose live workers workers lists; both are read at each scrape.
func New(phases func() map[engine.Phase]int, workers func() []engine.WorkerStatus) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		registered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bgtask_tasks_registered_total", Help: "Tasks registered (armed)."}),
		fired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bgtask_tasks_fired_total", Help: "Tasks fired: their wake-up is in the inbox, by outcome."}, []string{"status"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bgtask_tasks_lost_total", Help: "Runs lost, by who found them lost and what on_lost did."}, []string{"reason", "action"}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bgtask_tasks_cancelled_total", Help: "Tasks cancelled."}),
		queue: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bgtask_task_queue_seconds", Help: "From a task's arming (or its start_at) to its first spawn.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		run: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bgtask_task_run_seconds", Help: "From a run's spawn to its command's exit.",
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 10)}),
		wakeup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bgtask_wakeup_latency_seconds", Help: "From a task's end (its command's exit) to its fired event: the wake-up in the inbox.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bgtask_delivery_attempts_total", Help: "Attempts of push sinks, by sink type and result."}, []string{"sink", "result"}),
		gaveUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bgtask_deliveries_given_up_total", Help: "Pushes that gave up (delivery-failed), by sink type: bgtask redeliver sends them again."}, []string{"sink"}),
		redelivers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bgtask_redeliveries_total", Help: "Pushes sent again by bgtask redeliver (that gave up, or were delivered), by sink type."}, []string{"sink"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bgtask_append_conflicts_total", Help: "Appends of the engine that lost the race: the task had moved on since it was read."}),
	}
	m.reg.MustRegister(m.registered, m.fired, m.lost, m.cancelled, m.queue, m.run, m.wakeup, m.deliveries, m.gaveUp, m.redelivers, m.conflicts,
		newNow(phases, workers), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every label value is there from the start, at 0, so that a rate over it
	// needs no first event.
	for _, s := range statuses {
		m.fired.WithLabelValues(s)
	}
	for _, r := range lostReasons {
		for _, a := range lostActions {
			m.lost.WithLabelValues(r, a)
		}
	}
	for _, k := range sinkTypes {
		m.gaveUp.WithLabelValues(k)
		m.redelivers.WithLabelValues(k)
		for _, r := range results {
			m.deliveries.WithLabelValues(k, r)
		}
	}
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Applied counts what the event rec did to the task, whose state is now s. It is
// called for every event the projector applies live, so it must not block.
func (m *Metrics) Applied(s engine.State, rec events.Record) {
	switch rec.Type {
	case events.TypeArmed:
		m.registered.Inc()
	case events.TypeSpawned:
		if s.Epoch == 1 && s.SpawnedAt != nil {
			m.queue.Observe(seconds(queuedFrom(s), *s.SpawnedAt))
		}
	case events.TypeExited:
		if s.Run != nil && s.SpawnedAt != nil && s.Phase == engine.PhaseEnded {
			m.run.Observe(seconds(*s.SpawnedAt, s.Run.EndedAt))
		}
	case events.TypeLost:
		m.lostRun(rec)
	case events.TypeCancelled:
		m.cancelled.Inc()
	case events.TypeFired:
		m.fired.WithLabelValues(bounded(s.Status, statuses)).Inc()
		if s.EndedAt != nil && s.FiredAt != nil {
			m.wakeup.Observe(seconds(*s.EndedAt, *s.FiredAt))
		}
	case events.TypeDeliveryResult:
		m.delivered(s, rec)
	case events.TypeDeliveryFailed:
		m.givenUp(s, rec)
	case events.TypeRedeliveryRequested:
		m.redelivered(s, rec)
	}
}

func (m *Metrics) lostRun(rec events.Record) {
	payload, err := rec.Decode()
	p, ok := payload.(*events.Lost)
	if err != nil || !ok {
		return
	}
	// Only a run's own worker writes lost when the run's shim died; the engine
	// writes it for a worker gone past its lease.
	reason := reasonLeaseExpired
	if rec.Writer == p.Worker {
		reason = reasonShimDied
	}
	m.lost.WithLabelValues(reason, bounded(p.Action, lostActions)).Inc()
}

func (m *Metrics) delivered(s engine.State, rec events.Record) {
	payload, err := rec.Decode()
	p, ok := payload.(*events.DeliveryResult)
	if err != nil || !ok || p.Sink < 0 || p.Sink >= len(s.Deliveries) {
		return
	}
	result := resultGaveUp
	switch {
	case p.OK:
		result = resultOK
	case p.RetryAt != nil:
		result = resultRetry
	}
	m.deliveries.WithLabelValues(bounded(s.Deliveries[p.Sink].Type, sinkTypes), result).Inc()
}

func (m *Metrics) givenUp(s engine.State, rec events.Record) {
	payload, err := rec.Decode()
	p, ok := payload.(*events.DeliveryFailed)
	if err != nil || !ok || p.Sink < 0 || p.Sink >= len(s.Deliveries) {
		return
	}
	m.gaveUp.WithLabelValues(bounded(s.Deliveries[p.Sink].Type, sinkTypes)).Inc()
}

func (m *Metrics) redelivered(s engine.State, rec events.Record) {
	payload, err := rec.Decode()
	p, ok := payload.(*events.RedeliveryRequested)
	if err != nil || !ok {
		return
	}
	for _, i := range p.Sinks {
		if i >= 0 && i < len(s.Deliveries) {
			m.redelivers.WithLabelValues(bounded(s.Deliveries[i].Type, sinkTypes)).Inc()
		}
	}
}

// CountConflicts returns store, counting each of its appends that conflicts.
func (m *Metrics) CountConflicts(store events.Store) events.Store {
	return conflictCounter{Store: store, conflicts: m.conflicts}
}

type conflictCounter struct {
	events.Store
	conflicts prometheus.Counter
}

func (c conflictCounter) Append(ctx context.Context, ev events.Event, expect uint64) (uint64, error) {
	seq, err := c.Store.Append(ctx, ev, expect)
	if errors.Is(err, events.ErrConflict) {
		c.conflicts.Inc()
	}
	return seq, err
}

// queuedFrom is when a task could first be spawned: its arming, or its start_at.
func queuedFrom(s engine.State) time.Time {
	if start := s.Spec.StartTime(); start.After(s.ArmedAt) {
		return start
	}
	return s.ArmedAt
}

// seconds is the time from a to b, never below 0: the two may come from the
// clocks of two hosts.
func seconds(a, b time.Time) float64 { return max(b.Sub(a).Seconds(), 0) }

// bounded is v if it is one of values, else other.
func bounded(v string, values []string) string {
	if slices.Contains(values, v) {
		return v
	}
	return other
}
