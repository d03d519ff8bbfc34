package integration

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/events"
)

func TestAuditFindsAForgedSecondFireAndADuplicateWakeup(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home)
	first := add(t, home, "--", "echo one")
	second := add(t, home, "--", "echo two")
	waitFor(t, home, first)
	waitFor(t, home, second)
	auditClean(t, home)

	// Write around bgtask, as one who can write the store could (no identity of
	// the server may): a second fired for the first task, and a second wake-up for
	// the second.
	srv.stop(syscall.SIGTERM)
	js, closeStore := openStore(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fired, err := events.New(first, "intruder", 1, time.Now(), &events.Fired{InboxSeq: 7})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(fired)
	if _, err := js.Publish(ctx, events.TaskSubject(first, events.TypeFired), data); err != nil {
		t.Fatal(err)
	}
	// No message id: JetStream's dedupe would drop a copy that had the task's.
	if _, err := js.Publish(ctx, events.InboxSubject("default"), []byte(`{"id":"`+second+`","status":"succeeded"}`)); err != nil {
		t.Fatal(err)
	}
	closeStore()
	startServer(t, home)

	r := run(t, home, "audit", "--json")
	if r.code != 1 {
		t.Fatalf("audit exit %d, want 1:\n%s%s", r.code, r.stdout, r.stderr)
	}
	var report struct {
		Violations []struct {
			TaskID string `json:"task_id"`
			Rule   string `json:"rule"`
		} `json:"violations"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, v := range report.Violations {
		found[v.Rule] = v.TaskID
	}
	if found["fired-twice"] != first || found["inbox-duplicate"] != second || len(report.Violations) != 2 {
		t.Fatalf("violations = %+v, want fired-twice on %s and inbox-duplicate on %s", report.Violations, first, second)
	}
	if human := run(t, home, "audit"); human.code != 1 || !strings.Contains(human.stdout, "VIOLATION fired-twice task "+first) {
		t.Fatalf("human audit output:\n%s", human.stdout)
	}
}
