package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// workerStates are the values of the state label of bgtask_workers.
var workerStates = []string{string(events.WorkerStarting), string(events.WorkerReady),
	string(events.WorkerDraining), string(events.WorkerStopped)}

// now collects, at each scrape, what the engine holds at that moment: tasks by
// phase, live workers by state, and their slots.
type now struct {
	phases  func() map[engine.Phase]int
	workers func() []engine.WorkerStatus

	tasks, fleet, used, free *prometheus.Desc
}

func newNow(phases func() map[engine.Phase]int, workers func() []engine.WorkerStatus) *now {
	return &now{
		phases: phases, workers: workers,
		tasks: prometheus.NewDesc("bgtask_tasks", "Tasks in each state, as the projection holds them.", []string{"state"}, nil),
		fleet: prometheus.NewDesc("bgtask_workers", "Live workers (a heartbeat within the lease TTL) in each state.", []string{"state"}, nil),
		used:  prometheus.NewDesc("bgtask_slots_used", "Tasks the live workers run.", nil, nil),
		free: prometheus.NewDesc("bgtask_slots_available",
			"Tasks the ready workers could start besides: their max_tasks less what they run.", nil, nil),
	}
}

func (c *now) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tasks
	ch <- c.fleet
	ch <- c.used
	ch <- c.free
}

func (c *now) Collect(ch chan<- prometheus.Metric) {
	phases := c.phases()
	for _, p := range engine.Phases {
		ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, float64(phases[p]), string(p))
	}
	byState := map[string]int{}
	used, free := 0, 0
	for _, w := range c.workers() {
		byState[bounded(string(w.State), workerStates)]++
		used += w.Running
		if w.State == events.WorkerReady {
			free += max(w.MaxTasks-w.Running, 0)
		}
	}
	for _, s := range workerStates {
		ch <- prometheus.MustNewConstMetric(c.fleet, prometheus.GaugeValue, float64(byState[s]), s)
	}
	if n := byState[other]; n > 0 {
		ch <- prometheus.MustNewConstMetric(c.fleet, prometheus.GaugeValue, float64(n), other)
	}
	ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(used))
	ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(free))
}
