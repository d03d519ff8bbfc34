package api

import (
	"context"
	"encoding/json"
)

// SubjectRerun registers a task that runs another one again.
const SubjectRerun = "bgtask.rerun"

// RerunRequest asks for a new task with task ID's spec (engine.State.RerunSpec),
// registered under IdempotencyKey (none: a task of its own each time).
type RerunRequest struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// rerun is served by the engine, not done by a client that reads the task and
// registers its spec: no reader gets the values of the spec's env
// (engine.Spec.HideEnv), and the new task needs them.
func (s *Server) rerun(ctx context.Context, data []byte) (any, error) {
	var req RerunRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	state, err := s.namedTask(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	spec := state.RerunSpec()
	spec.IdempotencyKey = req.IdempotencyKey
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return s.register(ctx, raw)
}

// Rerun registers a new task with task id's spec, under key (none: a task of its
// own).
func (c *Client) Rerun(ctx context.Context, id, key string) (Registered, error) {
	var out Registered
	return out, c.callJSON(ctx, SubjectRerun, RerunRequest{ID: id, IdempotencyKey: key}, &out)
}
