package integration

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// The first registration after the event store's disk has filled, the first
// write that fails for it, is refused at once with the reason, as every one after
// it is: it is not left waiting for an acknowledgement that JetStream does not
// give for a write it could not make. Once the disk has room, the same spec is
// registered, once.
func TestTheFirstRegistrationOnAFullDiskIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	mountTmpfs(t, home, diskBytes)
	srv := startServer(t, home)
	nc, _ := connect(t, home)
	spec, err := json.Marshal(map[string]any{"command": "exit 3", "cwd": dir})
	if err != nil {
		t.Fatal(err)
	}
	ballast := fillDisk(t, home)
	start := time.Now()
	msg, err := nc.Request("bgtask.register", spec, 10*time.Second)
	if err != nil {
		t.Fatalf("register on a full disk: no answer after %s: %v", time.Since(start), err)
	}
	var reply struct {
		ID    string
		Error *registrationError
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.Error == nil || reply.Error.Code != 507 || !strings.Contains(reply.Error.Message, "disk is full") || time.Since(start) > 5*time.Second {
		t.Fatalf("register on a full disk: %s after %s, want a 507 refusal at once", msg.Data, time.Since(start))
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	tr := &trial{t: t, plan: trialPlan{tasks: []trialTask{{kind: exitsWithCode, code: 3}}}, home: home, dir: dir, server: srv, began: time.Now()}
	makeGate(t, dir, gateName(0))
	openGate(t, dir, gateName(0))
	id := tr.registerRefused(nc, 0)
	if w := waitFor(t, home, id); w.ExitCode == nil || *w.ExitCode != 3 {
		t.Fatalf("the task registered once the disk had room: %+v, want exit code 3", w)
	}
	r := run(t, home, "audit", "--json")
	if report := decodeJSON[struct{ Fired int }](t, r.stdout); r.code != 0 || report.Fired != 1 {
		t.Fatalf("audit (exit %d), want one task fired and no violation:\n%s%s", r.code, r.stdout, r.stderr)
	}
}
