package workers_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/workers"
)

// With environment caller the spec's env is the whole environment of the command
// and of its result command: nothing of the worker's, argv[0] looked up in the
// spec's PATH. bgtask's own per-task variables are still set.
func TestACallersEnvironmentIsTheWholeEnvironment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startWorker(t, workers.Config{Env: append(os.Environ(), "WORKER_ONLY=of-the-worker")})
	dir, tools := t.TempDir(), t.TempDir()
	tool := "#!/bin/sh\nenv > \"$1\"\n"
	if err := os.WriteFile(filepath.Join(tools, "dump-env"), []byte(tool), 0o755); err != nil {
		t.Fatal(err)
	}
	id := b.arm(t, engine.Spec{
		Argv: []string{"dump-env", "env"}, Cwd: dir, Environment: engine.EnvironmentCaller,
		Env:    map[string]string{"PATH": tools + ":/usr/bin:/bin", "CALLER_VAR": "of the caller"},
		Result: &engine.Result{Type: engine.ResultCommand, Argv: []string{"dump-env", "result-env"}},
	})
	b.waitFor(t, id, 20*time.Second, "ended", ended)
	for _, name := range []string{"env", "result-env"} {
		env := strings.Split(readFile(t, filepath.Join(dir, name)), "\n")
		for _, want := range []string{"CALLER_VAR=of the caller", "BGTASK_TASK_ID=" + id} {
			if !slices.Contains(env, want) {
				t.Errorf("the %s of a command in its caller's environment lacks %s:\n%s", name, want, strings.Join(env, "\n"))
			}
		}
		for _, kv := range env {
			// The shell sets PWD, and bash SHLVL and _, for itself.
			if v, _, _ := strings.Cut(kv, "="); v == "WORKER_ONLY" || v == "HOME" || v == "USER" {
				t.Errorf("the %s of a command in its caller's environment has the worker's %s", name, kv)
			}
		}
	}
}
