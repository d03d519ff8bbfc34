package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
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
	srv, store, _ := serveWith(t, serving{})
	return srv, store
}

// serving says what serveWith changes in the engine it starts.
type serving struct {
	// store wraps the store the engine appends through.
	store func(events.Store) events.Store
	// queries wraps the projection the API answers from.
	queries func(*projections.Projector) api.Queries
	// server configures the JetStream server.
	server func(*server.Options)
}

// serveWith is serve with the changes with says; it returns the projection the
// API answers from too.
func serveWith(t *testing.T, with serving) (*eventstest.Server, *events.JetStreamStore, *projections.Projector) {
	t.Helper()
	var configure []func(*server.Options)
	if with.server != nil {
		configure = append(configure, with.server)
	}
	srv := eventstest.Run(t, configure...)
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
	var appends events.Store = store
	if with.store != nil {
		appends = with.store(store)
	}
	var queries api.Queries = proj
	if with.queries != nil {
		queries = with.queries(proj)
	}
	nc, _ := srv.Connect(t)
	s := api.New(nc, engine.NewService(appends, "engine-1", engine.Base{}), queries, noFleet{}, store, nil, "0.0.0-test", engine.Base{})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	// Once the server has the service's subscriptions, every client finds it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return srv, store, proj
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
	srv, _, _ := serveWith(t, serving{store: func(s events.Store) events.Store {
		meeting.Store = s
		return meeting
	}})
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

// A list for a state, or another filter's value, that does not exist is refused,
// naming the field, rather than answered with nothing; archived tasks can be listed.
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
		{engine.ListQuery{Status: "finished"}, "status"},
		{engine.ListQuery{Target: "a.b"}, "target"},
		{engine.ListQuery{Kind: "two\nlines"}, "kind"},
		{engine.ListQuery{Labels: map[string]string{"pool": "a b"}}, "labels"},
		{engine.ListQuery{Since: time.Now(), Until: time.Now().Add(-time.Hour)}, "until"},
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

// registerMany registers n tasks from specs through the API, from 8 clients at
// once, and returns their ids.
func registerMany(t *testing.T, srv *eventstest.Server, n int, spec func(i int) string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	const clients = 8
	for c := range clients {
		nc, _ := srv.Connect(t)
		client := api.NewClient(nc)
		wg.Go(func() {
			for i := c; i < n; i += clients {
				reply, err := client.Register(ctx, []byte(spec(i)))
				if err != nil {
					errs <- fmt.Errorf("register %d: %w", i, err)
					return
				}
				ids[i] = reply.ID
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ids
}

// listed waits until the projection the API lists from holds n tasks.
func listed(t *testing.T, client *api.Client, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d tasks listed", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		page, err := client.ListPage(ctx, api.ListRequest{ListQuery: engine.ListQuery{Limit: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return page.Total >= n
	})
}

// listAll lists every task through the client's paging and checks that it got
// each of ids once, newest first.
func listAll(t *testing.T, client *api.Client, ids []string) {
	t.Helper()
	listed(t, client, len(ids))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := client.List(ctx, engine.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if reply.Total != len(ids) || len(reply.Tasks) != len(ids) || reply.NextCursor != "" {
		t.Fatalf("listed %d of %d tasks (next %q), want all %d", len(reply.Tasks), reply.Total, reply.NextCursor, len(ids))
	}
	seen := map[string]bool{}
	for _, task := range reply.Tasks {
		seen[task.ID] = true
	}
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("task %s not listed", id)
		}
	}
	if !slices.IsSortedFunc(reply.Tasks, func(a, b api.TaskView) int { return b.ArmedAt.Compare(a.ArmedAt) }) {
		t.Error("not newest first")
	}
}

// A list of more tasks than one message can carry comes in pages, each within the
// connection's max payload, and the client gets them all.
func TestListOfMoreThanOneMessageComesInPages(t *testing.T) {
	testkit.FullOnly(t)
	t.Parallel()
	srv, _ := serve(t)
	client := api.NewClient(srv.Conn)
	// Each with some routing data, as an agent's tasks have: 1,500 of them are
	// more than a MiB.
	origin := `{"session":"` + strings.Repeat("s", 500) + `"}`
	ids := registerMany(t, srv, 1500, func(i int) string { return fmt.Sprintf(`{"command":"make test-%d","origin":%s}`, i, origin) })
	listed(t, client, len(ids))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := srv.Conn.RequestWithContext(ctx, api.SubjectList, []byte(`{"limit":0}`))
	if err != nil {
		t.Fatal(err)
	}
	var first api.ListReply
	if err := json.Unmarshal(msg.Data, &first); err != nil {
		t.Fatal(err)
	}
	if first.Total != 1500 || first.NextCursor == "" || len(first.Tasks) == 0 || len(first.Tasks) == 1500 {
		t.Fatalf("first page: %d tasks of %d, next %q; want part of 1500 and a cursor", len(first.Tasks), first.Total, first.NextCursor)
	}
	if max := srv.Conn.MaxPayload(); int64(len(msg.Data)) > max {
		t.Fatalf("a page of %d bytes, over the max payload %d", len(msg.Data), max)
	}
	listAll(t, client, ids)
}

// Large tasks page too: twenty of 60 KB are more than one message.
func TestListOfLargeTasksComesInPages(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t)
	env := `{"NOTES":"` + strings.Repeat("n", 60<<10) + `"}`
	ids := registerMany(t, srv, 20, func(i int) string { return fmt.Sprintf(`{"command":"make test-%d","env":%s}`, i, env) })
	listAll(t, api.NewClient(srv.Conn), ids)
	// A limit is kept across pages.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := api.NewClient(srv.Conn).List(ctx, engine.ListQuery{Limit: 19})
	if err != nil || len(reply.Tasks) != 19 || reply.Total != 20 {
		t.Fatalf("List(limit 19) = %d tasks of %d, %v", len(reply.Tasks), reply.Total, err)
	}
}

// Paging while tasks are registered neither skips nor repeats a task: a page
// continues after the last task of the page before, and new tasks are newer.
func TestListPagesNeitherSkipNorRepeatUnderRegistration(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t)
	before := registerMany(t, srv, 300, func(i int) string { return fmt.Sprintf(`{"command":"make test-%d"}`, i) })
	listed(t, api.NewClient(srv.Conn), len(before))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var registering sync.WaitGroup
	registering.Go(func() {
		nc, _ := srv.Connect(t)
		client := api.NewClient(nc)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := client.Register(ctx, []byte(`{"command":"late"}`)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	client := api.NewClient(srv.Conn)
	seen := map[string]int{}
	var listed []api.TaskView
	req := api.ListRequest{ListQuery: engine.ListQuery{Limit: 7}}
	for {
		page, err := client.ListPage(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range page.Tasks {
			seen[task.ID]++
		}
		listed = append(listed, page.Tasks...)
		if page.NextCursor == "" {
			break
		}
		if len(page.Tasks) != 7 {
			t.Fatalf("a page of %d tasks before the last, want 7", len(page.Tasks))
		}
		req.Cursor = page.NextCursor
	}
	close(stop)
	registering.Wait()
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("task %s listed %d times", id, n)
		}
	}
	for _, id := range before {
		if seen[id] != 1 {
			t.Fatalf("task %s, registered before the paging, not listed", id)
		}
	}
	if !slices.IsSortedFunc(listed, func(a, b api.TaskView) int { return b.ArmedAt.Compare(a.ArmedAt) }) {
		t.Error("pages not newest first")
	}
}

// A cursor that no list gave is refused, naming the field.
func TestListRefusesABadCursor(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []string{"nope", "bm9wZQ", "MjAyNi0xMi0wMVQwOTowMDowMFo"} {
		_, err := api.NewClient(srv.Conn).ListPage(ctx, api.ListRequest{Cursor: c})
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Code != 400 || apiErr.Field != "cursor" {
			t.Errorf("ListPage(cursor %q) = %v, want a 400 naming cursor", c, err)
		}
	}
}

// A reply that one message cannot carry is an error object, never silence: a
// task bigger than the max payload, asked for alone, listed, or its history.
func TestRepliesTooLargeForAMessageAreErrors(t *testing.T) {
	t.Parallel()
	srv, store, proj := serveWith(t, serving{server: func(o *server.Options) { o.MaxPayload = 128 << 10 }})
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := client.Register(ctx, []byte(`{"command":"make # `+strings.Repeat("n", 60<<10)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	// Its run ends with a long line of output: the task's view holds both.
	state, err := engine.Load(ctx, store, reg.ID)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []engine.Command{
		engine.Spawn{Host: "h"},
		engine.Exit{Run: events.Exited{ExitCode: 0, Tail: []string{strings.Repeat("t", 70<<10)}, StartedAt: now, EndedAt: now}},
	} {
		ev, err := engine.Decide(state, c, engine.Meta{Writer: "worker-1", Now: now})
		if err != nil {
			t.Fatal(err)
		}
		seq, err := store.Append(ctx, ev, state.Seq)
		if err != nil {
			t.Fatal(err)
		}
		if state, err = engine.Apply(state, events.Record{Seq: seq, Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	tooLarge := func(what string, err error, inMessage string) {
		t.Helper()
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Code != 413 || !strings.Contains(apiErr.Message, inMessage) {
			t.Fatalf("%s: %v, want a 413 error saying %q", what, err, inMessage)
		}
	}
	// Once the projection has the exit, the task is too large to show.
	if err := proj.WaitFor(ctx, state.Seq); err != nil {
		t.Fatal(err)
	}
	view, err := client.Get(ctx, reg.ID)
	if err == nil {
		t.Fatalf("got the %s task whole, %d bytes of tail", view.Phase, len(view.Run.Tail[0]))
	}
	tooLarge("get", err, "max_payload")
	_, err = client.History(ctx, reg.ID)
	tooLarge("history", err, "max_payload")
	// A newer task comes first, in a page of its own; the page after it is the
	// error that names the large task.
	small, err := client.Register(ctx, []byte(`{"command":"true"}`))
	if err != nil {
		t.Fatal(err)
	}
	// A get waits for the projection to have the task; a list answers with what
	// the projection has.
	if _, err := client.Get(ctx, small.ID); err != nil {
		t.Fatal(err)
	}
	page, err := client.ListPage(ctx, api.ListRequest{})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != small.ID || page.NextCursor == "" {
		t.Fatalf("first page: %+v, %v; want the small task and a cursor", page, err)
	}
	_, err = client.List(ctx, engine.ListQuery{})
	tooLarge("list", err, "task "+reg.ID)
}

// The same idempotency key with another spec is refused with a 409 that names the
// fields; the same spec again still names the task.
func TestRegisterRefusesAKeyWithAnotherSpec(t *testing.T) {
	t.Parallel()
	srv, store := serve(t)
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	first := `{"command":"echo first","cwd":"` + dir + `","deadline":"10m","idempotency_key":"k-1"}`
	reg, err := client.Register(ctx, []byte(first))
	if err != nil || !reg.Created {
		t.Fatalf("Register = %+v, %v", reg, err)
	}
	_, err = client.Register(ctx, []byte(`{"command":"echo second","cwd":"`+dir+`","deadline":"10m","idempotency_key":"k-1","kind":"x"}`))
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Code != 409 || apiErr.Field != "idempotency_key" ||
		!strings.Contains(apiErr.Message, reg.ID) || !strings.Contains(apiErr.Message, "command, kind") {
		t.Fatalf("another spec under the key: %v, want a 409 naming the task, command and kind", err)
	}
	again, err := client.Register(ctx, []byte(first))
	if err != nil || again.Created || again.ID != reg.ID {
		t.Fatalf("the same spec again = %+v, %v; want %s, not created", again, err, reg.ID)
	}
	if last, err := store.LastSeq(ctx); err != nil || last != 1 {
		t.Fatalf("the stream holds %d events (%v), want 1", last, err)
	}
}

// TestRequestsRefuseWhatDecodingWouldChange: a request with a key given twice, or a
// reason that is not UTF-8, is refused with the field named, and the task is left
// as it was.
func TestRequestsRefuseWhatDecodingWouldChange(t *testing.T) {
	t.Parallel()
	srv, store := serve(t)
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := client.Register(ctx, []byte(`{"command":"sleep 100"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, request, field string }{
		{"a reason that is not UTF-8", `{"id":"` + reg.ID + "\",\"reason\":\"a\xffb\"}", "reason"},
		{"an id given twice", `{"id":"` + reg.ID + `","id":"` + reg.ID + `"}`, "id"},
		{"an oversized reason", `{"id":"` + reg.ID + `","reason":"` + strings.Repeat("r", engine.MaxCancelReasonBytes+1) + `"}`, "reason"},
	} {
		msg, err := srv.Conn.RequestWithContext(ctx, api.SubjectCancel, []byte(tc.request))
		if err != nil {
			t.Fatal(err)
		}
		var reply struct{ Error *api.Error }
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error == nil ||
			reply.Error.Code != 400 || reply.Error.Field != tc.field {
			t.Errorf("%s: reply %s, want a 400 naming %s", tc.name, msg.Data, tc.field)
		}
	}
	last, err := store.Last(ctx, reg.ID)
	if err != nil || last.Type != events.TypeArmed {
		t.Fatalf("the task's last event is %v (%v), want it still armed", last.Type, err)
	}
}

// TestReadersReadWhatRegistrationAccepts: a task with an origin as deep and as large
// as registration accepts is listed, shown and decoded by the client.
func TestReadersReadWhatRegistrationAccepts(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t)
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deep := strings.Repeat(`{"a":`, engine.MaxJSONDepth-1) + `"` + strings.Repeat("o", engine.MaxOriginBytes-6*engine.MaxJSONDepth) + `"` + strings.Repeat("}", engine.MaxJSONDepth-1)
	var ids []string
	for _, origin := range []string{deep, strings.Repeat("[", engine.MaxJSONDepth) + strings.Repeat("]", engine.MaxJSONDepth)} {
		reg, err := client.Register(ctx, []byte(`{"command":"true","origin":`+origin+`}`))
		if err != nil {
			t.Fatalf("register an origin at the limits: %v", err)
		}
		ids = append(ids, reg.ID)
	}
	for _, id := range ids {
		v, err := client.Get(ctx, id)
		if err != nil || v.ID != id || len(v.Spec.Origin) == 0 {
			t.Fatalf("get %s: %v", id, err)
		}
	}
	if reply, err := client.List(ctx, engine.ListQuery{}); err != nil || len(reply.Tasks) != len(ids) {
		t.Fatalf("list: %d tasks, %v; want %d", len(reply.Tasks), err, len(ids))
	}
}

// A server stopped before it started serves, once started, as one never stopped:
// its registrations still wait for their appends together.
func TestAServerStoppedBeforeItsStartServesRegistrationsTogether(t *testing.T) {
	t.Parallel()
	const n = 4
	srv := eventstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	proj := projections.New(store, nil, engine.Base{})
	if err := proj.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proj.Stop)
	meeting := &meetingStore{Store: store, arrived: make(chan struct{}, n), met: make(chan struct{}), n: n}
	nc, _ := srv.Connect(t)
	s := api.New(nc, engine.NewService(meeting, "engine-1", engine.Base{}), proj, noFleet{}, store, nil, "0.0.0-test", engine.Base{})
	s.Stop()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	client := api.NewClient(srv.Conn)
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

// laggingQueries is a projection that has not yet applied the registration of
// the task behind, until it is waited for.
type laggingQueries struct {
	*projections.Projector
	mu     sync.Mutex
	behind string
}

func (q *laggingQueries) lagBehind(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.behind = id
}

func (q *laggingQueries) WaitFor(ctx context.Context, seq uint64) error {
	q.lagBehind("")
	return q.Projector.WaitFor(ctx, seq)
}

func (q *laggingQueries) MatchIDs(match func(string) bool, limit int) ([]string, int) {
	q.mu.Lock()
	behind := q.behind
	q.mu.Unlock()
	return q.Projector.MatchIDs(func(id string) bool { return id != behind && match(id) }, limit)
}

// A part of an id is matched against every task registered before it was
// asked for: one the projection has not applied yet makes it ambiguous, where
// the tasks already applied would have named one task, the wrong one maybe.
func TestAPartOfAnIDMatchesTasksJustRegistered(t *testing.T) {
	t.Parallel()
	lagging := &laggingQueries{}
	srv, _, _ := serveWith(t, serving{queries: func(p *projections.Projector) api.Queries {
		lagging.Projector = p
		return lagging
	}})
	c := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for _, spec := range []string{`{"command":"sleep 61"}`, `{"command":"sleep 62"}`} {
		reg, err := c.Register(ctx, []byte(spec))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, reg.ID)
	}
	a, b := ids[0], ids[1]
	shared := 0
	for shared < len(a) && a[shared] == b[shared] {
		shared++
	}
	if shared < api.MinIDPart {
		t.Fatalf("%s and %s, registered together, share only %q", a, b, a[:shared])
	}
	lagging.lagBehind(b)
	_, err := c.Get(ctx, a[:shared])
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Code != api.CodeAmbiguous || len(apiErr.Matches) != 2 {
		t.Errorf("get %q, a start of %s and of %s not yet applied: %v, want it ambiguous", a[:shared], a, b, err)
	}
}

// A task is named by its whole id, a unique start of it, or its end after "…" as
// the dashboard shows it, at every endpoint that takes an id; a start several
// ids have is an error that lists them.
func TestAPartOfAnIDNamesItsTask(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t)
	nc, _ := srv.Connect(t)
	c := api.NewClient(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	register := func(spec string) string {
		t.Helper()
		reg, err := c.Register(ctx, []byte(spec))
		if err != nil {
			t.Fatal(err)
		}
		return reg.ID
	}
	keyed := register(`{"command":"sleep 60","idempotency_key":"named-by-a-part"}`)
	// Ids made without a key are UUIDv7: registered together, they share a start.
	a, b := register(`{"command":"sleep 61"}`), register(`{"command":"sleep 62"}`)
	shared := 0
	for shared < len(a) && a[shared] == b[shared] {
		shared++
	}
	if shared < api.MinIDPart {
		t.Fatalf("%s and %s, registered together, share only %q", a, b, a[:shared])
	}
	for _, ref := range []string{keyed, keyed[:6], keyed[:13], "…" + keyed[len(keyed)-12:], "..." + keyed[len(keyed)-6:]} {
		if got, err := c.Get(ctx, ref); err != nil || got.ID != keyed {
			t.Errorf("get %q: %s, %v; want %s", ref, got.ID, err, keyed)
		}
	}
	fails := func(what string, err error, code int, field string, says ...string) {
		t.Helper()
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || apiErr.Code != code || apiErr.Field != field {
			t.Errorf("%s: %v, want a %d naming %q", what, err, code, field)
			return
		}
		for _, s := range says {
			if !strings.Contains(apiErr.Message, s) {
				t.Errorf("%s: %q does not say %q", what, apiErr.Message, s)
			}
		}
	}
	_, err := c.Get(ctx, a[:shared])
	fails("a start of two ids", err, api.CodeAmbiguous, "id", a, b)
	var ambiguous *api.Error
	if want := []string{a, b}; errors.As(err, &ambiguous) && !slices.Equal(ambiguous.Matches, slices.Sorted(slices.Values(want))) {
		t.Errorf("a start of two ids matches %v, want %v", ambiguous.Matches, want)
	}
	_, err = c.Get(ctx, keyed[:5])
	fails("5 characters", err, 400, "id", "too short")
	_, err = c.Get(ctx, "…"+keyed[len(keyed)-5:])
	fails("an end of 5 characters", err, 400, "id", "too short")
	_, err = c.Get(ctx, "zzzzzzzz")
	fails("a start of no id", err, 404, "id", `"zzzzzzzz"`)

	// Each endpoint that takes an id.
	if got, err := c.Pause(ctx, a[:shared+1]); err != nil || got.ID != a || !got.Paused {
		t.Errorf("pause %q: %s paused %v, %v; want %s paused", a[:shared+1], got.ID, got.Paused, err, a)
	}
	if got, err := c.Resume(ctx, a[:shared+1]); err != nil || got.ID != a || got.Paused {
		t.Errorf("resume %q: %s paused %v, %v; want %s resumed", a[:shared+1], got.ID, got.Paused, err, a)
	}
	if got, err := c.Complete(ctx, api.CompleteRequest{ID: b[:shared+1]}); err != nil || got.ID != b {
		t.Errorf("complete %q: %s, %v; want %s", b[:shared+1], got.ID, err, b)
	}
	if got, err := c.Cancel(ctx, keyed[:8], "by a part"); err != nil || got.ID != keyed || got.Phase != engine.PhaseCancelled {
		t.Errorf("cancel %q: %s %s, %v; want %s cancelled", keyed[:8], got.ID, got.Phase, err, keyed)
	}
	// Cancelled, the task is settled: kept as its summary, and found as well.
	if got, err := c.Get(ctx, keyed[:8]); err != nil || got.ID != keyed {
		t.Errorf("get %q once settled: %s, %v", keyed[:8], got.ID, err)
	}
	h, err := c.History(ctx, keyed[:8])
	if err != nil || len(h.Events) == 0 || h.Events[0].TaskID != keyed {
		t.Errorf("history %q: %d events, %v", keyed[:8], len(h.Events), err)
	}
}
