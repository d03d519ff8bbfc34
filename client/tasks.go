package client

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/google/uuid"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// The types a caller builds and reads: a spec (docs/api.md lists its fields), a
// registration's answer, a task as the API shows it, the wake-up it delivers, and
// the API's requests and replies.
type (
	Spec             = engine.Spec
	Registration     = api.Registered
	Task             = api.TaskView
	Wakeup           = events.Wakeup
	ListQuery        = engine.ListQuery
	ListPage         = api.ListReply
	History          = api.HistoryReply
	Workers          = api.WorkersReply
	CompleteRequest  = api.CompleteRequest
	RedeliverRequest = api.RedeliverRequest
	Schedule         = engine.Schedule
	ScheduleView     = api.ScheduleView
	ScheduleList     = api.ScheduleList
	ScheduleDeleted  = api.ScheduleDeleted
)

// The outcomes of a task, its wake-up's status.
const (
	StatusSucceeded = engine.StatusSucceeded
	StatusFailed    = engine.StatusFailed
	StatusCancelled = engine.StatusCancelled
)

// Register registers spec. A spec the engine refuses is an *Error naming the
// field. A spec with no IdempotencyKey gets one of the call's own, so that a
// registration made again through a restart of the server arms one task;
// registering the same spec with the same key again returns the same task
// (Created false).
func (c *Client) Register(ctx context.Context, spec Spec) (Registration, error) {
	if spec.IdempotencyKey == "" {
		spec.IdempotencyKey = NewIdempotencyKey()
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return Registration{}, err
	}
	return c.RegisterJSON(ctx, raw)
}

// NewIdempotencyKey is a key of a registration of its own: made again, the
// registration is the same task.
func NewIdempotencyKey() string { return "add-" + uuid.NewString() }

// RegisterJSON registers a spec given as JSON, as a file or a program holds one.
// It is made again through a restart of the server only if the spec has an
// idempotency key (a second arrival without one would arm a second task).
func (c *Client) RegisterJSON(ctx context.Context, spec []byte) (Registration, error) {
	var keyed struct {
		Key string `json:"idempotency_key"`
	}
	_ = json.Unmarshal(spec, &keyed)
	var out Registration
	err := c.do(ctx, keyed.Key != "", func(ctx context.Context) (err error) {
		out, err = c.api.Register(ctx, spec)
		return err
	})
	return out, err
}

// Get returns a task, by its id or a unique prefix of it.
func (c *Client) Get(ctx context.Context, id string) (Task, error) {
	var out Task
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.Get(ctx, id)
		return err
	})
}

// List returns the tasks q selects, newest first: q.Limit of them (0: all),
// asking page after page, and how many match in all.
func (c *Client) List(ctx context.Context, q ListQuery) (ListPage, error) {
	var out ListPage
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.List(ctx, q)
		return err
	})
}

// ListPage returns one page of the tasks q selects, newest first, after the
// page whose NextCursor is cursor ("": the first).
func (c *Client) ListPage(ctx context.Context, q ListQuery, cursor string) (ListPage, error) {
	var out ListPage
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.ListPage(ctx, api.ListRequest{ListQuery: q, Cursor: cursor})
		return err
	})
}

// History returns a task's events, in order.
func (c *Client) History(ctx context.Context, id string) (History, error) {
	var out History
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.History(ctx, id)
		return err
	})
}

// Workers lists the live workers.
func (c *Client) Workers(ctx context.Context) (Workers, error) {
	var out Workers
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.Workers(ctx)
		return err
	})
}

// Cancel cancels a task that has not ended: its command is stopped, nothing is
// delivered. It is made once: a call the connection cut is an error that says
// it may have been carried out.
func (c *Client) Cancel(ctx context.Context, id, reason string) (Task, error) {
	return c.once(ctx, func(ctx context.Context) (Task, error) { return c.api.Cancel(ctx, id, reason) })
}

// Pause holds a task that has not started; made once, as Cancel.
func (c *Client) Pause(ctx context.Context, id string) (Task, error) {
	return c.once(ctx, func(ctx context.Context) (Task, error) { return c.api.Pause(ctx, id) })
}

// Resume lets a paused task go on; made once, as Cancel.
func (c *Client) Resume(ctx context.Context, id string) (Task, error) {
	return c.once(ctx, func(ctx context.Context) (Task, error) { return c.api.Resume(ctx, id) })
}

// Complete ends a task from outside; made once, as Cancel.
func (c *Client) Complete(ctx context.Context, req CompleteRequest) (Task, error) {
	return c.once(ctx, func(ctx context.Context) (Task, error) { return c.api.Complete(ctx, req) })
}

// Redeliver pushes a fired task's wake-up again, once, with the same
// idempotency key: to the push sink req.Sink names, or to each that gave up, or,
// if none did, to each one. A push that is not done yet (not made, retried, in
// flight) is an *Error with code 409 that says where it is. Made once, as
// Cancel: each call that succeeds starts each push asked for over once, retried
// as its sink says until it is delivered or gives up again.
func (c *Client) Redeliver(ctx context.Context, req RedeliverRequest) (Task, error) {
	return c.once(ctx, func(ctx context.Context) (Task, error) { return c.api.Redeliver(ctx, req) })
}

// Consume removes a fired task's wake-up from its target's inbox, so that no
// reader of the inbox gets it again; consuming it twice is no error.
func (c *Client) Consume(ctx context.Context, id string) (Task, error) {
	var out Task
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.Consume(ctx, id)
		return err
	})
}

func (c *Client) once(ctx context.Context, call func(context.Context) (Task, error)) (Task, error) {
	var out Task
	return out, c.do(ctx, false, func(ctx context.Context) (err error) {
		out, err = call(ctx)
		return err
	})
}

// AddSchedule adds (or, with the same spec, keeps) a schedule.
func (c *Client) AddSchedule(ctx context.Context, s Schedule) (ScheduleView, error) {
	var out ScheduleView
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.AddSchedule(ctx, s)
		return err
	})
}

// Schedules lists the schedules with their next slots.
func (c *Client) Schedules(ctx context.Context) (ScheduleList, error) {
	var out ScheduleList
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.Schedules(ctx)
		return err
	})
}

// Schedule returns a schedule, its next slots and its last occurrences.
func (c *Client) Schedule(ctx context.Context, name string) (ScheduleView, error) {
	var out ScheduleView
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.ShowSchedule(ctx, name)
		return err
	})
}

// PauseSchedule stops a schedule's slots (paused) or starts them again from now.
func (c *Client) PauseSchedule(ctx context.Context, name string, paused bool) (ScheduleView, error) {
	var out ScheduleView
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.PauseSchedule(ctx, name, paused)
		return err
	})
}

// DeleteSchedule removes a schedule; its occurrences stay tasks.
func (c *Client) DeleteSchedule(ctx context.Context, name string) (ScheduleDeleted, error) {
	var out ScheduleDeleted
	return out, c.do(ctx, true, func(ctx context.Context) (err error) {
		out, err = c.api.DeleteSchedule(ctx, name)
		return err
	})
}

// TriggerSchedule registers an occurrence of a schedule now; made once.
func (c *Client) TriggerSchedule(ctx context.Context, name string) (Registration, error) {
	var out Registration
	return out, c.do(ctx, false, func(ctx context.Context) (err error) {
		out, err = c.api.TriggerSchedule(ctx, name)
		return err
	})
}

// Rerun registers a new task with a task's spec (its env included, which no
// reader gets): made again through a restart of the server, the same key
// registers it once.
func (c *Client) Rerun(ctx context.Context, id, key string) (Registration, error) {
	var out Registration
	return out, c.do(ctx, key != "", func(ctx context.Context) (err error) {
		out, err = c.api.Rerun(ctx, id, key)
		return err
	})
}

// DrainReply is what a worker told to drain still runs.
type DrainReply = events.DrainReply

// ErrNoWorker: no worker of that id runs.
var ErrNoWorker = events.ErrNoWorker

// DrainWorker tells a worker to take no new task and exit once its runs end.
func (c *Client) DrainWorker(ctx context.Context, id string) (DrainReply, error) {
	if !events.ValidToken(id) {
		return DrainReply{}, &Error{Code: 400, Field: "worker", Message: "worker id " + strconv.Quote(id) + ": use letters, digits, '-' and '_'"}
	}
	return events.DrainWorker(ctx, c.nc, id)
}
