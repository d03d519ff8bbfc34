package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/engine/node"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers"
	"github.com/bgtask/bgtask/workers/shim"
)

// TestMain doubles as the shim: the worker starts commands through this test
// binary, run as `metrics.test shim ARGS`.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.ShimOrTests(shim.Main)) }

// fleet is an engine and one worker on a NATS server of their own.
type fleet struct {
	srv      *eventstest.Server
	engine   *node.Node
	client   *api.Client
	store    *events.JetStreamStore
	stateDir string
	worker   *workers.Worker
}

func start(t *testing.T) *fleet {
	t.Helper()
	ctx := context.Background()
	srv := eventstest.Run(t)
	if _, err := events.OpenLogs(ctx, srv.JS, events.LogConfig{}); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{
		Conn: srv.Conn, Writer: "engine-1", LeaseTTL: time.Minute, Replicas: 1,
		Sinks: sinks.New([]byte("a test secret of enough bytes")), RetryBase: 10 * time.Millisecond,
		Version: "0.0.0-test",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{srv: srv, engine: n, client: api.NewClient(srv.Conn), store: store, stateDir: t.TempDir()}
	f.startWorker(t)
	return f
}

// startWorker starts the fleet's worker, stopped when the test ends.
func (f *fleet) startWorker(t *testing.T) {
	t.Helper()
	w := workers.New(f.srv.Conn, f.srv.JS, f.store, workers.Config{
		ID: "worker-1", MaxTasks: 4, Env: os.Environ(), TickInterval: time.Minute,
		KillGrace: 300 * time.Millisecond, StateDir: f.stateDir,
		Base: engine.Base{Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))},
	})
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	f.worker = w
}

func (f *fleet) register(t *testing.T, spec string) string {
	t.Helper()
	reg, err := f.client.Register(context.Background(), []byte(spec))
	if err != nil {
		t.Fatalf("register %s: %v", spec, err)
	}
	return reg.ID
}

// waitTask waits until the engine's projection of task id meets cond.
func (f *fleet) waitTask(t *testing.T, id, what string, cond func(engine.State) bool) engine.State {
	t.Helper()
	var s engine.State
	met := false
	defer func() { // as a failure ends the test too
		if !met {
			t.Logf("task %s is %s %s", id, s.Phase, s.Status)
		}
	}()
	testkit.Eventually(t, 30*time.Second, "task "+id+" "+what, func() bool {
		s, _ = f.engine.Projector().Task(id)
		met = cond(s)
		return met
	})
	return s
}

// waitScrape waits until a scrape shows want, and returns it. The projector
// tells the metrics after its state shows an event: the counts may lag a wait
// for the state by an instant.
func (f *fleet) waitScrape(t *testing.T, want map[string]float64) map[string]float64 {
	t.Helper()
	var got map[string]float64
	var why string
	defer func() { // as a failure ends the test too
		if why != "" {
			t.Logf("the last scrape differs:\n%s", why)
		}
	}()
	testkit.Eventually(t, 10*time.Second, "the scrape showing every count", func() bool {
		got = f.scrape(t)
		why = mismatch(got, want)
		return why == ""
	})
	return got
}

func fired(s engine.State) bool   { return s.Phase == engine.PhaseFired }
func running(s engine.State) bool { return s.Phase == engine.PhaseRunning && s.PID != 0 }

// A task's life is counted once for each of its steps, with labels that say
// what happened and never which task it was; the gauges say what the engine
// holds now, and the micro service's stats carry the same counts.
func TestMetricsCountWhatHappensToTasks(t *testing.T) {
	f := start(t)
	sink := func(argv string) string {
		return `{"command":"true","deliver":[{"type":"exec","argv":["` + argv + `"],"max_attempts":1}]}`
	}
	ids := map[string]string{
		"ok": f.register(t, `{"command":"true"}`), "exit3": f.register(t, `{"command":"exit 3"}`),
		"sink-ok": f.register(t, sink("true")), "sink-fail": f.register(t, sink("false")),
		"cancel": f.register(t, `{"command":"sleep 60"}`), "lose": f.register(t, `{"command":"sleep 60"}`),
	}
	for _, name := range []string{"ok", "exit3", "sink-ok", "sink-fail"} {
		f.waitTask(t, ids[name], "fired", fired)
	}
	f.waitTask(t, ids["sink-ok"], "delivered", func(s engine.State) bool { return len(s.Deliveries) == 1 && s.Deliveries[0].Delivered })
	f.waitTask(t, ids["sink-fail"], "failed to deliver", func(s engine.State) bool { return len(s.Deliveries) == 1 && s.Deliveries[0].Failed })
	f.waitTask(t, ids["cancel"], "running", running)
	if _, err := f.client.Cancel(context.Background(), ids["cancel"], "not needed"); err != nil {
		t.Fatal(err)
	}
	f.waitTask(t, ids["cancel"], "cancelled", func(s engine.State) bool { return s.Phase == engine.PhaseCancelled })
	f.loseRun(t, f.waitTask(t, ids["lose"], "running", running))
	if s := f.waitTask(t, ids["lose"], "fired", fired); s.Status != engine.StatusLost {
		t.Fatalf("the task whose shim died fired %s, want lost", s.Status)
	}

	want := map[string]float64{
		"bgtask_tasks_registered_total":                                 6,
		`bgtask_tasks_fired_total{status="succeeded"}`:                  3,
		`bgtask_tasks_fired_total{status="failed"}`:                     1,
		`bgtask_tasks_fired_total{status="lost"}`:                       1,
		`bgtask_tasks_fired_total{status="timed_out"}`:                  0,
		`bgtask_tasks_lost_total{action="fail",reason="shim_died"}`:     1,
		`bgtask_tasks_lost_total{action="fail",reason="lease_expired"}`: 0,
		"bgtask_tasks_cancelled_total":                                  1,
		`bgtask_delivery_attempts_total{result="ok",sink="exec"}`:       1,
		`bgtask_delivery_attempts_total{result="gave_up",sink="exec"}`:  1,
		`bgtask_delivery_attempts_total{result="retry",sink="exec"}`:    0,
		`bgtask_delivery_attempts_total{result="ok",sink="webhook"}`:    0,
		"bgtask_task_queue_seconds_count":                               6,
		"bgtask_task_run_seconds_count":                                 4, // the cancelled and the lost run never exited
		"bgtask_wakeup_latency_seconds_count":                           5,
		`bgtask_tasks{state="fired"}`:                                   5,
		`bgtask_tasks{state="cancelled"}`:                               1,
		`bgtask_tasks{state="running"}`:                                 0,
		`bgtask_workers{state="ready"}`:                                 1,
		`bgtask_workers{state="draining"}`:                              0,
		"bgtask_slots_used":                                             0,
		"bgtask_slots_available":                                        4,
		"bgtask_append_conflicts_total":                                 0,
	}
	got := f.waitScrape(t, want)
	for _, name := range []string{"bgtask_task_queue_seconds_sum", "bgtask_task_run_seconds_sum", "bgtask_wakeup_latency_seconds_sum"} {
		if got[name] <= 0 {
			t.Errorf("%s = %v: the histogram observed no time", name, got[name])
		}
	}
	f.checkNoTaskInLabels(t, ids)
	f.checkMicroStats(t, got)

	// The same idempotency key again: its armed append loses to the first one.
	keyed := `{"command":"true","idempotency_key":"once"}`
	f.waitTask(t, f.register(t, keyed), "fired", fired)
	f.register(t, keyed)
	want["bgtask_append_conflicts_total"] = 1
	want["bgtask_tasks_registered_total"] = 7
	want[`bgtask_tasks_fired_total{status="succeeded"}`] = 4
	want["bgtask_wakeup_latency_seconds_count"] = 6
	want["bgtask_task_queue_seconds_count"] = 7
	want["bgtask_task_run_seconds_count"] = 5
	want[`bgtask_tasks{state="fired"}`] = 6
	f.waitScrape(t, want)
}

// loseRun makes a task's run one whose end nobody can learn, as a crash of its
// worker, its shim and its command would: the worker stops, the shim and the
// command are killed, the command (this process's child then: the worker made it a
// subreaper) is reaped here, and the worker starts again.
func (f *fleet) loseRun(t *testing.T, s engine.State) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(f.stateDir, "runs", fmt.Sprintf("%s-%d", s.ID, s.Epoch), shim.PIDFile))
	if err != nil {
		t.Fatal(err)
	}
	var pids struct{ Shim, Command struct{ PID int } }
	if err := json.Unmarshal(data, &pids); err != nil || pids.Shim.PID == 0 || pids.Command.PID == 0 {
		t.Fatalf("pid.json %s: %v", data, err)
	}
	f.worker.Stop()
	if err := syscall.Kill(pids.Shim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := syscall.Wait4(pids.Shim.PID, nil, 0, nil); err != nil {
		t.Fatalf("reap the shim: %v", err)
	}
	if err := syscall.Kill(-pids.Command.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := syscall.Wait4(pids.Command.PID, nil, 0, nil); err != nil {
		t.Fatalf("reap the command: %v", err)
	}
	f.startWorker(t)
}

func (f *fleet) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	return scrape(t, f.engine.Metrics())
}

func (f *fleet) families(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	return families(t, f.engine.Metrics())
}

// scrape reads metrics as Prometheus does: each sample by its name and labels,
// a histogram by its _count and _sum.
func scrape(t *testing.T, h http.Handler) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for name, fam := range families(t, h) {
		for _, m := range fam.GetMetric() {
			key := name + labels(m)
			switch {
			case m.Histogram != nil:
				out[name+"_count"+labels(m)] = float64(m.Histogram.GetSampleCount())
				out[name+"_sum"+labels(m)] = m.Histogram.GetSampleSum()
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

func families(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	return fams
}

func labels(m *dto.Metric) string {
	if len(m.GetLabel()) == 0 {
		return ""
	}
	pairs := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		pairs = append(pairs, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}

// mismatch says which of want got differs on, or "".
func mismatch(got, want map[string]float64) string {
	var diffs []string
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			diffs = append(diffs, fmt.Sprintf("%s = %v (present %v), want %v", k, g, ok, v))
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "\n")
}

// uuidLike is what a task id looks like.
var uuidLike = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// checkNoTaskInLabels fails if a label value of a bgtask metric looks like a
// task id, or if the exposition names any of the tasks at all.
func (f *fleet) checkNoTaskInLabels(t *testing.T, ids map[string]string) {
	t.Helper()
	for name, fam := range f.families(t) {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if uuidLike.MatchString(l.GetValue()) {
					t.Errorf("%s has the label %s=%q, which looks like a task id", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	rec := httptest.NewRecorder()
	f.engine.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for name, id := range ids {
		if strings.Contains(rec.Body.String(), id) {
			t.Errorf("the metrics name the task %s (%s)", name, id)
		}
	}
}

// checkMicroStats checks that each endpoint's data in the micro service's stats
// holds the counts a scrape read.
func (f *fleet) checkMicroStats(t *testing.T, scraped map[string]float64) {
	t.Helper()
	subject, err := micro.ControlSubject(micro.StatsVerb, api.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := f.srv.Conn.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats.Endpoints) == 0 {
		t.Fatal("the stats list no endpoint")
	}
	for _, ep := range stats.Endpoints {
		var data struct {
			Registered float64                 `json:"bgtask_tasks_registered_total"`
			Fired      map[string]float64      `json:"bgtask_tasks_fired_total"`
			Wakeup     struct{ Count float64 } `json:"bgtask_wakeup_latency_seconds"`
			Tasks      map[string]float64      `json:"bgtask_tasks"`
		}
		if err := json.Unmarshal(ep.Data, &data); err != nil {
			t.Fatalf("endpoint %s: data %s: %v", ep.Name, ep.Data, err)
		}
		if data.Registered != scraped["bgtask_tasks_registered_total"] ||
			data.Fired["status=succeeded"] != scraped[`bgtask_tasks_fired_total{status="succeeded"}`] ||
			data.Wakeup.Count != scraped["bgtask_wakeup_latency_seconds_count"] ||
			data.Tasks["state=fired"] != scraped[`bgtask_tasks{state="fired"}`] {
			t.Fatalf("endpoint %s: the stats' data %s differ from the scrape", ep.Name, ep.Data)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
