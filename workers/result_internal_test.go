package workers

import (
	"context"
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// A run whose environment cannot be read gets no result: its result command does
// not run in the worker's own environment instead.
func TestAResultCommandDoesNotRunWithoutTheRunsEnvironment(t *testing.T) {
	out, _, why := resultCommand(context.Background(), engine.Result{Type: engine.ResultCommand, Argv: []string{"/usr/bin/env"}}, nil, t.TempDir())
	if out != "" || why == "" {
		t.Fatalf("result %q, error %q; want none, and why", out, why)
	}
	out, _, why = resultCommand(context.Background(), engine.Result{Type: engine.ResultCommand, Argv: []string{"/usr/bin/env"}}, []string{"RUN_VAR=1"}, t.TempDir())
	if out != "RUN_VAR=1\n" || why != "" {
		t.Fatalf("result %q, error %q; want the run's environment", out, why)
	}
}
