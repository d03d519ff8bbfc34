package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/projections"
)

// parts are what every long-running part of an engine is built from.
type parts struct {
	srv      *eventstest.Server
	store    *events.JetStreamStore
	inbox    *events.JetStreamInbox
	liveness *events.Liveness
	targets  *events.Targets
	archive  *events.Archive
	reader   fixedReader
}

// fixedReader is a reader of no task: a projector following the stream would
// start goroutines of its own while a part runs.
type fixedReader struct{}

func (fixedReader) Task(string) (engine.State, bool)                 { return engine.State{}, false }
func (fixedReader) Outcome(string) (engine.State, bool)              { return engine.State{}, false }
func (fixedReader) List(engine.ListQuery) ([]engine.State, int)      { return nil, 0 }
func (fixedReader) Settled(time.Time) []engine.State                 { return nil }
func (fixedReader) EachUnfinished(engine.Phase, func(*engine.State)) {}
func (fixedReader) WaitFor(context.Context, uint64) error            { return nil }
func (fixedReader) MatchIDs(func(string) bool, int) ([]string, int) {
	return nil, 0
}
func (fixedReader) ListAfter(engine.ListQuery, time.Time, string) ([]engine.State, int) {
	return nil, 0
}

func openParts(t *testing.T) parts {
	t.Helper()
	b := setup(t)
	ctx := context.Background()
	p := parts{srv: b.srv, store: b.store, inbox: b.inbox}
	var err error
	if p.liveness, err = events.OpenLiveness(ctx, b.srv.JS, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	if p.targets, err = events.OpenTargets(ctx, b.srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	if p.archive, err = events.OpenArchive(ctx, b.srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	// A request on the connection starts the goroutine of its replies, which
	// lives as long as the connection: started now, it is no part's leak.
	if _, err := b.srv.Conn.Request("bgtask.nobody", nil, 10*time.Millisecond); err == nil {
		t.Fatal("a request nobody serves was answered")
	}
	return p
}

// Every long-running part follows engine.Component: Stop before Start and twice
// is harmless, a second Start fails, and once stopped nothing of it runs.
func TestEveryPartFollowsTheLifecycle(t *testing.T) {
	cases := []struct {
		name string
		make func(p parts) engine.Component
	}{
		{"dispatcher", func(p parts) engine.Component {
			return engine.NewDispatcher(p.store, p.inbox, p.reader, engineWriter, 3, engine.Base{})
		}},
		{"timers", func(p parts) engine.Component {
			return engine.NewTimers(p.store, p.reader, engineWriter, engine.Base{})
		}},
		{"dependencies", func(p parts) engine.Component {
			return engine.NewDependencies(p.store, p.reader, engineWriter, func() {}, engine.Base{})
		}},
		{"leases", func(p parts) engine.Component {
			return engine.NewLeases(p.store, p.reader, p.liveness, engineWriter, engine.Base{})
		}},
		{"pusher", func(p parts) engine.Component {
			return engine.NewPusher(p.store, p.reader, sinks.New([]byte("a test secret of enough bytes")),
				engine.Engine{Writer: engineWriter, Instance: "i"}, 0, engine.Base{})
		}},
		{"archiver", func(p parts) engine.Component {
			return engine.NewArchiver(p.store, p.store, p.archive, p.reader, engineWriter, time.Hour, engine.Base{})
		}},
		{"scheduler", func(p parts) engine.Component {
			return engine.NewScheduler(p.reader, p.liveness, func(ctx context.Context, worker string, o events.Offer) (events.OfferReply, error) {
				return events.OfferTask(ctx, p.srv.Conn, worker, o)
			}, engine.Base{})
		}},
		{"projector", func(p parts) engine.Component {
			return projections.New(p.store, nil, engine.Base{})
		}},
		{"targets watch", func(p parts) engine.Component {
			return p.targets.Watch(func(string, events.TargetState) {}, func(string, error) {})
		}},
		{"api", func(p parts) engine.Component {
			return api.New(p.srv.Conn, engine.NewService(p.store, engineWriter, engine.Base{}), p.reader, noFleet{}, p.store, p.archive, "0.0.0-test", engine.Base{})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := openParts(t)
			unstarted := c.make(p)
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				unstarted.Stop()
				unstarted.Stop()
			}()
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("Stop before Start does not return")
			}

			before := goleak.IgnoreCurrent()
			part := c.make(p)
			ctx, cancel := context.WithCancel(context.Background())
			if err := part.Start(ctx); err != nil {
				t.Fatal(err)
			}
			cancel() // the start's context ends: the part runs on until Stop
			if err := part.Start(context.Background()); err == nil {
				t.Error("a second Start succeeded")
			} else if c.name != "targets watch" && !errors.Is(err, engine.ErrStarted) {
				t.Errorf("a second Start: %v, want ErrStarted", err)
			}
			part.Stop()
			part.Stop()
			goleak.VerifyNone(t, append(serverCleanup, before)...)
		})
	}
}

// serverCleanup are the embedded NATS server's own goroutines of a consumer a
// stopped part deleted, or left to expire when the deletion did not answer in
// time on a busy machine: the server ends them, not the part.
var serverCleanup = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*consumer).processInboundNextMsgReqs"),
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*consumer).processInboundAcks"),
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*consumer).loopAndGatherMsgs"),
}

// noFleet is a fleet of no worker.
type noFleet struct{}

func (noFleet) Workers() []engine.WorkerStatus { return nil }
func (noFleet) Waiting(engine.State) string    { return "" }
