package api

import (
	"context"

	"github.com/bgtask/bgtask/engine"
)

// Subjects of holding a task that has not started, and letting it go on.
const (
	SubjectPause  = "bgtask.pause"
	SubjectResume = "bgtask.resume"
)

func (s *Server) pause(ctx context.Context, data []byte) (any, error) {
	return s.changeTask(ctx, data, s.svc.Pause)
}

func (s *Server) resume(ctx context.Context, data []byte) (any, error) {
	return s.changeTask(ctx, data, s.svc.Resume)
}

// changeTask decodes a request naming a task, and answers with the task as change
// leaves it.
func (s *Server) changeTask(ctx context.Context, data []byte, change func(context.Context, string) (engine.State, error)) (any, error) {
	var req IDRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	id, err := s.resolveID(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	state, err := change(ctx, id)
	if err != nil {
		return nil, err
	}
	return View(state), nil
}

// Pause holds a task that has not started: a delayed start, a retry waiting, a
// timer, or a task waiting for a worker.
func (c *Client) Pause(ctx context.Context, id string) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectPause, IDRequest{ID: id}, &out)
}

// Resume lets a paused task go on.
func (c *Client) Resume(ctx context.Context, id string) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectResume, IDRequest{ID: id}, &out)
}
