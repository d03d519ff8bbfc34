//go:build linux && !bgtask_portable

package shim

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgtask/bgtask/internal/testkit"
)

// readPID waits for a command to write a PID to the file at path, and returns it.
func readPID(t *testing.T, path string) int {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, path+" written", func() bool {
		data, _ := os.ReadFile(path)
		return bytes.HasSuffix(data, []byte("\n"))
	})
	data, _ := os.ReadFile(path)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %q", path, data)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// Once a command ends, its shim stops what it left running outside its process
// group (a setsid'd sleep, whose parent ended: the shim's child now), and
// nothing of another run's, though that is the shim's child too.
func TestAShimStopsOnlyWhatTheEndedCommandLeft(t *testing.T) {
	tmp := t.TempDir()
	gate := fifo(t)
	leftEnv, otherEnv := runEnv("left"), runEnv("other")
	left := shRun(t, leftEnv, `(setsid sleep 60 & echo $! > "$0"); read x < "$1"`, filepath.Join(tmp, "left"), gate)
	other := shRun(t, otherEnv, `(setsid sleep 60 & echo $! > "$0"); exec sleep 60`, filepath.Join(tmp, "other"))
	var said bytes.Buffer
	sock, cmd := testShim(t, &said)
	handRun(t, sock, left, leftEnv, &said)
	handRun(t, sock, other, otherEnv, &said)
	leftPID, otherPID := readPID(t, filepath.Join(tmp, "left")), readPID(t, filepath.Join(tmp, "other"))
	goOn(t, gate)
	testkit.Eventually(t, 20*time.Second, "the ended run over", func() bool { return lockFree(t, left.Dir) })
	if e := readExit(t, left.Dir); e.ExitCode != 0 {
		t.Errorf("exit %+v, want code 0", e)
	}
	if syscall.Kill(leftPID, 0) == nil {
		t.Error("what the command left runs on once its run is over")
	}
	if syscall.Kill(otherPID, 0) != nil || !readPIDs(t, other.Dir).Command.Alive() {
		t.Fatal("another run's processes were stopped with what the ended command left")
	}
	sock.Close()
	_ = syscall.Kill(readPIDs(t, other.Dir).Command.PID, syscall.SIGKILL)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
	}
	if syscall.Kill(otherPID, 0) == nil {
		t.Error("what the other command left runs on once its run is over")
	}
}

// What a command left that carries no marker (its environment cleared) cannot be
// told from what another running command left: it is stopped once no command of
// the shim runs.
func TestAShimStopsAnUnmarkedLeftoverOnceNothingRuns(t *testing.T) {
	tmp := t.TempDir()
	gate, otherGate := fifo(t), fifo(t)
	leftEnv, otherEnv := runEnv("left"), runEnv("other")
	left := shRun(t, leftEnv, `(env -i setsid sleep 60 & echo $! > "$0"); read x < "$1"`, filepath.Join(tmp, "left"), gate)
	other := shRun(t, otherEnv, `read x < "$0"`, otherGate)
	var said bytes.Buffer
	sock, cmd := testShim(t, &said)
	handRun(t, sock, left, leftEnv, &said)
	handRun(t, sock, other, otherEnv, &said)
	leftPID := readPID(t, filepath.Join(tmp, "left"))
	goOn(t, gate)
	testkit.Eventually(t, 20*time.Second, "the first run over", func() bool { return lockFree(t, left.Dir) })
	goOn(t, otherGate)
	testkit.Eventually(t, 20*time.Second, "the other run over", func() bool { return lockFree(t, other.Dir) })
	if syscall.Kill(leftPID, 0) == nil {
		t.Error("an unmarked leftover runs on once no command of its shim runs")
	}
	sock.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the shim ended with %v: %s", err, said.Bytes())
	}
}
