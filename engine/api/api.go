// Package api is bgtask's request/reply API over NATS: a NATS micro service (so
// `nats micro ls` finds it) with one endpoint per operation, and the client that the
// CLI and programs use to call it.
//
// Every reply is JSON. A failed request gets an error object that names the field
// and the reason, and the micro error headers:
//
//	{"error": {"code": 400, "field": "cwd", "message": "cwd: \"/nope\" does not exist or cannot be read"}}
package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Subjects of the endpoints.
const (
	SubjectRegister = "bgtask.register"
	SubjectCancel   = "bgtask.cancel"
	SubjectGet      = "bgtask.get"
	SubjectList     = "bgtask.list"
	SubjectHistory  = "bgtask.history"
	SubjectWorkers  = "bgtask.workers"
)

// ServiceName is the micro service's name.
const ServiceName = "bgtask"

// Queries is the read side the API serves from.
type Queries interface {
	engine.TaskReader
	// ListAfter lists the tasks that match q, newest first, after the task armed
	// at armedAt with the id afterID (none: from the newest), and counts every
	// task that matches q.
	ListAfter(q engine.ListQuery, armedAt time.Time, afterID string) ([]engine.State, int)
	// WaitFor blocks until the reader has applied every event up to seq.
	WaitFor(ctx context.Context, seq uint64) error
	// MatchIDs returns the first limit ids, in order, of the tasks whose id
	// matches, and how many match.
	MatchIDs(match func(id string) bool, limit int) ([]string, int)
}

// Fleet is what the engine knows of its workers.
type Fleet interface {
	Workers() []engine.WorkerStatus
	// Waiting says why an armed task has not started ("" if it has no reason yet).
	Waiting(st engine.State) string
}

// WorkersReply lists the live workers.
type WorkersReply struct {
	Workers []engine.WorkerStatus `json:"workers"`
}

// TaskView is a task as the API and the CLI show it: its state, with the fields a
// reader looks for first at the top.
type TaskView struct {
	engine.State
	Command     string `json:"command"`
	ExitCode    *int   `json:"exit_code"`
	MatchedLine string `json:"matched_line,omitempty"`
	Result      string `json:"result,omitempty"`
	// Waiting says what an armed task waits for: a worker with its labels, a free slot.
	Waiting string `json:"waiting,omitempty"`
}

// View builds the view of a state: the spec's env shows its names alone
// (engine.Spec.HideEnv), as every view of a task does.
func View(s engine.State) TaskView {
	s.Spec = s.Spec.HideEnv()
	v := TaskView{State: s, Command: s.Spec.CommandLine()}
	if s.Run != nil {
		v.MatchedLine = s.Run.MatchedLine
		if s.Run.HasExitCode() {
			code := s.Run.ExitCode
			v.ExitCode = &code
		}
	}
	if s.Wakeup != nil {
		v.Result = s.Wakeup.Result
	}
	return v
}

// Registered is the reply to a registration.
type Registered struct {
	ID string `json:"id"`
	// Created is false when the idempotency key was registered before with the same
	// spec (the same key with another spec is refused with a 409).
	Created bool `json:"created"`
}

// IDRequest names a task.
type IDRequest struct {
	ID string `json:"id"`
}

// CancelRequest asks to cancel a task.
type CancelRequest struct {
	ID     string `json:"id"`
	Reason string `json:"reason,omitempty"`
}

// ListRequest asks for a page of the tasks, newest first: at most Limit of them
// (0: as many as one reply can carry), after the page whose NextCursor is Cursor.
type ListRequest struct {
	engine.ListQuery
	Cursor string `json:"cursor,omitempty"`
}

// ListReply is a page of the tasks. A reply carries as many tasks as fit in one
// NATS message; NextCursor, when more tasks follow, asks for the next page.
type ListReply struct {
	Tasks []TaskView `json:"tasks"`
	// Total is how many tasks match the query in all pages.
	Total      int    `json:"total"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// HistoryReply is a task's events in order.
type HistoryReply struct {
	Events []events.Record `json:"events"`
}

// Error is the error object of a failed request.
type Error struct {
	Code    int    `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// Matches are the ids a part of an id matched when it names several tasks
	// (CodeAmbiguous): the first of them, in order.
	Matches []string `json:"matches,omitempty"`
}

func (e *Error) Error() string { return e.Message }

type errorReply struct {
	Error *Error `json:"error"`
}

// Archive reads the histories of archived tasks.
type Archive interface {
	Get(ctx context.Context, seq uint64) (events.ArchivedHistory, error)
}

// Server serves the API.
type Server struct {
	svc     *engine.Service
	queries Queries
	fleet   Fleet
	store   events.Store
	archive Archive
	base    engine.Base
	version string
	micro   micro.Service // while it serves
	nc      *nats.Conn

	// schedules serves the schedule endpoints (ServeSchedules).
	schedules *scheduling
	// stats is the custom data of each endpoint's stats (ServeStats).
	stats func() any

	// slots bounds the registrations in flight; running counts them, and once
	// stopping is set no more are handed to goroutines of their own.
	slots    chan struct{}
	mu       sync.Mutex
	started  bool
	stopping bool
	running  sync.WaitGroup
}

// maxRegistering is how many registrations may wait for their appends at once.
// micro calls an endpoint's handler for one request at a time, and an append
// waits for the store's fsync: handled in line, every client's registration
// would queue behind the one append in flight.
const maxRegistering = 32

// requestTimeout bounds the handling of one request.
const requestTimeout = 30 * time.Second

// New returns the server of the API on nc; Start serves it.
func New(nc *nats.Conn, svc *engine.Service, queries Queries, fleet Fleet, store events.Store, archive Archive, version string, base engine.Base) *Server {
	return &Server{
		svc: svc, queries: queries, fleet: fleet, store: store, archive: archive, version: version,
		base: base.WithDefaults(), nc: nc, slots: make(chan struct{}, maxRegistering),
	}
}

// ServeStats makes the stats of the service (`nats micro stats bgtask`) carry
// data() as the custom data of each endpoint: the engine's metrics, which are
// the service's, not one endpoint's. data must not block. Call it before Start.
func (s *Server) ServeStats(data func() any) { s.stats = data }

// Start adds the micro service and its endpoints, which share a queue group, so
// several engines can serve one deployment (the engine.Component contract).
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	started := s.started
	s.started = true
	s.mu.Unlock()
	if started {
		return engine.ErrStarted
	}
	cfg := micro.Config{
		Name:        ServiceName,
		Version:     s.version,
		Description: "bgtask: durable supervisor for background work",
	}
	if stats := s.stats; stats != nil {
		cfg.StatsHandler = func(*micro.Endpoint) any { return stats() }
	}
	m, err := micro.AddService(s.nc, cfg)
	if err != nil {
		return err
	}
	endpoints := []struct {
		name, subject string
		handle        func(context.Context, []byte) (any, error)
		// concurrent: requests are answered from goroutines of their own.
		concurrent bool
	}{
		{"register", SubjectRegister, s.register, true},
		{"rerun", SubjectRerun, s.rerun, true},
		{"cancel", SubjectCancel, s.cancel, false},
		{"get", SubjectGet, s.get, false},
		{"list", SubjectList, s.list, false},
		{"history", SubjectHistory, s.history, false},
		{"workers", SubjectWorkers, s.workers, false},
		{"pause", SubjectPause, s.pause, false},
		{"resume", SubjectResume, s.resume, false},
		{"complete", SubjectComplete, s.complete, false},
		{"consume", SubjectConsume, s.consume, false},
		{"redeliver", SubjectRedeliver, s.redeliver, false},
		{"schedule_add", SubjectScheduleAdd, s.scheduleAdd, false},
		{"schedule_list", SubjectScheduleList, s.scheduleList, false},
		{"schedule_show", SubjectScheduleShow, s.scheduleShow, false},
		{"schedule_pause", SubjectSchedulePause, s.schedulePause, false},
		{"schedule_resume", SubjectScheduleResume, s.scheduleResume, false},
		{"schedule_delete", SubjectScheduleDelete, s.scheduleDelete, false},
		{"schedule_trigger", SubjectScheduleTrigger, s.scheduleTrigger, true},
	}
	for _, ep := range endpoints {
		handle, concurrent := ep.handle, ep.concurrent
		err := m.AddEndpoint(ep.name, micro.ContextHandler(context.WithoutCancel(ctx), func(ctx context.Context, req micro.Request) {
			if concurrent && s.dispatch(ctx, req, handle) {
				return
			}
			ctx, cancel := context.WithTimeout(ctx, requestTimeout)
			defer cancel()
			s.respond(ctx, req, handle)
		}), micro.WithEndpointSubject(ep.subject))
		if err != nil {
			_ = m.Stop()
			return err
		}
	}
	// Serving once Start returns: a client that asks next on a connection of its
	// own finds the endpoints, which the NATS server has after this round trip.
	if err := s.nc.Flush(); err != nil {
		_ = m.Stop()
		return err
	}
	s.mu.Lock()
	s.micro = m
	s.mu.Unlock()
	return nil
}

// Stop stops serving, and returns once every request handed to a goroutine of its
// own is answered.
func (s *Server) Stop() {
	s.mu.Lock()
	m := s.micro
	s.micro = nil
	s.mu.Unlock()
	if m == nil { // not started, or stopped already
		s.running.Wait()
		return
	}
	if err := m.Stop(); err != nil {
		s.base.Logger.Warn("API service not stopped cleanly", "err", err)
	}
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.running.Wait()
}

func (s *Server) respond(ctx context.Context, req micro.Request, handle func(context.Context, []byte) (any, error)) {
	out, err := handle(ctx, req.Data())
	body, e := s.answer(req.Subject(), out, err)
	s.send(req.Subject(), body, e, func(body []byte, e *Error) error {
		if e != nil {
			return req.Error(strconv.Itoa(e.Code), e.Message, body)
		}
		return req.Respond(body)
	})
}

// send publishes a reply; one that cannot be sent is answered with an error
// instead, for the client would otherwise wait for nothing until its timeout.
func (s *Server) send(subject string, body []byte, e *Error, publish func([]byte, *Error) error) {
	err := publish(body, e)
	if err == nil {
		return
	}
	body, e = s.answer(subject, nil, fmt.Errorf("the reply could not be sent: %w", err))
	_ = publish(body, e)
}

// dispatch answers req from a goroutine of its own once one of the slots is free,
// and reports false if the server is stopping (the caller answers it in line). The
// reply is published on the connection, not through req, which micro reads again
// when the handler returns: so micro's statistics count such a request when it is
// handed over, and not its errors.
func (s *Server) dispatch(ctx context.Context, req micro.Request, handle func(context.Context, []byte) (any, error)) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return false
	}
	s.running.Add(1)
	s.mu.Unlock()
	s.slots <- struct{}{}
	data, subject, reply := req.Data(), req.Subject(), req.Reply()
	go func() {
		defer s.running.Done()
		defer func() { <-s.slots }()
		ctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		out, err := handle(ctx, data)
		body, e := s.answer(subject, out, err)
		s.send(subject, body, e, func(body []byte, e *Error) error {
			msg := &nats.Msg{Subject: reply, Data: body}
			if e != nil {
				msg.Header = nats.Header{micro.ErrorHeader: {e.Message}, micro.ErrorCodeHeader: {strconv.Itoa(e.Code)}}
			}
			return s.nc.PublishMsg(msg)
		})
	}()
	return true
}

// answer is the body of the reply to a request to subject, and the error it
// reports, if any.
func (s *Server) answer(subject string, out any, err error) ([]byte, *Error) {
	if err == nil {
		body, merr := json.Marshal(out)
		switch {
		case merr != nil:
			err = fmt.Errorf("encode the reply: %w", merr)
		case len(body) > s.maxReply():
			err = tooLarge("the reply", len(body), s.maxReply())
		default:
			return body, nil
		}
	}
	e := toError(err)
	if e.Code >= 500 {
		s.base.Logger.Error("request failed", "subject", subject, "err", err)
	}
	body, _ := json.Marshal(errorReply{Error: e})
	return body, e
}

// replyHeadroom is what a reply leaves of the connection's max payload for the
// headers of its message.
const replyHeadroom = 4 << 10

// maxReply is the most bytes a reply's body may have.
func (s *Server) maxReply() int { return int(s.nc.MaxPayload()) - replyHeadroom }

// tooLarge is the error of a reply, or a part of one, that one message cannot carry.
func tooLarge(what string, n, limit int) *Error {
	return &Error{Code: 413, Message: fmt.Sprintf("%s is %d bytes, over the %d bytes a reply can carry (the NATS server's max_payload less %d for headers)",
		what, n, limit, replyHeadroom)}
}

func toError(err error) *Error {
	var fe *engine.FieldError
	var se *engine.StateError
	var apiErr *Error
	switch {
	case errors.As(err, &apiErr):
		return apiErr
	case errors.As(err, &fe):
		return &Error{Code: 400, Field: fe.Field, Message: fe.Error()}
	case errors.As(err, &se):
		return &Error{Code: 409, Field: se.Field, Message: se.Error()}
	case errors.Is(err, engine.ErrNotFound):
		return &Error{Code: 404, Field: "id", Message: err.Error()}
	case errors.Is(err, engine.ErrKeyConflict):
		return &Error{Code: 409, Field: "idempotency_key", Message: err.Error()}
	case errors.Is(err, engine.ErrFinished), errors.Is(err, engine.ErrWrongPhase):
		return &Error{Code: 409, Message: err.Error()}
	case errors.Is(err, events.ErrNoSpace):
		return &Error{Code: 507, Message: err.Error() + ": nothing is recorded until it has room again"}
	}
	return &Error{Code: 500, Message: err.Error()}
}

// decode reads a request as a spec is read: a key given twice or a string that is
// not UTF-8 is refused with its field named, not decoded into something else.
func decode(data []byte, v any) error {
	var fe *engine.FieldError
	if errors.As(engine.CheckJSON(data, "request"), &fe) {
		return &Error{Code: 400, Field: fe.Field, Message: fe.Error()}
	}
	if err := json.Unmarshal(data, v); err != nil {
		return &Error{Code: 400, Field: "request", Message: "request: not valid JSON: " + err.Error()}
	}
	return nil
}

func (s *Server) register(ctx context.Context, data []byte) (any, error) {
	id, created, err := s.svc.Register(ctx, data)
	if err != nil {
		return nil, err
	}
	return Registered{ID: id, Created: created}, nil
}

func (s *Server) cancel(ctx context.Context, data []byte) (any, error) {
	var req CancelRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	id, err := s.resolveID(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	state, err := s.svc.Cancel(ctx, id, req.Reason)
	if err != nil {
		return nil, err
	}
	return View(state), nil
}

func (s *Server) get(ctx context.Context, data []byte) (any, error) {
	var req IDRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	state, err := s.namedTask(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	if state.Phase == engine.PhaseArchived {
		return View(state), nil
	}
	return s.view(state), nil
}

// namedTask is the task ref names (resolveID), whole (wholeTask).
func (s *Server) namedTask(ctx context.Context, ref string) (engine.State, error) {
	id, err := s.resolveID(ctx, ref)
	if err != nil {
		return engine.State{}, err
	}
	return s.wholeTask(ctx, id)
}

// wholeTask is a task's state; an archived one's as it was when it finished, read
// from the archive (one task asked for by id is worth the read), its whole spec
// and wake-up included.
func (s *Server) wholeTask(ctx context.Context, id string) (engine.State, error) {
	state, err := s.task(ctx, id)
	if err != nil || state.Phase != engine.PhaseArchived {
		return state, err
	}
	history, err := s.archived(ctx, state)
	if err != nil {
		return engine.State{}, err
	}
	full, _ := engine.Replay(history)
	full.ArchiveSeq = state.ArchiveSeq
	return full, nil
}

// view is View with what an armed task waits for.
func (s *Server) view(st engine.State) TaskView {
	v := View(st)
	v.Waiting = s.fleet.Waiting(st)
	return v
}

// archived reads an archived task's history from the archive.
func (s *Server) archived(ctx context.Context, state engine.State) ([]events.Record, error) {
	h, err := s.archive.Get(ctx, state.ArchiveSeq)
	if err != nil {
		return nil, fmt.Errorf("task %s is archived: %w", state.ID, err)
	}
	if h.TaskID != state.ID {
		return nil, fmt.Errorf("task %s is archived at seq %d, which holds task %s", state.ID, state.ArchiveSeq, h.TaskID)
	}
	return h.Events, nil
}

// task reads a task from the projection, after waiting for the projection to catch
// up with the stream if it does not know the task yet: a client that registered a
// task and asks for it at once must find it.
func (s *Server) task(ctx context.Context, id string) (engine.State, error) {
	if state, ok := s.queries.Task(id); ok {
		return state, nil
	}
	last, err := s.store.Last(ctx, id)
	if errors.Is(err, events.ErrNotFound) {
		return engine.State{}, fmt.Errorf("%w: %s", engine.ErrNotFound, id)
	}
	if err != nil {
		return engine.State{}, err
	}
	if err := s.queries.WaitFor(ctx, last.Seq); err != nil {
		return engine.State{}, err
	}
	if state, ok := s.queries.Task(id); ok {
		return state, nil
	}
	return engine.State{}, fmt.Errorf("%w: %s", engine.ErrNotFound, id)
}

// minTaskView is less than any task's view takes as JSON: a page never holds more
// tasks than the reply's budget over it, so a list reads at most that many states
// from the projection per page, once.
const minTaskView = 128

// listEnvelope bounds what a list reply holds besides its tasks: the total, the
// cursor and the JSON around them.
const listEnvelope = 512

// listPage is a ListReply with its tasks encoded.
type listPage struct {
	Tasks      []json.RawMessage `json:"tasks"`
	Total      int               `json:"total"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// list answers a page of tasks: as many as the request's limit asks for and one
// message can carry. The next page starts after the last task of this one.
func (s *Server) list(_ context.Context, data []byte) (any, error) {
	var req ListRequest
	if len(data) > 0 {
		if err := decode(data, &req); err != nil {
			return nil, err
		}
	}
	if err := req.Check(); err != nil {
		return nil, err
	}
	at, id, err := parseCursor(req.Cursor)
	if err != nil {
		return nil, err
	}
	budget := s.maxReply() - listEnvelope
	limit := budget / minTaskView
	if req.Limit > 0 {
		limit = min(limit, req.Limit)
	}
	// One more than the page may hold says whether another page follows.
	q := req.ListQuery
	q.Limit = limit + 1
	states, total := s.queries.ListAfter(q, at, id)
	page := listPage{Tasks: []json.RawMessage{}, Total: total}
	size := 0
	for i, st := range states {
		if i == limit {
			page.NextCursor = cursor(at, id)
			break
		}
		view, err := json.Marshal(s.view(st))
		if err != nil {
			return nil, fmt.Errorf("encode task %s: %w", st.ID, err)
		}
		if size+len(view)+1 > budget {
			if len(page.Tasks) == 0 {
				e := tooLarge("task "+st.ID, len(view), budget)
				e.Field = "tasks"
				return nil, e
			}
			page.NextCursor = cursor(at, id)
			break
		}
		page.Tasks = append(page.Tasks, view)
		size += len(view) + 1
		at, id = st.ArmedAt, st.ID
	}
	return page, nil
}

// cursor names the position after the task armed at armedAt with the id id.
func cursor(armedAt time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(armedAt.UTC().Format(time.RFC3339Nano) + " " + id))
}

// parseCursor reads a cursor; none is the start of the list.
func parseCursor(c string) (time.Time, string, error) {
	if c == "" {
		return time.Time{}, "", nil
	}
	bad := &Error{Code: 400, Field: "cursor", Message: fmt.Sprintf("cursor: %q is not the next_cursor of a list reply", c)}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", bad
	}
	stamp, id, ok := strings.Cut(string(raw), " ")
	at, err := time.Parse(time.RFC3339Nano, stamp)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", bad
	}
	return at, id, nil
}

func (s *Server) history(ctx context.Context, data []byte) (any, error) {
	var req IDRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	id, err := s.resolveID(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	hist, err := s.store.History(ctx, id)
	if errors.Is(err, events.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", engine.ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	if first := hist[0]; first.Type == events.TypeArchived {
		// Compacted: the events before it are in the archive.
		state, _ := engine.Replay(hist)
		archived, err := s.archived(ctx, state)
		if err != nil {
			return nil, err
		}
		hist = append(archived, hist...)
	}
	for i, rec := range hist {
		hist[i] = engine.HideEnvIn(rec)
	}
	return HistoryReply{Events: hist}, nil
}

func (s *Server) workers(context.Context, []byte) (any, error) {
	return WorkersReply{Workers: s.fleet.Workers()}, nil
}
