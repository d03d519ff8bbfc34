package engine_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

func TestSpecDiff(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		a, b string
		want []string
	}{
		{"the same", `{"command":"make","cwd":"` + dir + `","idempotency_key":"k"}`, `{"idempotency_key":"k","cwd":"` + dir + `","command":"make"}`, nil},
		{"another command", `{"command":"echo first"}`, `{"command":"echo second"}`, []string{"command"}},
		{"command against argv", `{"command":"make"}`, `{"argv":["make"]}`, []string{"command", "argv"}},
		{"another cwd", `{"command":"make"}`, `{"command":"make","cwd":"` + dir + `"}`, []string{"cwd"}},
		{"fields in spec order", `{"command":"a","target":"t1","kind":"x"}`, `{"kind":"y","target":"t2","command":"b"}`, []string{"command", "kind", "target"}},
		{"origin spaced otherwise", `{"command":"make","origin":{"a":1,"b":[1,2]}}`, `{"command":"make","origin":{ "a": 1, "b": [1, 2] }}`, nil},
		{"another origin", `{"command":"make","origin":{"a":1}}`, `{"command":"make","origin":{"a":2}}`, []string{"origin"}},
		{"empty env as none", `{"command":"make","env":{}}`, `{"command":"make"}`, nil},
		{"env keys in another order", `{"command":"make","env":{"A":"1","B":"2"}}`, `{"command":"make","env":{"B":"2","A":"1"}}`, nil},
		{"another env value", `{"command":"make","env":{"A":"1"}}`, `{"command":"make","env":{"A":"2"}}`, []string{"env"}},
		{"another caller's environment", `{"command":"make","environment":"caller","env":{"A":"1"}}`, `{"command":"make","environment":"caller","env":{"A":"2","B":"3"}}`, nil},
		{"caller against login environment", `{"command":"make","environment":"caller","env":{"A":"1"}}`, `{"command":"make","env":{"A":"1"}}`, []string{"environment"}},
		{"login environment named", `{"command":"make","environment":"login"}`, `{"command":"make"}`, nil},
		{"default target named", `{"command":"make"}`, `{"command":"make","target":"default"}`, nil},
		{"exit completion as none", `{"command":"make","completion":{"type":"exit"}}`, `{"command":"make"}`, nil},
		{"json_line numbers as written", `{"command":"w","completion":{"type":"json_line","match":{"n":1.0}}}`, `{"command":"w","completion":{"type":"json_line","match":{"n":1.0}}}`, nil},
		{"json_line another number", `{"command":"w","completion":{"type":"json_line","match":{"n":1}}}`, `{"command":"w","completion":{"type":"json_line","match":{"n":2}}}`, []string{"completion"}},
		{"the same absolute deadline", `{"command":"make","deadline":"2026-12-01T10:00:00Z"}`, `{"command":"make","deadline":"2026-12-01T11:00:00+01:00"}`, nil},
		{"another deadline", `{"command":"make","deadline":"1h"}`, `{"command":"make","deadline":"2h"}`, []string{"deadline"}},
		{"another sink", `{"command":"make","deliver":[{"type":"exec","argv":["notify"]}]}`, `{"command":"make","deliver":[{"type":"exec","argv":["notify","x"]}]}`, []string{"deliver"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, err := engine.ParseSpecAt([]byte(tc.a), at)
			if err != nil {
				t.Fatal(err)
			}
			b, err := engine.ParseSpecAt([]byte(tc.b), at)
			if err != nil {
				t.Fatal(err)
			}
			got, err := engine.SpecDiff(a, b)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("SpecDiff = %q, want %q", got, tc.want)
			}
		})
	}
}

// The same idempotency key with another spec is refused, naming the fields that
// differ, and appends nothing; the same request again, later, still names the task.
func TestRegisterRefusesAKeyWithAnotherSpec(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	svc := engine.NewService(b.store, engineWriter, engine.Base{Now: func() time.Time { return clock }})
	dir := t.TempDir()
	first := `{"command":"echo first","cwd":"` + dir + `","deadline":"30m","idempotency_key":"deploy-7"}`
	id, created, err := svc.Register(ctx, []byte(first))
	if err != nil || !created {
		t.Fatalf("Register = %q, %v, %v", id, created, err)
	}
	clock = clock.Add(time.Minute) // a retry comes later: its relative deadline counts from the first
	for _, tc := range []struct {
		name, spec string
		fields     []string
	}{
		{"another command", `{"command":"echo second","cwd":"` + dir + `","deadline":"30m","idempotency_key":"deploy-7"}`, []string{"command"}},
		{"another cwd and deadline", `{"command":"echo first","deadline":"31m","idempotency_key":"deploy-7"}`, []string{"cwd", "deadline"}},
		{"an origin more", `{"command":"echo first","cwd":"` + dir + `","deadline":"30m","idempotency_key":"deploy-7","origin":{"turn":2}}`, []string{"origin"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, created, err := svc.Register(ctx, []byte(tc.spec))
			var conflict *engine.KeyConflictError
			if !errors.As(err, &conflict) || !errors.Is(err, engine.ErrKeyConflict) {
				t.Fatalf("Register = %q, %v, %v; want a KeyConflictError", got, created, err)
			}
			if conflict.ID != id || conflict.Key != "deploy-7" || !slices.Equal(conflict.Fields, tc.fields) {
				t.Fatalf("conflict %+v, want task %s, key deploy-7, fields %q", conflict, id, tc.fields)
			}
		})
	}
	again, created, err := svc.Register(ctx, []byte(first))
	if err != nil || created || again != id {
		t.Fatalf("the same request again = %q, %v, %v; want %s, not created", again, created, err, id)
	}
	if got := b.msgs(t, events.StreamName); got != 1 {
		t.Fatalf("event stream holds %d messages, want 1", got)
	}
}
