//go:build linux

package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size bytes for the test: a disk that can be filled.
// It needs root (CI runs the tests as root).
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root; CI runs the tests as root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill writes to a file in dir until the disk is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 64<<10)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// A disk that fills while the command runs does not lose its exit: the exit
// file's room was taken when the command started.
func TestAFullDiskKeepsTheCommandsExit(t *testing.T) {
	disk := mountTmpfs(t, 1<<20)
	run, gate := filepath.Join(disk, "run"), filepath.Join(t.TempDir(), "go")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	env := JoinEnviron([]string{"PATH=" + os.Getenv("PATH")})
	r := Run{Dir: run, Cwd: "/", Path: sh, Args: []string{"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.01; done; exit 3`, gate}, EnvBytes: int64(len(env))}
	sock, cmd := testShim(t, nil)
	handRun(t, sock, r, env, nil)
	sock.Close() // the shim ends once the run is over
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	if _, err := os.Stat(filepath.Join(run, PIDFile)); err != nil {
		t.Fatalf("the command's start is not recorded: %v", err)
	}

	fill(t, disk)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("the shim: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the shim did not end")
	}
	data, err := os.ReadFile(filepath.Join(run, ExitFile))
	if err != nil {
		t.Fatalf("no exit file on the full disk: %v", err)
	}
	var exit struct {
		ExitCode int `json:"exit_code"`
	}
	if err := json.Unmarshal(data, &exit); err != nil || exit.ExitCode != 3 {
		t.Fatalf("exit file %q (%v), want exit code 3", data, err)
	}
}

// A start that a full disk refuses before anything runs leaves no mark of a start
// (the exit's temp file): a worker that found one would take the run for one its
// shim died starting, and lose it, where it may start it again.
func TestAStartRefusedByAFullDiskLeavesNoMarkOfAStart(t *testing.T) {
	disk := mountTmpfs(t, 1<<20)
	run, ran := filepath.Join(disk, "run"), filepath.Join(t.TempDir(), "ran")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	fill(t, disk)
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	env := JoinEnviron(nil)
	r := Run{Dir: run, Cwd: "/", Path: sh, Args: []string{"sh", "-c", `: >"$0"`, ran}, EnvBytes: int64(len(env))}
	sock, _ := testShim(t, nil)
	sendRun(t, sock, r, env, 1<<20)
	if !says(sock, Failed) {
		t.Fatal("the shim did not say it could record nothing of the run")
	}
	for _, name := range []string{ExitTempFile, ExitFile, PIDFile} {
		if _, err := os.Stat(filepath.Join(run, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the refused start: %v, want none", name, err)
		}
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran: %v", err)
	}
}
