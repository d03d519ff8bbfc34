package engine_test

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

func TestDeliverySpecsAreValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, field, reason string }{
		{`{"command":"x","policy":"later"}`, "policy", "want queue, defer_idle or immediate"},
		{`{"command":"x","deliver":[{"url":"http://h/"}]}`, "deliver[0].type", "required"},
		{`{"command":"x","deliver":[{"type":"email"}]}`, "deliver[0].type", `"email"`},
		{`{"command":"x","deliver":[{"type":"webhook"}]}`, "deliver[0].url", "required"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"ftp://h/x"}]}`, "deliver[0].url", "http or https"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http:///x"}]}`, "deliver[0].url", "no host"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"https://u:p@h/x"}]}`, "deliver[0].url", "credentials"},
		{`{"command":"x","deliver":[{"type":"webhook","url":"http://h/","argv":["a"]}]}`, "deliver[0].argv", "only with type exec"},
		{`{"command":"x","deliver":[{"type":"exec"}]}`, "deliver[0].argv", "needs an argv"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a","{{nope}}"]}]}`, "deliver[0].argv", "argv[1]: unknown placeholder {{nope}}"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"url":"http://h/"}]}`, "deliver[0].url", "only with type webhook"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"timeout":"2h"}]}`, "deliver[0].timeout", "over the limit"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"timeout":"soon"}]}`, "deliver[0].timeout", "not a duration"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"max_attempts":21}]}`, "deliver[0].max_attempts", "want 1 to 20"},
		{`{"command":"x","deliver":[{"type":"exec","argv":["a"],"retries":2}]}`, "deliver[0].retries", "unknown field"},
		{`{"command":"x","prompt":"{{prompt}}"}`, "prompt", "unknown placeholder {{prompt}}"},
		{`{"command":"x","deliver":[` + strings.Repeat(`{"type":"exec","argv":["a"]},`, 8) + `{"type":"exec","argv":["a"]}]}`, "deliver", "at most 8"},
	} {
		_, err := engine.ParseSpec([]byte(tc.spec))
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("ParseSpec(%s) = %v, want field %s: ...%s...", tc.spec, err, tc.field, tc.reason)
		}
	}
	spec := mustSpec(t, `{"command":"x","deliver":[{"type":"exec","argv":["notify","{{prompt}}","{{origin.chat}}"]},{"type":"webhook","url":"https://h.example/x"}]}`)
	if spec.DeliveryPolicy() != engine.PolicyQueue || spec.Deliver[0].AttemptTimeout() != engine.DefaultExecTimeout ||
		spec.Deliver[1].AttemptTimeout() != engine.DefaultWebhookTimeout || spec.Deliver[1].RetryWindow() != engine.DefaultRetryFor {
		t.Fatalf("defaults of %+v", spec)
	}
}

const (
	hookSpec = `{"command":"make","target":"agent","deliver":[{"type":"webhook","url":"http://127.0.0.1:1/hook","max_attempts":2}]}`
	engineB  = "engine-b"
)

var (
	me      = engine.Engine{Writer: engineWriter, Instance: "run-2"}
	meEarly = engine.Engine{Writer: engineWriter, Instance: "run-1"}
	other   = engine.Engine{Writer: engineB, Instance: "b-1"}
)

// fired returns a task of spec driven to fired.
func fired(t *testing.T, id, spec string) *fold {
	t.Helper()
	f := newFold(t, id, mustSpec(t, spec))
	f.do(engineWriter, engine.Arm{Spec: f.spec})
	f.do(workerA, engine.Spawn{Host: "host-a"})
	f.do(workerA, engine.Exit{Run: exitRun(0, "", "ok")})
	f.do(engineWriter, engine.PersistCompletion{})
	f.do(engineWriter, engine.Fire{InboxSeq: 1})
	return f
}

func TestASinkIsClaimedOnceRetriedAndEndsDeliveredOrFailed(t *testing.T) {
	t.Parallel()
	f := fired(t, taskID, hookSpec)
	if got := f.state.Deliveries; len(got) != 1 || got[0].Type != engine.SinkWebhook || f.state.FiredSeq != f.seq {
		t.Fatalf("a fired task's sinks: %+v (fired at %d)", got, f.state.FiredSeq)
	}
	f.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	// While the claim holds, no other engine claims the sink.
	if _, err := engine.Decide(f.state, engine.ClaimDelivery{Sink: 0, Engine: other}, engine.Meta{Writer: engineB, Now: f.now}); !errors.Is(err, engine.ErrNotOwner) {
		t.Fatalf("a second claim while the first holds: %v", err)
	}
	claim := f.state.Deliveries[0].Claim
	if late := f.event(engineB, 0, &events.DeliveryAttempt{Sink: 0, Attempt: 2, Instance: other.Instance, Until: f.now.Add(time.Minute)}); f.record(late) == nil {
		t.Fatal("a claim over a live claim was applied")
	}
	// Only the claimant reports the attempt.
	if _, err := engine.Decide(f.state, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}}, engine.Meta{Writer: engineB, Now: f.now}); !errors.Is(err, engine.ErrNotOwner) {
		t.Fatalf("a result from an engine without the claim: %v", err)
	}
	f.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{HTTPStatus: 500, Error: "500 Internal Server Error"}, Backoff: time.Second})
	k := f.state.Deliveries[0]
	if k.Claim != nil || k.RetryAt == nil || !k.RetryAt.Equal(f.now.Add(time.Second)) || k.Done() || claim.Attempt != 1 {
		t.Fatalf("after a failed first attempt: %+v", k)
	}
	f.do(engineB, engine.ClaimDelivery{Sink: 0, Engine: other}) // any engine takes the retry
	f.do(engineB, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{HTTPStatus: 503, Error: "503"}, Backoff: time.Second})
	if k := f.state.Deliveries[0]; !k.GivingUp || k.RetryAt != nil || k.Attempts != 2 {
		t.Fatalf("the last attempt (max_attempts 2) failed: %+v", k)
	}
	if _, err := engine.Decide(f.state, engine.ClaimDelivery{Sink: 0, Engine: me}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a third attempt: %v", err)
	}
	ev := f.do(engineWriter, engine.GiveUpDelivery{Sink: 0})
	p, _ := ev.Decode()
	if got := p.(*events.DeliveryFailed); got.Attempts != 2 || got.Reason != "503" || !f.state.Deliveries[0].Failed || !f.state.Acknowledged() {
		t.Fatalf("delivery-failed %+v, state %+v", got, f.state.Deliveries[0])
	}

	g := fired(t, "task-2", hookSpec)
	g.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	g.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{HTTPStatus: 404, Permanent: true, Error: "404"}, Backoff: time.Second})
	if k := g.state.Deliveries[0]; !k.GivingUp || k.Attempts != 1 {
		t.Fatalf("a permanent failure is the last attempt: %+v", k)
	}
	h := fired(t, "task-3", hookSpec)
	h.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	h.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true, HTTPStatus: 204}})
	if k := h.state.Deliveries[0]; !k.Delivered || !h.state.Acknowledged() {
		t.Fatalf("delivered: %+v", k)
	}
	if _, err := engine.Decide(h.state, engine.ClaimDelivery{Sink: 0, Engine: me}, engine.Meta{Writer: engineWriter, Now: h.now}); err == nil {
		t.Fatal("a delivered sink was claimed again")
	}
	if again, _ := engine.Replay(h.history); !reflect.DeepEqual(again, h.state) {
		t.Fatalf("replay differs from the live state:\n%+v\n%+v", again, h.state)
	}
}

func TestAClaimThatDiedWithItsEngineIsTakenOver(t *testing.T) {
	t.Parallel()
	f := fired(t, taskID, hookSpec)
	f.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: meEarly})
	until := f.state.Deliveries[0].Claim.Until
	// The same engine, started again, knows its earlier claim died with it.
	f.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	if k := f.state.Deliveries[0]; k.Attempts != 2 || k.Claim.Instance != me.Instance {
		t.Fatalf("after the restart's claim: %+v", k)
	}
	// Another engine waits for the claim to expire.
	if _, err := engine.Decide(f.state, engine.ClaimDelivery{Sink: 0, Engine: other}, engine.Meta{Writer: engineB, Now: until.Add(-time.Second)}); !errors.Is(err, engine.ErrNotOwner) {
		t.Fatalf("a claim before the live one expired: %v", err)
	}
	f.now = f.state.Deliveries[0].Claim.Until.Add(time.Millisecond)
	f.do(engineB, engine.ClaimDelivery{Sink: 0, Engine: other})
	if k := f.state.Deliveries[0]; k.Attempts != 3 || k.ClaimedBy != engineB {
		t.Fatalf("after the expired claim was taken over: %+v", k)
	}
}

// plannedTask is a fired task of the target "agent" with one webhook and a policy.
func plannedTask(t *testing.T, id, policy string) *fold {
	t.Helper()
	return fired(t, id, `{"command":"make","target":"agent","policy":"`+policy+`","deliver":[{"type":"webhook","url":"http://127.0.0.1:1/hook"}]}`)
}

func TestPlanTargetAppliesThePolicies(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Hour)
	idle := events.TargetState{State: events.TargetIdle}
	busy := events.TargetState{State: events.TargetBusy}
	states := func(fs ...*fold) []engine.State {
		var out []engine.State
		for _, f := range fs {
			out = append(out, f.state)
		}
		return out
	}
	starts := func(p engine.Plan) []string {
		var ids []string
		for _, push := range p.Start {
			ids = append(ids, push.TaskID)
		}
		return ids
	}
	q1, q2, q3 := plannedTask(t, "q1", "queue"), plannedTask(t, "q2", "queue"), plannedTask(t, "q3", "queue")

	if p := engine.PlanTarget(states(q1, q2), busy, me, now); len(p.Start) != 0 || !reflect.DeepEqual(p.Held, []string{"q1", "q2"}) {
		t.Fatalf("queue, busy: %+v", p)
	}
	// Idle since before they fired: every wake-up goes now, in the order they fired;
	// none waits for another.
	if p := engine.PlanTarget(states(q1, q2, q3), idle, me, now); !reflect.DeepEqual(starts(p), []string{"q1", "q2", "q3"}) || len(p.Held) != 0 {
		t.Fatalf("queue, idle: %+v", p)
	}
	q1.now = now
	q1.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	if p := engine.PlanTarget(states(q1, q2, q3), idle, me, now); !reflect.DeepEqual(starts(p), []string{"q2", "q3"}) || !p.Next.Equal(q1.state.Deliveries[0].Claim.Until) {
		t.Fatalf("queue, the first in flight: %+v", p)
	}
	q1.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{Error: "refused"}, Backoff: time.Minute})
	retry := *q1.state.Deliveries[0].RetryAt
	if p := engine.PlanTarget(states(q1, q2, q3), idle, me, now); !reflect.DeepEqual(starts(p), []string{"q2", "q3"}) || !p.Next.Equal(retry) {
		t.Fatalf("queue, the first waiting for a retry: %+v", p)
	}
	if p := engine.PlanTarget(states(q1, q2, q3), idle, me, retry); !reflect.DeepEqual(starts(p), []string{"q1", "q2", "q3"}) {
		t.Fatalf("queue, the retry due: %+v", p)
	}

	// Held while the target was busy, and idle now: one after another, in order.
	h1, h2, h3 := plannedTask(t, "h1", "queue"), plannedTask(t, "h2", "queue"), plannedTask(t, "h3", "queue")
	idleAgain := events.TargetState{State: events.TargetIdle, Since: now}
	if p := engine.PlanTarget(states(h1, h2, h3), idleAgain, me, now); !reflect.DeepEqual(starts(p), []string{"h1"}) || !reflect.DeepEqual(p.Held, []string{"h2", "h3"}) {
		t.Fatalf("queue, idle again after holding: %+v", p)
	}
	h1.now = now
	h1.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	if p := engine.PlanTarget(states(h1, h2, h3), idleAgain, me, now); len(p.Start) != 0 || !reflect.DeepEqual(p.Held, []string{"h2", "h3"}) {
		t.Fatalf("queue, the first held one in flight: %+v", p)
	}
	// One that fired after the target became idle does not wait for the held ones.
	fresh := plannedTask(t, "fresh", "queue")
	fresh.state.FiredAt = &now
	if p := engine.PlanTarget(states(h1, h2, h3, fresh), idleAgain, me, now); !reflect.DeepEqual(starts(p), []string{"fresh"}) {
		t.Fatalf("queue, fired while idle, behind a drain: %+v", p)
	}
	h1.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}})
	if p := engine.PlanTarget(states(h1, h2, h3), idleAgain, me, now); !reflect.DeepEqual(starts(p), []string{"h2"}) || !reflect.DeepEqual(p.Held, []string{"h3"}) {
		t.Fatalf("queue, the first held one delivered: %+v", p)
	}
	// A busy state whose until ran out became idle then.
	expired := events.TargetState{State: events.TargetBusy, Until: &now}
	if p := engine.PlanTarget(states(h2, h3), expired, me, now.Add(time.Second)); !reflect.DeepEqual(starts(p), []string{"h2"}) {
		t.Fatalf("queue, after a busy until: %+v", p)
	}

	// defer_idle also waits until every earlier wake-up is acknowledged.
	d := plannedTask(t, "d", "defer_idle")
	if p := engine.PlanTarget(states(q1, d), idle, me, now); len(p.Start) != 0 || !reflect.DeepEqual(p.Held, []string{"d"}) {
		t.Fatalf("defer_idle behind an unacknowledged wake-up: %+v", p)
	}
	if p := engine.PlanTarget(states(d), idle, me, now); !reflect.DeepEqual(starts(p), []string{"d"}) {
		t.Fatalf("defer_idle alone, idle: %+v", p)
	}
	// Two of them on an idle target: the second waits for the first to be delivered.
	d2 := plannedTask(t, "d2", "defer_idle")
	if p := engine.PlanTarget(states(d, d2), idle, me, now); !reflect.DeepEqual(starts(p), []string{"d"}) || !reflect.DeepEqual(p.Held, []string{"d2"}) {
		t.Fatalf("defer_idle behind another, idle: %+v", p)
	}
	d.now = now
	d.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	if p := engine.PlanTarget(states(d, d2), idle, me, now); len(p.Start) != 0 || !reflect.DeepEqual(p.Held, []string{"d2"}) {
		t.Fatalf("defer_idle behind one in flight: %+v", p)
	}
	d.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}})
	if p := engine.PlanTarget(states(d, d2), idle, me, now); !reflect.DeepEqual(starts(p), []string{"d2"}) {
		t.Fatalf("defer_idle after the one before was delivered: %+v", p)
	}
	if p := engine.PlanTarget(states(d), busy, me, now); len(p.Start) != 0 {
		t.Fatalf("defer_idle, busy: %+v", p)
	}

	// immediate ignores the target and the queue.
	i := plannedTask(t, "i", "immediate")
	if p := engine.PlanTarget(states(q2, q3, i), busy, me, now); !reflect.DeepEqual(starts(p), []string{"i"}) {
		t.Fatalf("immediate, busy: %+v", p)
	}

	// A busy state with an end: held until then, and looked at again then.
	until := now.Add(30 * time.Second)
	busyFor := events.TargetState{State: events.TargetBusy, Until: &until}
	if p := engine.PlanTarget(states(q2), busyFor, me, now); len(p.Start) != 0 || !p.Next.Equal(until) {
		t.Fatalf("busy until: %+v", p)
	}
	if p := engine.PlanTarget(states(q2), busyFor, me, until); !reflect.DeepEqual(starts(p), []string{"q2"}) {
		t.Fatalf("after busy until: %+v", p)
	}

	// A claim of an earlier run of this engine is dead: the sink is due again.
	r := plannedTask(t, "r", "queue")
	r.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: meEarly})
	if p := engine.PlanTarget(states(r), idle, me, r.now); !reflect.DeepEqual(starts(p), []string{"r"}) {
		t.Fatalf("an orphaned claim: %+v", p)
	}
	// A sink whose last attempt failed is given up, whatever the target.
	g := plannedTask(t, "g", "queue")
	g.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	g.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{Permanent: true, Error: "404"}})
	if p := engine.PlanTarget(states(g), busy, me, now); len(p.GiveUp) != 1 || len(p.Start) != 0 {
		t.Fatalf("giving up: %+v", p)
	}
}

func TestArgvIsRenderedWithThePromptAndOrigin(t *testing.T) {
	t.Parallel()
	code := 2
	w := events.Wakeup{ID: "t1", Status: "failed", ExitCode: &code, Prompt: "the prompt", Origin: []byte(`{"chat":9007199254740993,"s":"x y"}`)}
	got := engine.RenderArgv([]string{"send", "--to={{origin.chat}}", "{{prompt}}", "{{task_id}}:{{exit_code}}", "{{origin.s}}"}, w)
	want := []string{"send", "--to=9007199254740993", "the prompt", "t1:2", "x y"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RenderArgv = %q, want %q", got, want)
	}
}

func TestNonPublicRanges(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1":            "loopback",
		"127.255.0.9":          "loopback",
		"::1":                  "loopback",
		"::ffff:127.0.0.1":     "loopback",
		"169.254.169.254":      "link-local",
		"fe80::1":              "link-local",
		"10.1.2.3":             "private",
		"172.16.0.1":           "private",
		"172.31.255.255":       "private",
		"192.168.1.1":          "private",
		"fd00:ec2::254":        "private",
		"0.0.0.0":              "unspecified",
		"::":                   "unspecified",
		"0.1.2.3":              "this-network",
		"100.100.100.200":      "carrier-grade NAT",
		"224.0.0.251":          "link-local",
		"239.1.1.1":            "non-unicast",
		"255.255.255.255":      "non-unicast",
		"240.0.0.1":            "reserved",
		"64:ff9b::a9fe:a9fe":   "link-local",
		"2002:7f00:1::":        "loopback",
		"8.8.8.8":              "",
		"172.32.0.1":           "",
		"100.128.0.1":          "",
		"2606:4700:4700::1111": "",
		"::ffff:93.184.216.34": "",
		"64:ff9b::5db8:d822":   "",
	} {
		if got := engine.NonPublic(netip.MustParseAddr(addr)); got != want {
			t.Errorf("NonPublic(%s) = %q, want %q", addr, got, want)
		}
	}
}

// TestCheckPublicWebhooks: what --webhook-deny-private can tell from the URL alone
// is refused at registration, with the sink's url named.
func TestCheckPublicWebhooks(t *testing.T) {
	t.Parallel()
	for url, refused := range map[string]bool{
		"http://127.0.0.1:8080/hook":       true,
		"http://169.254.169.254/latest/":   true,
		"http://[::1]/":                    true,
		"http://[fd00:ec2::254]/":          true,
		"http://[::ffff:10.0.0.1]/":        true,
		"http://LOCALHOST./":               true,
		"http://api.localhost:9/":          true,
		"https://hooks.example.com/bgtask": false,
		"https://8.8.8.8/":                 false,
		"http://localhost.example.com/":    false,
	} {
		spec, err := engine.ParseSpec([]byte(`{"command":"x","deliver":[{"type":"exec","argv":["true"]},{"type":"webhook","url":"` + url + `"}]}`))
		if err != nil {
			t.Fatalf("ParseSpec(%s): %v", url, err)
		}
		err = engine.CheckPublicWebhooks(spec)
		var fe *engine.FieldError
		switch {
		case refused && (!errors.As(err, &fe) || fe.Field != "deliver[1].url" || !strings.Contains(fe.Reason, "--webhook-deny-private")):
			t.Errorf("%s: %v, want it refused on deliver[1].url", url, err)
		case !refused && err != nil:
			t.Errorf("%s: %v, want it accepted", url, err)
		}
	}
}
