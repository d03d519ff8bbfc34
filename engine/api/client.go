package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
)

// Client calls the API.
type Client struct {
	nc *nats.Conn
}

// NewClient returns a client over nc.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc} }

// Register arms a spec (raw JSON, validated by the engine).
func (c *Client) Register(ctx context.Context, spec []byte) (Registered, error) {
	var out Registered
	return out, c.call(ctx, SubjectRegister, spec, &out)
}

// Cancel cancels a task.
func (c *Client) Cancel(ctx context.Context, id, reason string) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectCancel, CancelRequest{ID: id, Reason: reason}, &out)
}

// Get returns a task.
func (c *Client) Get(ctx context.Context, id string) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectGet, IDRequest{ID: id}, &out)
}

// List returns q.Limit tasks (0: all), newest first, and how many match in all,
// asking for page after page: one reply carries only as many as fit in a message.
func (c *Client) List(ctx context.Context, q engine.ListQuery) (ListReply, error) {
	all := ListReply{Tasks: []TaskView{}}
	req := ListRequest{ListQuery: q}
	for {
		if q.Limit > 0 {
			req.Limit = q.Limit - len(all.Tasks)
		}
		page, err := c.ListPage(ctx, req)
		if err != nil {
			return ListReply{}, err
		}
		all.Tasks = append(all.Tasks, page.Tasks...)
		all.Total = page.Total
		if page.NextCursor == "" || q.Limit > 0 && len(all.Tasks) >= q.Limit {
			return all, nil
		}
		if len(page.Tasks) == 0 {
			return ListReply{}, fmt.Errorf("%s: a page with no tasks names a next page", SubjectList)
		}
		req.Cursor = page.NextCursor
	}
}

// ListPage returns one page of tasks, newest first.
func (c *Client) ListPage(ctx context.Context, req ListRequest) (ListReply, error) {
	var out ListReply
	return out, c.callJSON(ctx, SubjectList, req, &out)
}

// History returns a task's events in order.
func (c *Client) History(ctx context.Context, id string) (HistoryReply, error) {
	var out HistoryReply
	return out, c.callJSON(ctx, SubjectHistory, IDRequest{ID: id}, &out)
}

// Workers lists the live workers.
func (c *Client) Workers(ctx context.Context) (WorkersReply, error) {
	var out WorkersReply
	return out, c.call(ctx, SubjectWorkers, nil, &out)
}

func (c *Client) callJSON(ctx context.Context, subject string, req, out any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return c.call(ctx, subject, data, out)
}

// ErrNoServer: nothing serves the API on this connection.
var ErrNoServer = errors.New("no bgtask server answers (is `bgtask server` running?)")

func (c *Client) call(ctx context.Context, subject string, data []byte, out any) error {
	reply, err := c.Raw(ctx, subject, data)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(reply, out); err != nil {
		return fmt.Errorf("%s: unreadable reply: %w", subject, err)
	}
	return nil
}

// Raw makes a request to one of the subjects and returns its reply as the
// server wrote it, for a caller that passes it on (the HTTP API); a reply that
// is the error object is an *Error.
func (c *Client) Raw(ctx context.Context, subject string, data []byte) (json.RawMessage, error) {
	msg, err := c.nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, ErrNoServer
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	var reply errorReply
	if json.Unmarshal(msg.Data, &reply) == nil && reply.Error != nil {
		return nil, reply.Error
	}
	return msg.Data, nil
}
