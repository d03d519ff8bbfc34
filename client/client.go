// Package client is the Go client of a bgtask deployment: register a command (or
// a timer), read a task, list tasks, wait for a task's wake-up, pause, resume and
// cancel one. It speaks the NATS API documented in docs/api.md, as the bgtask
// command does, over a connection the caller opens: Connect opens one to the
// server of a home, with the client identity that server generated.
//
//	nc, err := client.Connect(home)
//	c := client.New(nc)
//	reg, err := c.Register(ctx, client.Spec{Command: "make test", Cwd: dir, Target: "agent-7"})
//	task, err := c.Wait(ctx, reg.ID)
//	fmt.Println(task.Wakeup.Prompt)
package client

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// The types a caller builds and reads: a spec (docs/api.md lists its fields), a
// registration's answer, a task as the API shows it, and the wake-up it delivers.
type (
	Spec         = engine.Spec
	Registration = api.Registered
	Task         = api.TaskView
	Wakeup       = events.Wakeup
	ListQuery    = engine.ListQuery
)

// Client calls a bgtask deployment's API.
type Client struct {
	nc  *nats.Conn
	api *api.Client
}

// New returns a client over nc, a connection allowed the client's requests and
// reads (the client identity of docs/security.md).
func New(nc *nats.Conn) *Client { return &Client{nc: nc, api: api.NewClient(nc)} }

// Connect connects to the server of a home (the directory `bgtask server` runs
// in) as its client identity: the URL from its server.json, the key from its
// client.nkey. opts are added to the connection's options.
func Connect(home string, opts ...nats.Option) (*nats.Conn, error) {
	data, err := os.ReadFile(filepath.Join(home, "server.json"))
	if err != nil {
		return nil, fmt.Errorf("no bgtask server runs in %s: %w", home, err)
	}
	var found struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(data, &found); err != nil || found.URL == "" {
		return nil, fmt.Errorf("%s: not a bgtask server's discovery file", filepath.Join(home, "server.json"))
	}
	key, err := nats.NkeyOptionFromSeed(filepath.Join(home, "client.nkey"))
	if err != nil {
		return nil, fmt.Errorf("the client identity of %s: %w", home, err)
	}
	return nats.Connect(found.URL, append([]nats.Option{key, nats.Name("bgtask-client"), nats.MaxReconnects(-1)}, opts...)...)
}

// Register registers spec. A spec the engine refuses is an *api.Error naming the
// field; with an IdempotencyKey, registering the same spec again returns the
// same task (Created false).
func (c *Client) Register(ctx context.Context, spec Spec) (Registration, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return Registration{}, err
	}
	return c.api.Register(ctx, raw)
}

// Get returns a task.
func (c *Client) Get(ctx context.Context, id string) (Task, error) { return c.api.Get(ctx, id) }

// List returns the tasks q selects, newest first, and how many match in all.
func (c *Client) List(ctx context.Context, q ListQuery) ([]Task, int, error) {
	reply, err := c.api.List(ctx, q)
	return reply.Tasks, reply.Total, err
}

// Cancel cancels a task that has not ended: nothing is delivered.
func (c *Client) Cancel(ctx context.Context, id, reason string) (Task, error) {
	return c.api.Cancel(ctx, id, reason)
}

// Pause holds a task that has not started; Resume lets it go on.
func (c *Client) Pause(ctx context.Context, id string) (Task, error) { return c.api.Pause(ctx, id) }

// Resume lets a paused task go on.
func (c *Client) Resume(ctx context.Context, id string) (Task, error) {
	return c.api.Resume(ctx, id)
}

// Wait blocks until a task has fired (its Wakeup is set) or was cancelled, or
// ctx ends, and returns the task then. It follows the task's events, so it
// misses nothing that happens while it waits. id may be a unique part of the
// task's id, as every call that takes one allows (docs/api.md).
func (c *Client) Wait(ctx context.Context, id string) (Task, error) {
	t, err := c.Get(ctx, id)
	if err != nil || ended(t.State) {
		return t, err // an unknown task is an error at once, not a wait for ever
	}
	id = t.ID // the whole id, of the part of it given
	js, err := jetstream.New(c.nc)
	if err != nil {
		return Task{}, err
	}
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		return Task{}, err
	}
	var s engine.State
	err = store.Follow(ctx, id, 0, func(rec events.Record, decodeErr error) bool {
		if decodeErr == nil {
			s, _ = engine.Apply(s, rec)
		}
		return !ended(s)
	})
	if err == nil && s.Phase == engine.PhaseArchived {
		return c.Get(ctx, id) // the archive has what its events were
	}
	return api.View(s), err
}

// ended: nothing more is delivered for a task in state s.
func ended(s engine.State) bool {
	return s.Phase == engine.PhaseFired || s.Phase == engine.PhaseCancelled || s.Phase == engine.PhaseArchived
}
