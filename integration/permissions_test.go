package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
)

// violations collects the permission violations a connection is told of.
type violations chan error

func (v violations) handler() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			v <- err
		}
	})
}

// refused waits for the violation of a publish to subject.
func (v violations) refused(t *testing.T, subject string) {
	t.Helper()
	for {
		select {
		case err := <-v:
			if strings.Contains(err.Error(), subject) {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no permissions violation for a publish to %s", subject)
		}
	}
}

// The shipped permissions: the client identity registers, waits and reads its own
// inbox but cannot write an event; the worker identity cannot register; and an
// engine told that clients use an identity that can write events refuses to run.
func TestPermissionsKeepClientsAndWorkersToTheirPart(t *testing.T) {
	t.Parallel()
	d := startDeployment(t, 3)

	// The engine identity can write events: a server told clients use it refuses.
	r := d.runEnv(t, "engine", []string{"BGTASK_CLIENT_PASSWORD=" + d.passwords["engine"]},
		"server", "--no-worker", "--replicas", "3", "--client-user", "engine")
	if r.code == 0 || !strings.Contains(r.stderr, "refusing to run: client user engine can publish into the event stream") {
		t.Fatalf("server whose client identity can write events: exit %d\n%s", r.code, r.stderr)
	}

	d.start(t, "engine", "server", "--no-worker", "--replicas", "3", "--client-user", "client")
	d.start(t, "worker", "worker", "--label", "pool=p", "--tick", "200ms")
	d.workersReady(t, 1)

	id := strings.TrimSpace(d.ok(t, "client", "add", "--label", "pool=p", "--", "echo hello from the worker identity"))
	out := d.ok(t, "client", "wait", id, "--json", "--timeout", "60s")
	if !strings.Contains(out, `"status": "succeeded"`) {
		t.Fatalf("wait: %s", out)
	}
	if inbox := d.ok(t, "client", "inbox", "--json"); !strings.Contains(inbox, id) {
		t.Errorf("the client's own inbox does not have its wake-up: %s", inbox)
	}
	other := strings.TrimSpace(d.ok(t, "client", "add", "--anywhere", "--target", "someone-else", "--", "true"))
	d.ok(t, "client", "wait", other, "--timeout", "60s")
	if r := d.run(t, "client", "inbox", "--target", "someone-else"); r.code == 0 {
		t.Errorf("the client read another target's inbox: %s", r.stdout)
	}

	// The client identity publishes into the event stream directly: refused.
	clientViolations := make(violations, 16)
	_, cjs := d.connect(t, "client", clientViolations.handler())
	forged := events.TaskSubject("forged-task", events.TypeArmed)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err := cjs.Publish(ctx, forged, []byte(`{"v":1,"id":"x","task_id":"forged-task","type":"armed"}`))
	cancel()
	if err == nil {
		t.Fatal("the client identity published into the event stream")
	}
	clientViolations.refused(t, forged)
	_, ejs := d.connect(t, "engine")
	stream, err := ejs.Stream(context.Background(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(context.Background(), events.StoredSubject("forged-task")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the forged event is in the stream (err %v)", err)
	}

	// The worker identity registers: refused, and nothing is armed.
	workerViolations := make(violations, 16)
	wnc, _ := d.connect(t, "worker", workerViolations.handler())
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
	_, err = wnc.RequestWithContext(ctx, "bgtask.register", []byte(`{"command":"echo not allowed"}`))
	cancel()
	if err == nil {
		t.Fatal("the worker identity registered a task")
	}
	workerViolations.refused(t, "bgtask.register")
	auditClusterClean(t, d)
}

// auditClusterClean runs `bgtask audit` as the engine identity.
func auditClusterClean(t *testing.T, d *deployment) {
	t.Helper()
	if r := d.run(t, "engine", "audit"); r.code != 0 {
		t.Fatalf("audit found violations (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// The configuration the compose file gives each NATS node parses, with JetStream
// writing to disk before every acknowledgement, the three routes and the three
// identities. (docker compose itself is not run by the tests.)
func TestTheComposeNATSConfigurationParses(t *testing.T) {
	t.Setenv("NATS_NAME", "nats-1")
	for _, user := range []string{"ENGINE", "WORKER", "CLIENT"} {
		t.Setenv("BGTASK_"+user+"_PASSWORD", "p-"+user)
	}
	o, err := server.ProcessConfigFile("../deploy/nats/cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	if o.ServerName != "nats-1" || !o.JetStream || !o.SyncAlways || o.Cluster.Name != "bgtask" || len(o.Routes) != 3 {
		t.Errorf("cluster.conf: name %q, jetstream %v, sync always %v, cluster %q, %d routes",
			o.ServerName, o.JetStream, o.SyncAlways, o.Cluster.Name, len(o.Routes))
	}
	users := map[string]string{}
	for _, u := range o.Users {
		users[u.Username] = u.Password
	}
	if len(users) != 3 || users["client"] != "p-CLIENT" {
		t.Errorf("users %v, want engine, worker and client with the passwords of the environment", users)
	}
}
