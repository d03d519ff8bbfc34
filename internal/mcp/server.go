// Package mcpserver serves bgtask to an agent over the Model Context Protocol:
// the client's calls as tools, the tasks as resources (docs/mcp.md). It is a
// front-end built on the client package: each tool call opens a client of its
// own, as a client command does.
//
// A tool's arguments and result are Go types whose fields, with their jsonschema
// tags, make the tool's input and output schemas. The arguments are decoded here,
// not by the SDK's typed tools: those refuse a bad argument with a message that
// names no field, where bgtask answers with the API's error object, and they pass
// the arguments through float64, which rounds a 64-bit number in a spec.
package mcpserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
)

// DefaultProgressEvery is often enough that no client's idle timer on a call
// runs out while a wait blocks (Claude Code's is 30 minutes for a stdio server).
const DefaultProgressEvery = 10 * time.Second

// Config is what the server needs of the process it runs in.
type Config struct {
	// Client names the deployment every call reaches, a home or a URL; each call
	// connects with a client of its own. Its Waiting is the server's.
	Client client.Config
	// Timeout bounds a call's wait for the server, through a restart of it, as a
	// client command's --timeout does (0: no bound). A wait has its own timeout.
	Timeout time.Duration
	// ProgressEvery is how often a wait tells a client that gave a progress token
	// that it goes on (default DefaultProgressEvery).
	ProgressEvery time.Duration
	// Stderr is where a call says, once, that it waits for the server.
	Stderr io.Writer
	// Version is bgtask's, which the client is told.
	Version string

	// What add and join do with what they are not told, as `bgtask add` in this
	// process does: Cwd is the directory a command runs in, and the one a
	// relative cwd is taken from; a task with a directory is placed on Host, this
	// host, where a pid is read too; a command runs in Env unless its spec says
	// login (the caller's environment, less bgtask's credentials); a task that
	// names no target wakes Session, if the server runs in one.
	Cwd     string
	Host    string
	Env     map[string]string
	Session *Session

	// Describe is the text of a task that show answers with (the CLI's); nil:
	// its JSON.
	Describe func(client.Task) string
}

// Session is the agent session a server runs in, as its runtime tells it
// through the environment: the spec fields that wake that session.
type Session struct {
	Target  string          // the session's inbox
	Origin  json.RawMessage // the runtime and the session's id, for the wake-up's reader
	Deliver []engine.Sink   // how a wake-up reaches the session, for a runtime that bgtask reaches only so
}

// Limits of the answers, which end up in a model's context.
const (
	listLimit   = 20       // tasks of a list call that gives no limit
	logBytes    = 32 << 10 // bytes of output of a logs call that gives no max_bytes
	maxLogBytes = 1 << 20  // the most max_bytes may ask for
	pageSize    = 50       // tasks per resources/list page
)

// server serves the tools over the API.
type server struct {
	cfg Config
}

// Serve serves one MCP session on r and w, one JSON-RPC message a line, until r
// ends or ctx is done. A line that is no message gets its JSON-RPC error, and
// the session goes on.
func Serve(ctx context.Context, cfg Config, r io.Reader, w io.Writer) error {
	err := New(cfg).Run(ctx, &stdioTransport{r: r, w: w})
	if errors.Is(err, context.Canceled) {
		return nil // interrupted
	}
	return err
}

// New is the MCP server of cfg, for a transport of the caller's.
func New(cfg Config) *mcp.Server {
	cfg.ProgressEvery = cmp.Or(cfg.ProgressEvery, DefaultProgressEvery)
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	s := &server{cfg: cfg}
	m := mcp.NewServer(&mcp.Implementation{Name: "bgtask", Title: "bgtask", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "bgtask runs commands in the background and wakes the agent that registered them exactly once when they end, " +
			"with the exit code and the output's tail. Register long work with add instead of blocking on it; " +
			"the wake-up comes on its own, so wait only when the result is needed now.",
		// No list-changed notifications: the tasks change all the time, and the
		// tools not at all.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Resources: &mcp.ResourceCapabilities{}},
	})
	s.addRegistrationTools(m)
	s.addTaskTools(m)
	s.addWaitTool(m)
	s.addResources(m)
	return m
}

// call makes a tool's calls with a client of their own, as a client command
// makes its: within Timeout, waiting for a server that is restarting.
func (s *server) call(ctx context.Context, fn func(context.Context, *client.Client) error) error {
	if s.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
	}
	c, err := s.connect(ctx, s.cfg.Timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	return noServer(fn(ctx, c), s.cfg.Timeout)
}

// connect opens a client within ctx, whose bound is bound (0: none): while the
// server does not answer, it waits, and says so once.
func (s *server) connect(ctx context.Context, bound time.Duration) (*client.Client, error) {
	cfg := s.cfg.Client
	cfg.Waiting = func(why error) {
		upTo := ""
		if bound > 0 {
			upTo = " up to " + bound.String()
		}
		fmt.Fprintf(s.cfg.Stderr, "bgtask: waiting%s for the server: %v\n", upTo, why)
	}
	c, err := client.Connect(ctx, cfg)
	return c, noServer(err, bound)
}

// noServer says of a call that waited for a server in vain how long it waited.
func noServer(err error, bound time.Duration) error {
	var absent *client.NoServerError
	if errors.As(err, &absent) && absent.Waited && bound > 0 {
		return &client.Error{Code: 503, Message: fmt.Sprintf("no bgtask server answered within %s: %v", bound, absent.Err)}
	}
	return err
}

// argError is a call's bad argument, named as the API names a bad field.
type argError struct{ field, reason string }

func (e *argError) Error() string { return e.field + ": " + e.reason }

// errorResult is a failed call: its message, and the API's error object as
// `bgtask --json` prints it.
func errorResult(err error) *mcp.CallToolResult {
	obj := &client.Error{Code: 500, Message: err.Error()}
	var apiErr *client.Error
	var argErr *argError
	var fieldErr *engine.FieldError
	switch {
	case errors.As(err, &apiErr):
		obj = apiErr
	case errors.As(err, &argErr):
		obj = &client.Error{Code: 400, Field: argErr.field, Message: argErr.Error()}
	case errors.As(err, &fieldErr):
		obj = &client.Error{Code: 400, Field: fieldErr.Field, Message: fieldErr.Error()}
	case client.ExitStatus(err) == client.ExitNoServer:
		obj.Code = 503
	}
	res := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: obj.Message}},
		StructuredContent: map[string]*client.Error{"error": obj},
	}
	res.SetError(err)
	return res
}
