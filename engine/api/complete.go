package api

import "context"

// SubjectComplete ends a task from outside.
const SubjectComplete = "bgtask.complete"

// CompleteRequest ends a task from outside with a status (succeeded, the
// default, or failed) and a result.
type CompleteRequest struct {
	ID     string `json:"id"`
	Status string `json:"status,omitempty"`
	Result string `json:"result,omitempty"`
}

func (s *Server) complete(ctx context.Context, data []byte) (any, error) {
	var req CompleteRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	id, err := s.resolveID(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	state, err := s.svc.Complete(ctx, id, req.Status, req.Result)
	if err != nil {
		return nil, err
	}
	return View(state), nil
}

// Complete ends a task from outside: one not started never runs, a running one's
// command is stopped. Whichever of it, the command's exit and the deadline comes
// first decides.
func (c *Client) Complete(ctx context.Context, req CompleteRequest) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectComplete, req, &out)
}
