package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/bgtask/bgtask/internal/testkit"
)

// netns is a network namespace joined to the host by a veth pair: a process run in
// it reaches the host only through the pair, so taking the host's end down cuts it
// off from NATS the way a network partition would, while it and its commands go on.
type netns struct {
	t              *testing.T
	name, hostVeth string
	hostIP         string
}

// newNetns makes a namespace, or skips the test where this machine does not allow
// it (no root, no ip(8)).
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root: the partition test does not run here")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8): the partition test does not run here")
	}
	id := os.Getpid()%100000 + 1
	n := &netns{t: t, name: fmt.Sprintf("bgtask-test-%d", id), hostVeth: fmt.Sprintf("bgt%dh", id)}
	subnet := fmt.Sprintf("10.231.%d", id%250)
	n.hostIP = subnet + ".1"
	peer := fmt.Sprintf("bgt%dn", id)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", n.hostVeth).Run()
		_ = exec.Command("ip", "netns", "del", n.name).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.hostVeth, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", n.name},
		{"addr", "add", n.hostIP + "/30", "dev", n.hostVeth},
		{"link", "set", n.hostVeth, "up"},
		{"netns", "exec", n.name, "ip", "addr", "add", subnet + ".2/30", "dev", peer},
		{"netns", "exec", n.name, "ip", "link", "set", peer, "up"},
		{"netns", "exec", n.name, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("cannot make a network namespace here (ip %s: %v: %s)", strings.Join(args, " "), err, out)
		}
	}
	return n
}

// cut takes the link down: nothing crosses it, connections stall.
func (n *netns) cut() { n.ip("link", "set", n.hostVeth, "down") }

// heal brings it back up.
func (n *netns) heal() { n.ip("link", "set", n.hostVeth, "up") }

func (n *netns) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// startWorkerIn runs `bgtask worker` in the namespace as the worker identity.
func (n *netns) startWorkerIn(t *testing.T, d *deployment, home string, args ...string) *proc {
	t.Helper()
	all := append([]string{"netns", "exec", n.name, bin, "--home", home}, d.args("worker", append([]string{"worker"}, args...)...)...)
	cmd := exec.Command("ip", all...)
	cmd.Env = append(childEnv(home), d.env("worker")...)
	return startCmd(t, cmd, home, "the worker in "+n.name)
}

// firstTickPID waits for a task's run to start and returns its command's PID.
func firstTickPID(t *testing.T, d *deployment, id string) int {
	t.Helper()
	var pid int
	testkit.Eventually(t, 60*time.Second, "the task started", func() bool {
		var hist struct {
			Events []struct {
				Type    string `json:"type"`
				Payload struct {
					PID int `json:"pid"`
				} `json:"payload"`
			}
		}
		r := d.run(t, "client", "history", id, "--json")
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &hist) != nil {
			return false
		}
		for _, e := range hist.Events {
			if e.Type == "tick" && e.Payload.PID != 0 {
				pid = e.Payload.PID
				return true
			}
		}
		return false
	})
	return pid
}

// historyTypes returns the types of a task's events. A query that fails while the
// cluster, loaded by the test, elects a leader is made again.
func historyTypes(t *testing.T, d *deployment, id string) []string {
	t.Helper()
	var hist struct {
		Events []struct {
			Type string `json:"type"`
		}
	}
	testkit.Eventually(t, 30*time.Second, "the history of "+id+" read", func() bool {
		r := d.run(t, "client", "history", id, "--json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &hist) == nil
	})
	var out []string
	for _, e := range hist.Events {
		out = append(out, e.Type)
	}
	return out
}

// A worker partitioned from NATS for less than its lease keeps its command
// running; the command ends while it is away, and when the link is back the
// worker records the exit: the task fires once, and nothing is lost.
//
// And one partitioned past its lease: the engine appends lost, on_lost respawn
// arms the task again and another worker runs it; when the link comes back the
// first worker's late appends are fenced and it stops its run. The task fires once.
func TestAPartitionedWorker(t *testing.T) {
	ns := newNetns(t)
	d := startDeploymentOn(t, 3, ns.hostIP)
	d.start(t, "engine", "server", "--no-worker", "--replicas", "3", "--client-user", "client", "--lease-ttl", "8s")
	ns.startWorkerIn(t, d, t.TempDir(), "--worker-id", "inside", "--label", "pool=p", "--tick", "500ms")
	d.workersReady(t, 1)

	t.Run("back before the lease expires", func(t *testing.T) {
		dir := t.TempDir()
		gate := filepath.Join(dir, "go")
		id := strings.TrimSpace(d.ok(t, "client", "add", "--label", "pool=p", "--", fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.05; done; echo ended while cut off`, gate)))
		pid := firstTickPID(t, d, id)
		ns.cut()
		// The command ends while its worker cannot reach NATS; its exit is on disk.
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, "the command ended while cut off", func() bool { return processGone(pid) })
		ns.heal()
		w := decodeJSON[wakeup](t, d.ok(t, "client", "wait", id, "--json", "--timeout", "60s"))
		if w.Status != "succeeded" || !strings.Contains(strings.Join(w.Tail, "\n"), "ended while cut off") {
			t.Fatalf("wake-up %+v, want succeeded with the output from while it was cut off", w)
		}
		if types := historyTypes(t, d, id); strings.Contains(strings.Join(types, " "), "lost") {
			t.Fatalf("history %v: a worker back within its lease lost the task", types)
		}
	})

	t.Run("back after the lease expired", func(t *testing.T) {
		dir := t.TempDir()
		first := filepath.Join(dir, "first-run")
		// The first run waits forever; the run after a respawn ends at once.
		cmd := fmt.Sprintf(`if [ -e %[1]s ]; then echo second run; else touch %[1]s; sleep 600; fi`, first)
		spec := fmt.Sprintf(`{"command":%q,"on_lost":"respawn","placement":{"labels":{"pool":"p"}}}`, cmd)
		specFile := filepath.Join(dir, "spec.json")
		if err := os.WriteFile(specFile, []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		id := strings.TrimSpace(d.ok(t, "client", "add", "--spec", specFile))
		pid := firstTickPID(t, d, id) // on the inside worker: the only one yet
		d.start(t, "worker", "worker", "--worker-id", "outside", "--label", "pool=p", "--tick", "500ms")
		ns.cut()
		// Past the lease the engine appends lost, and on_lost re-arms the task for the
		// outside worker; the first run goes on meanwhile, cut off.
		w := decodeJSON[wakeup](t, d.ok(t, "client", "wait", id, "--json", "--timeout", "90s"))
		if w.Status != "succeeded" || !strings.Contains(strings.Join(w.Tail, "\n"), "second run") {
			t.Fatalf("wake-up %+v, want the respawned run's", w)
		}
		if processGone(pid) {
			t.Fatal("the first run stopped while its worker was only cut off")
		}
		ns.heal()
		// The first run was fenced: its worker found the task was no longer its own.
		testkit.Eventually(t, 60*time.Second, "the fenced run stopped", func() bool { return processGone(pid) })
		types := historyTypes(t, d, id)
		if n := strings.Count(strings.Join(types, " "), "fired"); n != 1 {
			t.Fatalf("history %v: fired %d times", types, n)
		}
	})
	auditClusterClean(t, d)
}

// startDeploymentOn is startDeployment with the client listeners on host.
func startDeploymentOn(t *testing.T, n int, host string) *deployment {
	t.Helper()
	return startDeployment(t, n, func(_ int, o *server.Options) { o.Host = host })
}
