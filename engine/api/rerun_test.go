package api_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// A rerun is registered by the engine with the task's whole spec, the values of
// its env included, which no reader of the task gets; its key makes it once.
func TestRerunCopiesTheSpecWithItsEnv(t *testing.T) {
	t.Parallel()
	srv, store := serve(t)
	client := api.NewClient(srv.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	env := map[string]string{"TOKEN": "s3cr3t", "PATH": "/usr/bin:/bin"}
	first, err := client.Register(ctx, []byte(`{"command":"make","environment":"caller","env":{"TOKEN":"s3cr3t","PATH":"/usr/bin:/bin"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := client.Get(ctx, first.ID); err != nil || v.Spec.Env["TOKEN"] != engine.HiddenValue {
		t.Fatalf("get shows the env as %q (%v)", v.Spec.Env, err)
	}
	again, err := client.Rerun(ctx, first.ID, "rerun-1")
	if err != nil || !again.Created {
		t.Fatalf("rerun: %+v, %v", again, err)
	}
	state, err := engine.Load(ctx, store, again.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s := state.Spec; !maps.Equal(s.Env, env) || s.Environment != engine.EnvironmentCaller || s.RerunOf != first.ID || s.IdempotencyKey != "rerun-1" {
		t.Errorf("the rerun's spec: env %q, environment %q, rerun_of %q, key %q", s.Env, s.Environment, s.RerunOf, s.IdempotencyKey)
	}
	if same, err := client.Rerun(ctx, first.ID, "rerun-1"); err != nil || same.Created || same.ID != again.ID {
		t.Errorf("the same rerun again: %+v, %v; want task %s, not created", same, err, again.ID)
	}
	if _, err := client.Rerun(ctx, "01a00000-0000-7000-8000-000000000000", ""); err == nil {
		t.Error("a rerun of no task was accepted")
	}
}
