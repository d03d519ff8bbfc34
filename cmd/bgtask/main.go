// Command bgtask is a durable supervisor for background work that someone is waiting
// on: it runs a command, watches it, and wakes the caller exactly once when it ends.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/engine/server"
	"github.com/bgtask/bgtask/workers/shim"
)

func main() {
	// A descriptor bgtask inherited (a pipe its caller reads, say) would otherwise
	// pass to the shim, which outlives the server by design, and whoever reads
	// that pipe would see no end while a task ran.
	shim.KeepInherited()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var exit *exitError
	if errors.As(err, &exit) {
		os.Exit(exit.code) // Run has reported it
	}
}

// exitError carries a specific exit status; a nil err prints nothing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// classify maps an error of a command to its exit status and the error object that
// reports it (nil: nothing to report, as for a task that did not succeed).
func classify(err error) (int, *api.Error) {
	var exit *exitError
	var apiErr *api.Error
	switch {
	case errors.As(err, &exit):
		if exit.err == nil {
			return exit.code, nil
		}
		if errors.As(exit.err, &apiErr) {
			return exit.code, apiErr
		}
		return exit.code, &api.Error{Code: client.CodeOfStatus(exit.code), Message: exit.err.Error()}
	case errors.As(err, new(*server.BadOption)):
		return client.ExitUsage, &api.Error{Code: client.CodeOfStatus(client.ExitUsage), Message: err.Error()}
	case errors.As(err, &apiErr):
		return client.StatusOfCode(apiErr.Code), apiErr
	case errors.As(err, new(*client.NoServerError)), errors.Is(err, api.ErrNoServer):
		return client.ExitNoServer, &api.Error{Code: 503, Message: err.Error()}
	case isUsageError(err):
		return client.ExitUsage, &api.Error{Code: 400, Message: err.Error()}
	}
	return client.ExitFailure, &api.Error{Code: 500, Message: err.Error()}
}

// report prints a command's error, as the API's error object on stdout when the
// command was asked for JSON, else as one line on stderr, and returns it with its
// exit status.
func report(err error, asJSON bool, stdout, stderr io.Writer) error {
	if err == nil {
		return nil
	}
	status, obj := classify(err)
	switch {
	case obj == nil:
	case asJSON:
		_ = printJSON(stdout, struct {
			Error *api.Error `json:"error"`
		}{obj})
	default:
		fmt.Fprintln(stderr, "bgtask:", obj.Message)
	}
	return &exitError{code: status, err: err}
}
