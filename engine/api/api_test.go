package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/projections"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noFleet is an engine without workers.
type noFleet struct{}

func (noFleet) Workers() []engine.WorkerStatus { return nil }
func (noFleet) Waiting(engine.State) string    { return "" }

// serve starts the API of an engine on a fresh JetStream server and returns the
// server and its event store.
func serve(t *testing.T) (*eventstest.Server, *events.JetStreamStore) {
	t.Helper()
	return serveWith(t, func(s events.Store) events.Store { return s })
}

// serveWith is serve with the engine appending through wrap(store).
func serveWith(t *testing.T, wrap func(events.Store) events.Store) (*eventstest.Server, *events.JetStreamStore) {
	t.Helper()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	proj := projections.New(store, nil, engine.Base{})
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proj.Stop)
	nc, _ := srv.Connect(t)
	s, err := api.Serve(nc, engine.NewService(wrap(store), "engine-1", engine.Base{}), proj, noFleet{}, store, nil, "0.0.0-test", engine.Base{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	// Once the server has the service's subscriptions, every client finds it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return srv, store
}

// Registrations are answered concurrently: identical ones, raced from several
// clients, still arm one task, and every client is told its id.
func TestConcurrentRegistrationsWithOneKeyArmOnce(t *testing.T) {
	t.Parallel()
	srv, store := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const clients, each = 4, 8
	type result struct {
		reply api.Registered
		err   error
	}
	results := make(chan result, clients*each*2)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		nc, _ := srv.Connect(t)
		client := api.NewClient(nc)
		for i := range each {
			wg.Go(func() {
				<-start
				reply, err := client.Register(ctx, []byte(`{"command":"deploy","idempotency_key":"once"}`))
				results <- result{reply, err}
				// Other tasks registered at the same time are armed too.
				other := fmt.Sprintf(`{"command":"true","idempotency_key":"other-%d-%d"}`, c, i)
				reply, err = client.Register(ctx, []byte(other))
				if err == nil && !reply.Created {
					err = fmt.Errorf("%s: not created", other)
				}
				results <- result{api.Registered{}, err}
			})
		}
	}
	close(start)
	wg.Wait()
	close(results)
	ids := map[string]bool{}
	created := 0
	for r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.reply.ID == "" {
			continue
		}
		ids[r.reply.ID] = true
		if r.reply.Created {
			created++
		}
	}
	if len(ids) != 1 || created != 1 {
		t.Fatalf("the same key gave %d ids, %d created; want 1 and 1", len(ids), created)
	}
	for id := range ids {
		history, err := store.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(history) != 1 || history[0].Type != events.TypeArmed {
			t.Fatalf("history of the keyed task: %+v, want one armed event", history)
		}
	}
	if last, err := store.LastSeq(ctx); err != nil || last != 1+clients*each {
		t.Fatalf("the stream holds %d events (%v), want %d", last, err, 1+clients*each)
	}
}

// meetingStore holds every append until n of them are waiting together.
type meetingStore struct {
	events.Store
	arrived chan struct{}
	met     chan struct{}
	once    sync.Once
	n       int
}

func (s *meetingStore) Append(ctx context.Context, ev events.Event, expect uint64) (uint64, error) {
	s.arrived <- struct{}{}
	if len(s.arrived) == s.n {
		s.once.Do(func() { close(s.met) })
	}
	select {
	case <-s.met:
	case <-ctx.Done():
		return 0, fmt.Errorf("no other append came while this one waited: %w", ctx.Err())
	}
	return s.Store.Append(ctx, ev, expect)
}

// One registration's append does not hold up the others: they are all waiting for
// their appends at once, or none of them is answered.
func TestRegistrationsWaitForTheirAppendsTogether(t *testing.T) {
	t.Parallel()
	const n = 4
	meeting := &meetingStore{arrived: make(chan struct{}, n), met: make(chan struct{}), n: n}
	srv, _ := serveWith(t, func(s events.Store) events.Store {
		meeting.Store = s
		return meeting
	})
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := client.Register(ctx, []byte(`{"command":"true"}`))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// A registration answered from its own goroutine carries micro's error headers.
func TestConcurrentRegistrationErrorsCarryTheServiceHeaders(t *testing.T) {
	t.Parallel()
	srv, store := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := srv.Conn.RequestWithContext(ctx, api.SubjectRegister, []byte(`{"command":"true","colour":"red"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := msg.Header.Get(micro.ErrorCodeHeader), "400"; got != want {
		t.Errorf("error code header %q, want %q", got, want)
	}
	if msg.Header.Get(micro.ErrorHeader) == "" {
		t.Error("no error header")
	}
	var reply struct {
		Error *api.Error `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error == nil || reply.Error.Field != "colour" {
		t.Fatalf("reply %s (%v), want an error naming colour", msg.Data, err)
	}
	if last, err := store.LastSeq(ctx); err != nil || last != 0 {
		t.Fatalf("the stream holds %d events (%v), want none", last, err)
	}
}

// A list for a state that does not exist is refused, naming the field, rather than
// answered with nothing; archived tasks can be listed.
func TestListRefusesAStateThatIsNone(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t)
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		q     engine.ListQuery
		field string
	}{
		{engine.ListQuery{Phase: "finished"}, "state"},
		{engine.ListQuery{Phase: "Fired"}, "state"},
		{engine.ListQuery{Limit: -1}, "limit"},
	} {
		_, err := client.List(ctx, tc.q)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Code != 400 || apiErr.Field != tc.field {
			t.Errorf("List(%+v) = %v, want a 400 naming %s", tc.q, err, tc.field)
		}
	}
	for _, phase := range engine.Phases {
		if _, err := client.List(ctx, engine.ListQuery{Phase: phase}); err != nil {
			t.Errorf("List(%s) = %v", phase, err)
		}
	}
}
