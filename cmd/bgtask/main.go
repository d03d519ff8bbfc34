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

	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/workers/shim"
)

func main() {
	// A descriptor bgtask inherited (a pipe its caller reads, say) would otherwise
	// pass to each shim, which outlives the server by design, and whoever reads
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

// The exit statuses, one per kind of failure, so that a script can tell them apart.
// docs/cli.md lists them; a new one goes there too.
const (
	exitFailure       = 1   // anything else: the server failed the request, a local I/O error
	exitUsage         = 2   // a bad command line, or input the engine rejected (its 400)
	exitTaskFailed    = 3   // wait: the task ended without succeeding
	exitTaskCancelled = 4   // wait: the task was cancelled
	exitNotFound      = 5   // no such task (the API's 404)
	exitConflict      = 6   // the task's state does not allow it (the API's 409)
	exitNoServer      = 7   // no bgtask server answered within --timeout, or none ever ran in the home
	exitTimeout       = 124 // wait: --timeout passed before the task ended, as timeout(1)
)

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

// statusOfAPICode is the exit status of an error the API answered with.
func statusOfAPICode(code int) int {
	switch code {
	case 400, api.CodeAmbiguous:
		return exitUsage
	case 404:
		return exitNotFound
	case 409:
		return exitConflict
	case 503:
		return exitNoServer
	}
	return exitFailure
}

// apiCodeOfStatus is the code of the error object printed for a failure of the CLI's
// own, in the API's terms.
func apiCodeOfStatus(status int) int {
	switch status {
	case exitUsage:
		return 400
	case exitNotFound:
		return 404
	case exitConflict:
		return 409
	case exitNoServer:
		return 503
	case exitTimeout:
		return 504
	}
	return 500
}

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
		return exit.code, &api.Error{Code: apiCodeOfStatus(exit.code), Message: exit.err.Error()}
	case errors.As(err, &apiErr):
		return statusOfAPICode(apiErr.Code), apiErr
	case errors.Is(err, api.ErrNoServer):
		return exitNoServer, &api.Error{Code: 503, Message: err.Error()}
	case isUsageError(err):
		return exitUsage, &api.Error{Code: 400, Message: err.Error()}
	}
	return exitFailure, &api.Error{Code: 500, Message: err.Error()}
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
