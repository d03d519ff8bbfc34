package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
)

// The disk-full fault: a part of the bgtask home lives on a small tmpfs, which a
// ballast file fills while the commands run and which is freed again later; the
// server is not restarted. What fills decides what breaks: the event store's disk
// stops every append (the server refuses registrations with 507 and reloads
// JetStream once there is room), the worker's disk every write of a run's files
// (the exit file's blocks were taken at the start).

// diskPart is the part of the home on the tmpfs.
type diskPart string

const (
	diskHome  diskPart = "home"  // all of it: the event store and the worker's runs
	diskStore diskPart = "store" // the JetStream store (HOME/jetstream)
	diskRuns  diskPart = "runs"  // the worker's state directory, its runs in it
)

// diskBytes is the tmpfs's size: room for the store's streams (the log stream's
// limit fits 75% of it) and for the runs' output, small enough to fill at once.
const diskBytes = 96 << 20

// planDisk plans the disk-full fault: the part that fills, how long it stays
// full, and one or two tasks registered while it is full.
func (p *trialPlan) planDisk(r *rand.Rand) {
	p.disk = []diskPart{diskHome, diskStore, diskRuns}[r.IntN(3)]
	p.full = time.Duration(r.IntN(1500)) * time.Millisecond
	for range 1 + r.IntN(2) {
		p.tasks = append(p.tasks, trialTask{
			kind: allKinds[r.IntN(len(allKinds))], code: 1 + r.IntN(120), late: true,
			release: []release{whileDown, afterRestart}[r.IntN(2)],
			onLost:  []string{engine.OnLostFail, engine.OnLostRespawn}[r.IntN(2)],
		})
	}
	if !p.runsOnDisk() {
		return
	}
	// What a command prints while the disk of its run is full is lost where it
	// needs a block the output file does not have yet: a command whose completion
	// line is its first output, printed while the disk is full, never completes.
	// It prints it once the disk has room again. (A split line's second half goes
	// on in the page its first half took; a late task's run cannot start before the
	// disk has room.)
	for i, tk := range p.tasks {
		if tk.kind == ignoresTerm && tk.release == whileDown && !tk.late {
			p.tasks[i].release = afterRestart
		}
	}
}

// runsOnDisk: the worker's runs are on the disk that fills.
func (p trialPlan) runsOnDisk() bool { return p.disk == diskHome || p.disk == diskRuns }

// noSpace says a task could not start because the disk of its run was full.
func noSpace(reason string) bool { return strings.Contains(reason, syscall.ENOSPC.Error()) }

// diskDir is the directory the tmpfs is mounted on.
func (tr *trial) diskDir() string {
	switch tr.plan.disk {
	case diskStore:
		return filepath.Join(tr.home, "jetstream")
	case diskRuns:
		if tr.plan.workers == 0 {
			return filepath.Join(tr.home, "worker") // the server's own worker
		}
		return filepath.Join(tr.home, "workers") // each worker's state directory is in it
	}
	return tr.home
}

// fillDisk writes a ballast file in dir until its disk has no block left, and
// returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for size := 1 << 20; size >= 4<<10; size /= 16 {
		block := make([]byte, size)
		for {
			_, err := f.Write(block)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return path
}

// registerLate registers task i while the disk may be full. full says the server
// refused it for the full disk, as it may: it is to be registered again.
func (tr *trial) registerLate(nc *nats.Conn, i int) (id string, full bool) {
	t := tr.t
	t.Helper()
	id, refusal := tr.request(nc, i)
	switch {
	case refusal == nil:
		return id, false
	case refusal.Code == 507 && strings.Contains(refusal.Message, "disk is full"),
		refusal.Code == noResponder:
		return "", true
	case tr.plan.tasks[i].kind == amplifies && refusal.Code == 400 && refusal.Field == "prompt":
		tr.step(fmt.Sprintf("task %d refused for its prompt: %s", i, refusal.Message))
		return "", false
	}
	t.Fatalf("register task %d: %+v", i, *refusal)
	return "", false
}

// registerRefused registers task i, refused while the disk was full, as a client
// would: again until the server takes it. The server has room again once it has
// restarted its embedded NATS server and engine, which it does by itself; a
// registration made during that restart finds no responder, or is lost with the
// connection, and is made again, as the CLI makes it.
func (tr *trial) registerRefused(nc *nats.Conn, i int) string {
	t := tr.t
	t.Helper()
	var id string
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("task %d taken after the disk was freed", i), func() bool {
		var full bool
		id, full = tr.registerLate(nc, i)
		return !full
	})
	return id
}

// noResponder is the code request gives a registration no server took: the
// server was restarting.
const noResponder = -1

// registrationError is the error of a refused registration.
type registrationError struct {
	Code    int
	Field   string
	Message string
}

// request sends task i's registration and returns the task's id, or the refusal.
// An answer is due at once, a refusal for a full disk included: one that does not
// come in 10s fails the trial.
func (tr *trial) request(nc *nats.Conn, i int) (string, *registrationError) {
	t := tr.t
	t.Helper()
	data, err := json.Marshal(tr.spec(i))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	msg, err := nc.Request("bgtask.register", data, 10*time.Second)
	if errors.Is(err, nats.ErrNoResponders) {
		return "", &registrationError{Code: noResponder, Message: err.Error()}
	}
	// A request in flight when the server restarts on its store's freed disk is
	// lost with the connection; a client makes it again (the late tasks have
	// idempotency keys), as it does when it found no responder.
	if errors.Is(err, nats.ErrTimeout) && strings.Contains(tr.server.out.String(), "has room again") {
		return "", &registrationError{Code: noResponder, Message: "lost in the server's restart: " + err.Error()}
	}
	if err != nil {
		t.Fatalf("register task %d: no answer after %s: %v", i, time.Since(start).Round(time.Millisecond), err)
	}
	var reply struct {
		ID    string
		Error *registrationError
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.ID == "" && reply.Error == nil {
		t.Fatalf("register task %d: %s", i, msg.Data)
	}
	return reply.ID, reply.Error
}

// fillAndFree is the disk-full fault: every command has started when the disk
// fills; while it is full, the late tasks are registered and the "down" gates
// open, their commands ending; after a random pause the ballast goes, and the
// late tasks refused meanwhile are registered again.
func (tr *trial) fillAndFree() {
	t, p := tr.t, tr.plan
	for i, id := range tr.ids {
		if id != "" {
			waitPIDPair(t, tr.path("pids", i))
		}
	}
	ballast := fillDisk(t, tr.diskDir())
	tr.step(fmt.Sprintf("%s disk full", p.disk))
	nc, _ := connect(t, tr.home)
	defer nc.Close()
	var refused []int
	for i, tk := range p.tasks {
		if tk.late {
			var full bool
			if tr.ids[i], full = tr.registerLate(nc, i); full {
				tr.step(fmt.Sprintf("task %d refused for the full disk", i))
				refused = append(refused, i)
			}
		}
	}
	tr.openWhileDown(0, 1)
	time.Sleep(p.full) // how long the disk stays full: a random pause, it waits for nothing
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	tr.step("disk freed")
	for _, i := range refused {
		tr.ids[i] = tr.registerRefused(nc, i)
	}
	tr.awaitStoreRestart()
}

// awaitStoreRestart waits, if the store's disk filled, until the server has
// restarted its embedded NATS server and engine on it, which it does once the
// disk has room: what the trial reads next must not be a request lost with the
// connection of the server that stopped.
func (tr *trial) awaitStoreRestart() {
	if !strings.Contains(tr.server.out.String(), "JetStream failed to store a msg") {
		return // the store never found its disk full
	}
	testkit.Eventually(tr.t, 60*time.Second, "the server restarted on its store", func() bool {
		out := tr.server.out.String()
		i := strings.LastIndex(out, "has room again")
		return i >= 0 && strings.Contains(out[i:], "bgtask server ready")
	})
	tr.step("store restarted")
}
