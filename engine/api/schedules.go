package api

import (
	"context"
	"errors"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Subjects of the schedule endpoints.
const (
	SubjectScheduleAdd     = "bgtask.schedule.add"
	SubjectScheduleList    = "bgtask.schedule.list"
	SubjectScheduleShow    = "bgtask.schedule.show"
	SubjectSchedulePause   = "bgtask.schedule.pause"
	SubjectScheduleResume  = "bgtask.schedule.resume"
	SubjectScheduleDelete  = "bgtask.schedule.delete"
	SubjectScheduleTrigger = "bgtask.schedule.trigger"
)

// OccurrenceReader finds the tasks a schedule registered, newest slot first.
type OccurrenceReader interface {
	Occurrences(schedule string, limit int) []engine.State
}

// scheduling is what the schedule endpoints serve from.
type scheduling struct {
	store       engine.ScheduleStore
	occurrences OccurrenceReader
}

// ServeSchedules makes the schedule endpoints serve the schedules in store;
// without it they answer 503. Call it before Start.
func (s *Server) ServeSchedules(store engine.ScheduleStore, occurrences OccurrenceReader) {
	s.schedules = &scheduling{store: store, occurrences: occurrences}
}

// ScheduleNext is how many next slots a schedule's view lists, and
// ShowOccurrences how many of its last occurrences show lists.
const (
	ScheduleNext    = 5
	ShowOccurrences = 20
)

// NameRequest names a schedule.
type NameRequest struct {
	Name string `json:"name"`
}

// ScheduleView is a schedule with its next slots; show adds its last occurrences.
type ScheduleView struct {
	Schedule    engine.Schedule  `json:"schedule"`
	Next        []time.Time      `json:"next"`
	Occurrences []OccurrenceView `json:"occurrences,omitempty"`
}

// OccurrenceView is one task a schedule registered.
type OccurrenceView struct {
	ID     string       `json:"id"`
	Slot   time.Time    `json:"slot"`
	Status string       `json:"status,omitempty"`
	State  engine.Phase `json:"state"`
}

// ScheduleList is every schedule.
type ScheduleList struct {
	Schedules []ScheduleView `json:"schedules"`
}

// ScheduleDeleted is the reply to a delete.
type ScheduleDeleted struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

func (s *Server) scheduleStore() (engine.ScheduleStore, error) {
	if s.schedules == nil {
		return nil, &Error{Code: 503, Message: "this engine does not serve schedules"}
	}
	return s.schedules.store, nil
}

// scheduleError names the field of a schedule's absence or clash.
func scheduleError(err error) error {
	switch {
	case errors.Is(err, events.ErrNoSchedule):
		return &Error{Code: 404, Field: "name", Message: err.Error()}
	case errors.Is(err, events.ErrScheduleExists):
		return &Error{Code: 409, Field: "name", Message: err.Error()}
	}
	return err
}

// scheduleView is a schedule with its next slots; its spec's env shows its names
// alone (engine.HideEnvJSON).
func (s *Server) scheduleView(sc engine.Schedule) ScheduleView {
	v := ScheduleView{Schedule: sc, Next: []time.Time{}}
	v.Schedule.Spec = engine.HideEnvJSON(sc.Spec)
	if !sc.Paused {
		v.Next = append(v.Next, sc.Next(maxTime(sc.After, s.base.Now()), ScheduleNext)...)
	}
	return v
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *Server) scheduleAdd(ctx context.Context, data []byte) (any, error) {
	store, err := s.scheduleStore()
	if err != nil {
		return nil, err
	}
	var sc engine.Schedule
	if err := decode(data, &sc); err != nil {
		return nil, err
	}
	sc, err = engine.AddSchedule(ctx, store, sc, s.base.Now())
	if err != nil {
		return nil, scheduleError(err)
	}
	return s.scheduleView(sc), nil
}

func (s *Server) scheduleList(ctx context.Context, _ []byte) (any, error) {
	store, err := s.scheduleStore()
	if err != nil {
		return nil, err
	}
	entries, err := store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := ScheduleList{Schedules: []ScheduleView{}}
	for _, e := range entries {
		sc, err := engine.DecodeSchedule(e.Value)
		if err != nil {
			return nil, err
		}
		out.Schedules = append(out.Schedules, s.scheduleView(sc))
	}
	return out, nil
}

// named decodes a request naming a schedule.
func (s *Server) named(data []byte) (engine.ScheduleStore, string, error) {
	store, err := s.scheduleStore()
	if err != nil {
		return nil, "", err
	}
	var req NameRequest
	if err := decode(data, &req); err != nil {
		return nil, "", err
	}
	if !events.ValidToken(req.Name) {
		return nil, "", &Error{Code: 400, Field: "name", Message: "name: " + quote(req.Name) + " is not a schedule name: use letters, digits, '-' and '_'"}
	}
	return store, req.Name, nil
}

func quote(s string) string { return `"` + s + `"` }

func (s *Server) scheduleShow(ctx context.Context, data []byte) (any, error) {
	store, name, err := s.named(data)
	if err != nil {
		return nil, err
	}
	e, err := store.Get(ctx, name)
	if err != nil {
		return nil, scheduleError(err)
	}
	sc, err := engine.DecodeSchedule(e.Value)
	if err != nil {
		return nil, err
	}
	v := s.scheduleView(sc)
	v.Occurrences = []OccurrenceView{}
	for _, st := range s.schedules.occurrences.Occurrences(name, ShowOccurrences) {
		v.Occurrences = append(v.Occurrences, OccurrenceView{ID: st.ID, Slot: st.Spec.Occurrence.Slot, Status: st.Status, State: st.Phase})
	}
	return v, nil
}

func (s *Server) schedulePause(ctx context.Context, data []byte) (any, error) {
	return s.setPaused(ctx, data, true)
}

func (s *Server) scheduleResume(ctx context.Context, data []byte) (any, error) {
	return s.setPaused(ctx, data, false)
}

func (s *Server) setPaused(ctx context.Context, data []byte, paused bool) (any, error) {
	store, name, err := s.named(data)
	if err != nil {
		return nil, err
	}
	sc, err := engine.PauseSchedule(ctx, store, name, paused, s.base.Now())
	if err != nil {
		return nil, scheduleError(err)
	}
	return s.scheduleView(sc), nil
}

func (s *Server) scheduleDelete(ctx context.Context, data []byte) (any, error) {
	store, name, err := s.named(data)
	if err != nil {
		return nil, err
	}
	if err := store.Delete(ctx, name); err != nil {
		return nil, scheduleError(err)
	}
	return ScheduleDeleted{Name: name, Deleted: true}, nil
}

func (s *Server) scheduleTrigger(ctx context.Context, data []byte) (any, error) {
	store, name, err := s.named(data)
	if err != nil {
		return nil, err
	}
	id, err := engine.TriggerSchedule(ctx, store, s.svc.Register, name, s.base.Now())
	if err != nil {
		return nil, scheduleError(err)
	}
	return Registered{ID: id, Created: true}, nil
}

// AddSchedule stores a schedule.
func (c *Client) AddSchedule(ctx context.Context, s engine.Schedule) (ScheduleView, error) {
	var out ScheduleView
	return out, c.callJSON(ctx, SubjectScheduleAdd, s, &out)
}

// Schedules lists every schedule.
func (c *Client) Schedules(ctx context.Context) (ScheduleList, error) {
	var out ScheduleList
	return out, c.callJSON(ctx, SubjectScheduleList, struct{}{}, &out)
}

// ShowSchedule returns a schedule, its next slots and its last occurrences.
func (c *Client) ShowSchedule(ctx context.Context, name string) (ScheduleView, error) {
	var out ScheduleView
	return out, c.callJSON(ctx, SubjectScheduleShow, NameRequest{Name: name}, &out)
}

// PauseSchedule stops (paused) or restarts a schedule's slots.
func (c *Client) PauseSchedule(ctx context.Context, name string, paused bool) (ScheduleView, error) {
	subject := SubjectSchedulePause
	if !paused {
		subject = SubjectScheduleResume
	}
	var out ScheduleView
	return out, c.callJSON(ctx, subject, NameRequest{Name: name}, &out)
}

// DeleteSchedule removes a schedule; its occurrences stay.
func (c *Client) DeleteSchedule(ctx context.Context, name string) (ScheduleDeleted, error) {
	var out ScheduleDeleted
	return out, c.callJSON(ctx, SubjectScheduleDelete, NameRequest{Name: name}, &out)
}

// TriggerSchedule registers an occurrence of a schedule now.
func (c *Client) TriggerSchedule(ctx context.Context, name string) (Registered, error) {
	var out Registered
	return out, c.callJSON(ctx, SubjectScheduleTrigger, NameRequest{Name: name}, &out)
}
