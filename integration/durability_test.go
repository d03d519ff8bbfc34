package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
			eventually(t, 30*time.Second, "the first command's output never reached the log", func() bool {
				return ok(t, home, "logs", away) == "start\n"
			})

			srv.stop(sig)
			if processGone(awayPID) || processGone(backPID) {
				t.Fatalf("a command died with the server (%v)", sig)
			}
			touch(t, filepath.Join(dir, "away"))
			eventually(t, 30*time.Second, "the command did not end", func() bool { return processGone(awayPID) })

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
	eventually(t, 30*time.Second, "the command outlived its cancel", func() bool { return processGone(pid) })
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

