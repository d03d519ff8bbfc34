package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// The routes answer what the NATS API answers, with its JSON and its error
// object, the code as the HTTP status; bad input changes nothing.
func TestRoutesMirrorTheNATSAPI(t *testing.T) {
	h := start(t)
	timer := `{"start_at":"100ms","prompt":"rang","idempotency_key":"k1"}`
	reg := must[api.Registered](t, h.do("POST", "/v1/tasks", timer), 201)
	if again := must[api.Registered](t, h.do("POST", "/v1/tasks", timer), 200); again.ID != reg.ID || again.Created {
		t.Fatalf("the same idempotency key again: %+v, want %s not created", again, reg.ID)
	}
	testkit.Eventually(t, 20*time.Second, "the timer fired", func() bool {
		return must[api.TaskView](t, h.do("GET", "/v1/tasks/"+reg.ID, ""), 200).Phase == engine.PhaseFired
	})
	held := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"command":"true"}`), 201) // no worker: it stays armed
	must[api.TaskView](t, h.do("GET", "/v1/tasks/"+held.ID, ""), 200)                     // a get waits for the projection; a list does not

	page := must[api.ListReply](t, h.do("GET", "/v1/tasks?limit=1", ""), 200)
	if len(page.Tasks) != 1 || page.Tasks[0].ID != held.ID || page.Total != 2 || page.NextCursor == "" {
		t.Fatalf("first page: %+v", page)
	}
	next := must[api.ListReply](t, h.do("GET", "/v1/tasks?limit=1&cursor="+page.NextCursor, ""), 200)
	if len(next.Tasks) != 1 || next.Tasks[0].ID != reg.ID || next.NextCursor != "" {
		t.Fatalf("second page: %+v", next)
	}
	if armed := must[api.ListReply](t, h.do("GET", "/v1/tasks?state=armed", ""), 200); len(armed.Tasks) != 1 || armed.Tasks[0].ID != held.ID {
		t.Fatalf("state=armed: %+v", armed)
	}
	hist := must[api.HistoryReply](t, h.do("GET", "/v1/tasks/"+reg.ID+"/history", ""), 200)
	if len(hist.Events) == 0 || hist.Events[0].Type != events.TypeArmed || hist.Events[len(hist.Events)-1].Type != events.TypeFired {
		t.Fatalf("history: %+v", hist)
	}
	cancelled := must[api.TaskView](t, h.do("POST", "/v1/tasks/"+held.ID+"/cancel", `{"reason":"not needed"}`), 200)
	if cancelled.Phase != engine.PhaseCancelled {
		t.Fatalf("cancel: %s", cancelled.Phase)
	}
	apiError(t, h.do("POST", "/v1/tasks/"+held.ID+"/cancel", ""), 409, "")
	must[api.WorkersReply](t, h.do("GET", "/v1/workers", ""), 200)

	before := must[api.ListReply](t, h.do("GET", "/v1/tasks", ""), 200).Total
	apiError(t, h.do("POST", "/v1/tasks", `{"command":"true","cwd":"relative"}`), 400, "cwd")
	apiError(t, h.do("POST", "/v1/tasks", `{"command":"true","bogus":1}`), 400, "bogus")
	apiError(t, h.do("POST", "/v1/tasks", `{"command":"true","kind":"a","kind":"b"}`), 400, "kind")
	apiError(t, h.do("POST", "/v1/tasks", `{"command":"`+strings.Repeat("x", maxSpecBody)+`"}`), 413, "request")
	apiError(t, h.do("POST", "/v1/tasks/"+reg.ID+"/cancel", `{"reason":"`+strings.Repeat("x", maxSmallBody)+`"}`), 413, "request")
	apiError(t, h.do("POST", "/v1/tasks/"+reg.ID+"/cancel", `{"why":"x"}`), 400, "request")
	apiError(t, h.do("GET", "/v1/tasks/no-such-task", ""), 404, "id")
	apiError(t, h.do("GET", "/v1/tasks/no-such-task/history", ""), 404, "id")
	apiError(t, h.do("GET", "/v1/tasks?status=finished", ""), 400, "status")
	apiError(t, h.do("GET", "/v1/tasks?state=sleeping", ""), 400, "state")
	apiError(t, h.do("GET", "/v1/tasks?limit=-1", ""), 400, "limit")
	apiError(t, h.do("GET", "/v1/tasks?limit=1&limit=2", ""), 400, "limit")
	apiError(t, h.do("GET", "/v1/tasks?cursor=nope", ""), 400, "cursor")
	apiError(t, h.do("GET", "/v1/nothing", ""), 404, "")
	if r := h.do("DELETE", "/v1/tasks/"+reg.ID, ""); r.status != 405 || r.header.Get("Allow") != "GET" {
		t.Fatalf("DELETE of a task: %d, Allow %q", r.status, r.header.Get("Allow"))
	}
	apiError(t, h.do("DELETE", "/v1/tasks/"+reg.ID, ""), 405, "")
	if after := must[api.ListReply](t, h.do("GET", "/v1/tasks", ""), 200).Total; after != before {
		t.Fatalf("bad requests registered tasks: %d, then %d", before, after)
	}
}

func TestTargets(t *testing.T) {
	h := start(t)
	if st := must[targetReply](t, h.do("GET", "/v1/targets/agent-7", ""), 200); st.State != events.TargetIdle {
		t.Fatalf("a target that never said: %+v", st)
	}
	busy := must[targetReply](t, h.do("PUT", "/v1/targets/agent-7", `{"state":"busy","ttl":"10m"}`), 200)
	if busy.State != events.TargetBusy || busy.Until == nil {
		t.Fatalf("busy for 10m: %+v", busy)
	}
	if st := must[targetReply](t, h.do("GET", "/v1/targets/agent-7", ""), 200); st.State != events.TargetBusy || !st.Until.Equal(*busy.Until) {
		t.Fatalf("read back: %+v, want %+v", st, busy)
	}
	all := must[struct{ Targets []targetReply }](t, h.do("GET", "/v1/targets", ""), 200)
	if len(all.Targets) != 1 || all.Targets[0].Name != "agent-7" {
		t.Fatalf("targets: %+v", all)
	}
	apiError(t, h.do("PUT", "/v1/targets/agent-7", `{"state":"asleep"}`), 400, "state")
	apiError(t, h.do("PUT", "/v1/targets/agent-7", `{"state":"idle","ttl":"1m"}`), 400, "ttl")
	apiError(t, h.do("PUT", "/v1/targets/agent-7", `{"state":"busy","ttl":"soon"}`), 400, "ttl")
	apiError(t, h.do("PUT", "/v1/targets/agent-7", `{"state":"busy","ttl":"1000000h"}`), 400, "ttl")
	apiError(t, h.do("GET", "/v1/targets/a.b", ""), 400, "name")
	if st := must[targetReply](t, h.do("GET", "/v1/targets/agent-7", ""), 200); st.State != events.TargetBusy {
		t.Fatalf("bad requests changed the state: %+v", st)
	}
}

// A wake-up read from the inbox stays pending until it is acknowledged; an ack
// token is good only for its own target's inbox.
func TestInboxWithAnExplicitAck(t *testing.T) {
	h := start(t)
	reg := must[api.Registered](t, h.do("POST", "/v1/tasks", `{"start_at":"100ms","prompt":"hello","target":"bot"}`), 201)
	var got struct{ Wakeups []delivered }
	testkit.Eventually(t, 20*time.Second, "the wake-up in the inbox", func() bool {
		got = must[struct{ Wakeups []delivered }](t, h.do("GET", "/v1/targets/bot/inbox?wait=1s", ""), 200)
		return len(got.Wakeups) > 0
	})
	var w events.Wakeup
	if err := json.Unmarshal(got.Wakeups[0].Wakeup, &w); err != nil || w.ID != reg.ID || w.Prompt != "hello" || got.Wakeups[0].Ack == "" {
		t.Fatalf("wake-up %+v (%v)", got.Wakeups, err)
	}
	if again := must[struct{ Wakeups []delivered }](t, h.do("GET", "/v1/targets/bot/inbox", ""), 200); len(again.Wakeups) != 0 {
		t.Fatalf("a wake-up read and not yet acknowledged was read again at once: %+v", again)
	}
	pending := func() int {
		info, err := h.nats.JS.Consumer(context.Background(), events.InboxStreamName, events.InboxConsumerName("bot"))
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ci.NumAckPending
	}
	if n := pending(); n != 1 {
		t.Fatalf("%d pending acks before the ack, want 1", n)
	}
	apiError(t, h.do("POST", "/v1/targets/other/inbox/ack", fmt.Sprintf(`{"acks":[%q]}`, got.Wakeups[0].Ack)), 400, "acks")
	apiError(t, h.do("POST", "/v1/targets/bot/inbox/ack", fmt.Sprintf(`{"acks":[%q]}`, base64.RawURLEncoding.EncodeToString([]byte("bgtask.register")))), 400, "acks")
	apiError(t, h.do("POST", "/v1/targets/bot/inbox/ack", `{"acks":[]}`), 400, "acks")
	if n := pending(); n != 1 {
		t.Fatalf("refused acks acknowledged: %d pending", n)
	}
	acked := must[struct{ Acked int }](t, h.do("POST", "/v1/targets/bot/inbox/ack", fmt.Sprintf(`{"acks":[%q]}`, got.Wakeups[0].Ack)), 200)
	if acked.Acked != 1 || pending() != 0 {
		t.Fatalf("ack: %+v, %d pending", acked, pending())
	}
	apiError(t, h.do("GET", "/v1/targets/bot/inbox?max=1000", ""), 400, "max")
	apiError(t, h.do("GET", "/v1/targets/bot/inbox?wait=1h", ""), 400, "wait")
}
