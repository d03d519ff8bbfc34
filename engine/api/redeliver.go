package api

import "context"

// SubjectRedeliver pushes a fired task's wake-up again.
const SubjectRedeliver = "bgtask.redeliver"

// RedeliverRequest names a fired task and, if Sink is given, the one push sink
// (its index in the spec's deliver) to push again; without it, each that gave up,
// or, if none did, each one.
type RedeliverRequest struct {
	ID   string `json:"id"`
	Sink *int   `json:"sink,omitempty"`
}

func (s *Server) redeliver(ctx context.Context, data []byte) (any, error) {
	var req RedeliverRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	id, err := s.resolveID(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	state, err := s.svc.Redeliver(ctx, id, req.Sink)
	if err != nil {
		return nil, err
	}
	return View(state), nil
}

// Redeliver pushes a fired task's wake-up again, once, with the same
// idempotency key: the reply is the task, the sinks asked for "redelivering",
// once the request is recorded (event redelivery-requested); the pusher makes
// the push after, as the task's policy and target allow, retried as its sink
// says. A push that is not done (not made yet, retried, in flight) is a 409
// that names it.
func (c *Client) Redeliver(ctx context.Context, req RedeliverRequest) (TaskView, error) {
	var out TaskView
	return out, c.callJSON(ctx, SubjectRedeliver, req, &out)
}
