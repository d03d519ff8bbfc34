package bench

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/projections"
)

// BenchmarkTaskHistory builds the history of one finished task with the engine's
// Decide and Apply, as the restart and growth scenarios generate their streams.
func BenchmarkTaskHistory(b *testing.B) {
	h, err := newHistoryMaker(b.TempDir(), 1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := h.task(i, 5); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// Generated tasks have all ended a day ago, one second apart, however many there
// are: with the first of 200,000 starting a day ago, a sixth of them would end in
// the future, out of reach of a server archiving every finished task.
func TestGeneratedTasksEndADayAgo(t *testing.T) {
	const tasks, ticks = 60, 3 // each runs 30 s
	h, err := newHistoryMaker(t.TempDir(), tasks)
	if err != nil {
		t.Fatal(err)
	}
	var last events.Event
	for i := range tasks {
		evs, err := h.task(i, ticks)
		if err != nil {
			t.Fatal(err)
		}
		last = evs[len(evs)-1].event
	}
	if dayAgo := time.Now().Add(-24 * time.Hour); last.Time.After(dayAgo.Add(time.Minute)) {
		t.Fatalf("the last of %d tasks fired at %v, %v after a day ago; want at most its 30 s run after", tasks, last.Time, last.Time.Sub(dayAgo))
	}
}

// The generated streams must be ones bgtask itself could have written: the audit
// of every invariant finds nothing wrong, and every task fired once, with its
// wake-up in the inbox.
func TestGeneratedStreamPassesTheAudit(t *testing.T) {
	r := &runner{opts: Options{StoreDir: "jetstream"}, size: quickSizes}
	home := t.TempDir()
	ctx := context.Background()
	const tasks = 30
	count, err := r.generate(ctx, home, tasks, 5)
	if err != nil {
		t.Fatal(err)
	}
	if count != tasks*10 {
		t.Fatalf("%d events, want %d", count, tasks*10)
	}
	ns, nc, err := embeddedNATS(filepath.Join(home, "jetstream"))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownNATS(ns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	audit := projections.NewAudit()
	for _, stream := range []string{events.StreamName, events.InboxStreamName} {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		batch, err := cons.FetchNoWait(count)
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			if stream == events.InboxStreamName {
				audit.AddDelivery(msg.Headers().Get(jetstream.MsgIDHeader))
			} else {
				audit.Add(events.DecodeRecord(meta.Sequence.Stream, msg.Data()))
			}
		}
	}
	rep := audit.Report()
	if len(rep.Violations) > 0 || rep.Fired != tasks || rep.Events != count {
		t.Fatalf("audit: %d events, %d fired, violations %+v", rep.Events, rep.Fired, rep.Violations)
	}
}

// The peer at a tiny size, as the scenarios run it: task-spooler's throughput,
// start and memory figures are there and positive, and stopping it leaves none of
// its processes or files.
func TestTaskSpoolerPeerFigures(t *testing.T) {
	path, err := exec.LookPath("tsp")
	if err != nil {
		t.Skip("task-spooler is not installed (no tsp in PATH)")
	}
	r := &runner{opts: Options{Progress: io.Discard}, root: t.TempDir(), tsp: path, size: quickSizes}
	r.size.concurrent = 3
	t.Cleanup(func() { _ = sweep(r.root) }) // on a failure too, before the directory's removal
	ctx := context.Background()
	peer, err := r.startTSP(ctx, "test", 4)
	if err != nil {
		t.Fatal(err)
	}
	rate, err := peer.rate(ctx, 10)
	if err != nil || rate <= 0 {
		t.Errorf("throughput: %v tasks/s, %v", rate, err)
	}
	started, err := peer.start(ctx)
	if err != nil || started <= 0 {
		t.Errorf("start: %v, %v", started, err)
	}
	peer.stop()
	var s Scenario
	mem, err := peerMemory(ctx, r, &s)
	if err != nil {
		t.Fatal(err)
	}
	if rss, pss := mem.perTask(); mem.tasks != 3 || rss <= 0 || pss <= 0 || len(s.Notes) > 0 {
		t.Errorf("memory: %d sleeps, %v MiB RSS and %v MiB PSS per sleep; notes %q", mem.tasks, rss, pss, s.Notes)
	}
	if left := marked(r.root); len(left) > 0 {
		t.Errorf("processes of the peer left after its stop: %v", left)
	}
	if entries, _ := os.ReadDir(r.root); len(entries) > 0 {
		t.Errorf("files of the peer left after its stop: %v", entries)
	}
}

// The report carries the peer and the machine's process-start cost, which its
// ratios against the peer are read beside.
func TestReportCarriesThePeer(t *testing.T) {
	s := Scenario{Name: "throughput"}
	s.compare("tasks", "tasks/s", Stat{N: 1, Median: 100}, "plain", Stat{N: 1, Median: 400}).
		against("tsp -S 64", Stat{N: 1, Median: 200})
	rep := &Report{Peer: "task-spooler 1.0.1", Scenarios: []Scenario{s}, Machine: Machine{ProcessStart: ProcessStart{CPU: 1.25, Wall: 2.5}}}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Peer      string `json:"peer"`
		Scenarios []struct {
			Results []struct {
				Peer struct {
					Name  string  `json:"name"`
					Stat  Stat    `json:"stat"`
					Ratio float64 `json:"ratio"`
				} `json:"peer"`
			} `json:"results"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if p := back.Scenarios[0].Results[0].Peer; back.Peer == "" || p.Name != "tsp -S 64" || p.Stat.Median != 200 || p.Ratio != 0.5 {
		t.Errorf("the JSON report's peer: %s", data)
	}
	var text strings.Builder
	rep.Print(&text)
	for _, want := range []string{"peer: task-spooler 1.0.1", "ratio to peer", "peer: tsp -S 64", "process start: a process start (bash -c true) costs 1.25 ms of CPU, 2.50 ms wall"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the printed report has no %q:\n%s", want, text.String())
		}
	}
}

// The latency baseline of a command that prints writes the output's last chunk, as
// the worker flushes it, before the three appends of the wake-up's path; the plain
// baseline writes the three alone.
func TestTheRawChainOfACommandThatPrintsWritesItsOutputFirst(t *testing.T) {
	ctx := context.Background()
	raw, err := startRawJetStream(ctx, t.TempDir(), false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.stop()
	path, err := wakeupPath()
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		stream, err := raw.js[0].Stream(ctx, rawStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			msg, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			kind := msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:]
			if strings.HasPrefix(msg.Subject, rawPrefix+".log.") {
				kind = "log:" + string(msg.Data) + ":" + msg.Header.Get(events.LogEOFHeader)
			}
			got = append(got, kind)
		}
		return got
	}
	if _, err := rawChain(ctx, raw.js[0], path, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rawChain(ctx, raw.js[0], path, []byte("printed\n")); err != nil {
		t.Fatal(err)
	}
	want := []string{"0", "1", "2", "log:printed\n:1", "0", "1", "2"}
	if got := subjects(); !slices.Equal(got, want) {
		t.Fatalf("the raw stream holds %q, want %q", got, want)
	}
}

// The burst scenario's RSS is settled once its last samples stop moving, not
// while it still falls or rises by more than 1%.
func TestSettledWaitsUntilTheRSSStopsMoving(t *testing.T) {
	const mb = 1 << 20
	for _, c := range []struct {
		name    string
		samples []int64
		want    bool
	}{
		{"too few samples", []int64{100 * mb, 100 * mb}, false},
		{"flat", []int64{100 * mb, 100 * mb, 100 * mb, 100 * mb}, true},
		{"still falling", []int64{130 * mb, 120 * mb, 110 * mb, 100 * mb}, false},
		{"fell, then flat", []int64{130 * mb, 100 * mb, 100 * mb, 100 * mb, 100 * mb}, true},
		{"within 1%", []int64{100_000_000, 99_500_000, 99_200_000, 99_100_000}, true},
		{"rising", []int64{100 * mb, 102 * mb, 104 * mb, 106 * mb}, false},
	} {
		if got := settled(c.samples, 3); got != c.want {
			t.Errorf("%s: settled(%v, 3) = %v, want %v", c.name, c.samples, got, c.want)
		}
	}
}

// The machine's CPU counts work done meanwhile as busy: a child that spins for
// 300 ms of its own CPU shows up, per item, in the busy figure.
func TestMachineUseCountsTheCPUOfWorkDone(t *testing.T) {
	var m machineUse
	var spun time.Duration
	err := m.measure(2, func() error {
		cmd := exec.Command("sh", "-c", `end=$(($(date +%s%N) + 300000000)); while [ "$(date +%s%N)" -lt $end ]; do :; done`)
		err := cmd.Run()
		spun = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Ticks of 10 ms, and the child's own account of its CPU in the same ticks.
	if got, want := m.busy[0]*2, ms(spun)-20; len(m.busy) != 1 || got < want {
		t.Fatalf("busy %v ms per item of 2 for a child that used %v: want at least %.0f ms in all", m.busy, spun, want)
	}
	if len(m.idle) != 1 || m.idle[0] < 0 {
		t.Fatalf("idle %v", m.idle)
	}
}
