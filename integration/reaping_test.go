package integration

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// In the all-in-one server the engine's exec sinks are children of the process
// that also runs the worker and reaps its shims. Each sink program runs once per
// wake-up: a reap of the shims that took a sink's child made os/exec's wait fail
// for a program that had done its work, and the push was tried again.
func TestEachExecSinkRunsOnceBesideTheWorkersShims(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	nc, _ := connect(t, home)
	log := openLog(t, home)
	runs := filepath.Join(t.TempDir(), "runs")
	const tasks = 60
	var ids []string
	for range tasks {
		ids = append(ids, register(t, nc, map[string]any{
			"command": "true",
			"policy":  "immediate",
			"deliver": []map[string]any{{"type": "exec", "argv": []string{"/bin/sh", "-c", `echo "$BGTASK_TASK_ID" >> "$0"`, runs}}},
		}))
	}
	for _, id := range ids {
		log.waitSinksDone(t, id, 1)
	}
	data, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, id := range strings.Fields(string(data)) {
		count[id]++
	}
	var doubled []string
	for _, id := range ids {
		if count[id] != 1 {
			doubled = append(doubled, id)
		}
	}
	if len(doubled) > 0 {
		t.Fatalf("%d of %d tasks had their sink program run other than once (%d runs in all): %v", len(doubled), tasks, len(strings.Fields(string(data))), doubled)
	}
}

// A descriptor the server inherited (a pipe its caller reads, as $(...) makes)
// reaches none of its shims, which outlive it: the pipe's reader sees its end once
// the server is gone, while the task's shim and command go on.
func TestNoShimHoldsADescriptorTheServerInherited(t *testing.T) {
	t.Parallel()
	home, dir := t.TempDir(), t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(bin, append([]string{"--home", home}, serverArgs()...)...)
	cmd.Env = childEnv(home)
	cmd.ExtraFiles = []*os.File{w} // its descriptor 3, not close-on-exec
	srv := awaitServer(t, startCmd(t, cmd, home, "bgtask server"), home)
	w.Close()
	add(t, home, "--cwd", dir, "--", "echo $$ $PPID >> pids; exec sleep 600")
	_, shimPID := waitPIDPair(t, filepath.Join(dir, "pids"))
	srv.stop(syscall.SIGKILL)
	if err := r.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read %d bytes, %v: want the pipe's end, with only the server's shims left", n, err)
	}
	if processGone(shimPID) {
		t.Fatal("the task's shim ended with the server: the pipe's end proves nothing")
	}
}
