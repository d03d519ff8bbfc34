package api

import (
	"context"
)

// SubjectConsume removes a fired task's wake-up from its target's inbox.
const SubjectConsume = "bgtask.consume"

func (s *Server) consume(ctx context.Context, data []byte) (any, error) {
	return s.changeTask(ctx, data, s.svc.Consume)
}

// Consume removes a fired task's wake-up from its target's inbox, once it was read
// otherwise (a wait): no reader of the inbox gets it. Consuming it again is no
// error; a task that was not delivered (not fired yet, cancelled, quiet) is a 409.
func (c *Client) Consume(ctx context.Context, id string) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectConsume, IDRequest{ID: id}, &out)
}
