package proc_test

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/internal/proc"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// started runs a process that lives until the test ends (or the test kills it).
func started(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// statStart is field 22 of /proc/PID/stat, read here by other means than the
// package: the last ')' ends the command's name.
func statStart(t *testing.T, pid int) uint64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return start
}

// The identity of a running process is its PID, its start time and the boot.
func TestTheIdentityOfARunningProcess(t *testing.T) {
	cmd := started(t)
	id, err := proc.Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if id.PID != cmd.Process.Pid || id.Start != statStart(t, id.PID) || id.Boot != strings.TrimSpace(string(boot)) {
		t.Fatalf("identity %+v", id)
	}
	if err := proc.Check(id); err != nil {
		t.Fatalf("a running process: %v", err)
	}
}

// No process, or no PID at all, is gone.
func TestAMissingProcessIsGone(t *testing.T) {
	max, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	beyond, _ := strconv.Atoi(strings.TrimSpace(string(max)))
	for _, pid := range []int{beyond + 1, 0, -1} {
		if _, err := proc.Of(pid); !errors.Is(err, proc.ErrGone) {
			t.Fatalf("pid %d: %v, want gone", pid, err)
		}
	}
	if _, err := proc.Start(proc.Identity{PID: beyond + 1, Start: 1, Boot: "b"}); !errors.Is(err, proc.ErrGone) {
		t.Fatalf("a watch of no process: %v", err)
	}
}

// A PID that names a process which started at another time is not the process
// registered: its PID was reused. Two real processes started a clock tick apart
// stand for the two owners of one PID.
func TestAReusedPIDIsGone(t *testing.T) {
	first := started(t)
	firstID, err := proc.Of(first.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var second *exec.Cmd
	var secondID proc.Identity
	testkit.Eventually(t, 10*time.Second, "a process started a clock tick after the first", func() bool {
		second = started(t)
		if secondID, err = proc.Of(second.Process.Pid); err != nil {
			t.Fatal(err)
		}
		return secondID.Start != firstID.Start
	})
	reused := proc.Identity{PID: second.Process.Pid, Start: firstID.Start, Boot: firstID.Boot}
	if err := proc.Check(reused); !errors.Is(err, proc.ErrGone) || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("a PID that names another process: %v", err)
	}
	if _, err := proc.Start(reused); !errors.Is(err, proc.ErrGone) {
		t.Fatalf("a watch of a reused PID: %v", err)
	}
	if err := proc.Check(secondID); err != nil {
		t.Fatalf("the process the PID names now: %v", err)
	}
}

// A process of an earlier boot is gone, whatever runs under its PID now.
func TestAProcessOfAnEarlierBootIsGone(t *testing.T) {
	id, err := proc.Of(started(t).Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	id.Boot = "00000000-0000-0000-0000-000000000000"
	if err := proc.Check(id); !errors.Is(err, proc.ErrGone) || !strings.Contains(err.Error(), "restarted") {
		t.Fatalf("a process of another boot: %v", err)
	}
	if _, err := proc.Start(id); !errors.Is(err, proc.ErrGone) {
		t.Fatalf("a watch of a process of another boot: %v", err)
	}
}

// A process that has ended and that its parent has not reaped (a zombie) is gone.
func TestAZombieIsGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	testkit.Eventually(t, 10*time.Second, "the process that ended gone", func() bool {
		_, err := proc.Of(cmd.Process.Pid)
		if err != nil && !errors.Is(err, proc.ErrGone) {
			t.Fatalf("a process that ended: %v", err)
		}
		return err != nil
	})
}

// A watch sees the end of a process that is not this one's child, before anyone
// reaps it; stopped, it ends without one.
func TestAWatchSeesTheEnd(t *testing.T) {
	// sh's child, not this process's: sh starts sleep and waits for it.
	sh := exec.Command("sh", "-c", `sleep 300 & echo $!; wait`)
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sh.Process.Kill(); _ = sh.Wait() }()
	line := make([]byte, 32)
	n, _ := out.Read(line)
	pid, err := strconv.Atoi(strings.TrimSpace(string(line[:n])))
	if err != nil {
		t.Fatal(err)
	}
	id, err := proc.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	w, err := proc.Start(id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case <-w.Ended:
		t.Fatal("ended while it runs")
	case <-time.After(50 * time.Millisecond):
	}
	if err := syscallKill(pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the end was not seen")
	}
	if _, err := proc.Start(id); !errors.Is(err, proc.ErrGone) {
		t.Fatalf("a watch started after the end: %v", err)
	}
	running := started(t)
	rid, _ := proc.Of(running.Process.Pid)
	w2, err := proc.Start(rid)
	if err != nil {
		t.Fatal(err)
	}
	w2.Stop()
	w2.Stop()
	select {
	case <-w2.Ended:
		t.Fatal("a stopped watch says the process ended")
	default:
	}
}

func syscallKill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
