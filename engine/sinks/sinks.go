// Package sinks makes the attempts of push sinks: a webhook POST, or an exec of a
// program with the prompt on its stdin.
package sinks

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// maxOutput is how much of a sink's answer (a response body, a program's output) is
// kept in the history: enough to say why it failed.
const maxOutput = 4 << 10

// Runner makes push attempts. It is safe for concurrent use.
type Runner struct {
	secret  []byte
	client  *http.Client
	bearers engine.Bearers
}

var _ engine.SinkRunner = (*Runner)(nil)

// New returns a runner that signs webhook bodies with secret.
func New(secret []byte) *Runner {
	return &Runner{
		secret: secret,
		client: &http.Client{
			// A redirect is not followed: the wake-up goes where the spec says, and a
			// 3xx is a failure the history shows.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// WithBearers returns a runner whose webhooks send the bearer tokens b declares,
// each only to a URL under its prefixes.
func (r *Runner) WithBearers(b engine.Bearers) *Runner {
	c := *r
	c.bearers = b
	return &c
}

// Push implements engine.SinkRunner.
func (r *Runner) Push(ctx context.Context, sink engine.Sink, w events.Wakeup, attempt int) engine.SinkOutcome {
	start := time.Now()
	var o engine.SinkOutcome
	switch sink.Type {
	case engine.SinkWebhook:
		o = r.webhook(ctx, sink, w, attempt)
	case engine.SinkExec:
		o = runExec(ctx, engine.RenderArgv(sink.Argv, w), w, attempt)
	default:
		o = engine.SinkOutcome{Permanent: true, Error: fmt.Sprintf("unknown sink type %q", sink.Type)}
	}
	o.Duration = time.Since(start)
	return o
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf   []byte
	max   int
	total int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.total += len(p)
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	if t.total > len(t.buf) {
		return fmt.Sprintf("[first %d bytes not kept]\n%s", t.total-len(t.buf), t.buf)
	}
	return string(t.buf)
}
