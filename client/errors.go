package client

import (
	"context"
	"errors"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// Error is a request the server refused: Code is the API's (400 bad input, 404
// no such task, 409 not possible in the task's state, 422 a part of an id that
// several tasks' ids have, 503 no engine, 507 no room), Field names the spec or
// request field at fault.
type Error = api.Error

// NoServerError says that no server answered a call.
type NoServerError struct {
	// Err is why: the last failure of the call or the connection.
	Err error
	// Waited: the client waited for the server until the call's context ended.
	Waited bool
	// Gone: the home's server is gone and nothing will start it again (no
	// process holds the home's lock, and no supervisor restarts it). Never: no
	// server ever ran in the home.
	Gone, Never bool
	// MayHaveRun: the connection dropped during a call that must not be made
	// twice, which the server may or may not have carried out.
	MayHaveRun bool
}

func (e *NoServerError) Error() string {
	switch {
	case e.MayHaveRun:
		return "the connection to the server dropped during the request, which may or may not have been carried out: " + e.Err.Error()
	case e.Waited:
		return "no bgtask server answered: " + e.Err.Error()
	}
	return e.Err.Error()
}

func (e *NoServerError) Unwrap() error { return e.Err }

// The exit statuses of the bgtask command, one per kind of failure, so that a
// script can tell them apart (docs/cli.md). ExitStatus maps an error to its own.
const (
	ExitFailure       = 1   // anything else
	ExitUsage         = 2   // a bad command line, or input the engine refused (its 400, 422)
	ExitTaskFailed    = 3   // a task waited for ended without succeeding
	ExitTaskCancelled = 4   // a task waited for was cancelled
	ExitNotFound      = 5   // no such task (404)
	ExitConflict      = 6   // not possible in the task's state (409)
	ExitNoServer      = 7   // no server answered (503)
	ExitTimeout       = 124 // a wait's time passed before the task ended, as timeout(1)
)

// ExitStatus is the exit status of err in the bgtask command's terms: 0 for nil.
func ExitStatus(err error) int {
	var apiErr *api.Error
	switch {
	case err == nil:
		return 0
	case errors.As(err, new(*NoServerError)), errors.Is(err, api.ErrNoServer):
		return ExitNoServer
	case errors.As(err, &apiErr):
		return StatusOfCode(apiErr.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return ExitTimeout
	}
	return ExitFailure
}

// StatusOfCode is the exit status of an error the API answered with code.
func StatusOfCode(code int) int {
	switch code {
	case 400, api.CodeAmbiguous:
		return ExitUsage
	case 404:
		return ExitNotFound
	case 409:
		return ExitConflict
	case 503:
		return ExitNoServer
	}
	return ExitFailure
}

// CodeOfStatus is the API's code for a failure of exit status: an error object
// for a failure of the client's own.
func CodeOfStatus(status int) int {
	switch status {
	case ExitUsage:
		return 400
	case ExitNotFound:
		return 404
	case ExitConflict:
		return 409
	case ExitNoServer:
		return 503
	case ExitTimeout:
		return 504
	}
	return 500
}

// OutcomeStatus is the exit status of a task that ended with status: 0 when it
// succeeded, so that `bgtask wait ID && next` runs next only then.
func OutcomeStatus(status string) int {
	switch status {
	case engine.StatusSucceeded:
		return 0
	case engine.StatusCancelled:
		return ExitTaskCancelled
	}
	return ExitTaskFailed
}
