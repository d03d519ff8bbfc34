package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/internal/testkit"
)

// Commands outlive the server that started them, whether it stops gracefully or is
// killed, and each exit is recorded and delivered once when the server is back.
func TestCommandsSurviveTheServerAndTheirExitsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			srv := startServer(t, home)
			dir := t.TempDir()
			// One command ends while the server is down, one after it is back.
			away := add(t, home, "--cwd", dir, "--", `echo $$ > away.pid; echo start; while [ ! -e away ]; do sleep 0.02; done; echo end; exit 7`)
			back := add(t, home, "--cwd", dir, "--", `echo $$ > back.pid; while [ ! -e back ]; do sleep 0.02; done; exit 3`)
			awayPID := readPID(t, filepath.Join(dir, "away.pid"))
			backPID := readPID(t, filepath.Join(dir, "back.pid"))
			testkit.Eventually(t, 30*time.Second, "the first command's output in the log", func() bool {
				return ok(t, home, "logs", away) == "start\n"
			})

			srv.stop(sig)
			if processGone(awayPID) || processGone(backPID) {
				t.Fatalf("a command died with the server (%v)", sig)
			}
			touch(t, filepath.Join(dir, "away"))
			testkit.Eventually(t, 30*time.Second, "the command ended", func() bool { return processGone(awayPID) })

			startServer(t, home)
			w := waitFor(t, home, away)
			if w.ExitCode == nil || *w.ExitCode != 7 || strings.Join(w.Tail, ",") != "start,end" {
				t.Fatalf("exit recorded after the restart: %+v", w)
			}
			touch(t, filepath.Join(dir, "back"))
			if w := waitFor(t, home, back); w.ExitCode == nil || *w.ExitCode != 3 {
				t.Fatalf("the command watched again: %+v", w)
			}
			if got := ok(t, home, "logs", away); got != "start\nend\n" {
				t.Fatalf("log across the restart = %q", got)
			}
			for _, id := range []string{away, back} {
				if n := countTypes(history(t, home, id)); n["spawned"] != 1 || n["exited"] != 1 || n["fired"] != 1 {
					t.Fatalf("task %s: %v", id, n)
				}
			}
			auditClean(t, home)
		})
	}
}

// A worker runs its commands under bgtask-shim, installed beside its binary: the
// small shim, not the whole of bgtask, is each command's parent.
func TestCommandsRunUnderTheSmallShimBesideTheBinary(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	startServer(t, home)
	id := add(t, home, "--cwd", dir, "--", "readlink /proc/$PPID/exe > parent")
	if w := waitFor(t, home, id); w.Status != "succeeded" {
		t.Fatalf("wake-up = %+v, want succeeded", w)
	}
	data, err := os.ReadFile(filepath.Join(dir, "parent"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(data)), filepath.Join(filepath.Dir(bin), "bgtask-shim"); got != want {
		t.Errorf("the command's parent runs %s, want %s", got, want)
	}
}

func TestCancelReachesACommandStartedBeforeARestart(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home)
	dir := t.TempDir()
	id := add(t, home, "--cwd", dir, "--", `echo $$ > pid; exec sleep 600`)
	pid := readPID(t, filepath.Join(dir, "pid"))
	srv.stop(syscall.SIGKILL)
	startServer(t, home)
	ok(t, home, "cancel", id)
	testkit.Eventually(t, 30*time.Second, "the command gone after its cancel", func() bool { return processGone(pid) })
	if w := waitFor(t, home, id); w.Status != "cancelled" {
		t.Fatalf("status %q", w.Status)
	}
	auditClean(t, home)
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A worker gone for good (its host died) loses its leases: a task that says
// respawn runs again on another worker, one that does not is woken as lost, and
// the first worker, if it comes back, is fenced and stops its old runs.
func TestAWorkerGoneForGoodLosesItsTasks(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, "--no-worker", "--lease-ttl", "2s")
	dir := t.TempDir()
	doomed := start(t, home, "worker", "--worker-id", "doomed", "--tick", "200ms")
	failing := add(t, home, "--cwd", dir, "--", `echo $$ > failing.pid; exec sleep 600`)
	respawning := add(t, home, "--cwd", dir, "--spec", writeSpec(t, `{"on_lost":"respawn"}`), "--",
		`echo $$ >> respawning.pids; while [ ! -e done ]; do sleep 0.05; done; echo finished`)
	failingPID := readPID(t, filepath.Join(dir, "failing.pid"))
	readPID(t, filepath.Join(dir, "respawning.pids"))

	doomed.stop(syscall.SIGKILL) // its commands go on under their shims; its heartbeats stop
	w := waitFor(t, home, failing)
	if w.Status != "lost" || !strings.Contains(w.Prompt, "lost") {
		t.Fatalf("wake-up of a task whose worker is gone: %+v", w)
	}
	start(t, home, "worker", "--worker-id", "rescuer", "--tick", "200ms")
	testkit.Eventually(t, 30*time.Second, "the task run again", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "respawning.pids"))
		return strings.Count(string(data), "\n") == 2
	})
	touch(t, filepath.Join(dir, "done"))
	if w := waitFor(t, home, respawning); w.Status != "succeeded" {
		t.Fatalf("respawned task: %+v", w)
	}
	n := countTypes(history(t, home, respawning))
	if n["lost"] != 1 || n["spawned"] != 2 || n["exited"] != 1 || n["fired"] != 1 {
		t.Fatalf("history of the respawned task: %v", n)
	}

	// The doomed worker comes back: both its runs are no longer its own.
	start(t, home, "worker", "--worker-id", "doomed", "--tick", "200ms")
	testkit.Eventually(t, 30*time.Second, "the old run gone with its fenced worker", func() bool { return processGone(failingPID) })
	auditClean(t, home)
}

// writeSpec writes a spec file for add --spec.
func writeSpec(t *testing.T, spec string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(path, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The server dies (SIGKILL, from inside, at a named point) in each window between
// two steps of a task's end; after a restart the task ends with exactly one exit,
// one completion, one inbox message and one fired.
func TestACrashInEachWindowEndsWithExactlyOneWakeup(t *testing.T) {
	t.Parallel()
	for _, point := range []string{
		engine.CrashAfterSpawn, engine.CrashBeforeExitSave, engine.CrashAfterPersist, engine.CrashAfterDeliver,
	} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			srv := startServerEnv(t, home, []string{engine.CrashEnv + "=" + point})
			id := add(t, home, "--", "echo hi; exit 4")
			select {
			case <-srv.done:
			case <-time.After(60 * time.Second):
				t.Fatalf("the server did not crash at %s", point)
			}
			startServer(t, home)
			w := waitFor(t, home, id)
			if w.ExitCode == nil || *w.ExitCode != 4 || strings.Join(w.Tail, ",") != "hi" {
				t.Fatalf("wake-up after a crash at %s: %+v", point, w)
			}
			n := countTypes(history(t, home, id))
			for _, typ := range []string{"spawned", "exited", "completion-persisted", "fired"} {
				if n[typ] != 1 {
					t.Fatalf("after a crash at %s: %d %s events, want 1 (%v)", point, n[typ], typ, n)
				}
			}
			inbox := strings.TrimSpace(ok(t, home, "inbox", "--json"))
			if strings.Count(inbox, "\n") != 0 || !strings.Contains(inbox, id) {
				t.Fatalf("inbox after a crash at %s:\n%s", point, inbox)
			}
			auditClean(t, home)
		})
	}
}
