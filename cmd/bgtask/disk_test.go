package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// A server on a disk with far less free than the log stream's 4 GiB starts, and
// runs tasks: its streams' limits fit the disk it finds.
func TestTheServerStartsOnASmallDisk(t *testing.T) {
	home := filepath.Join(mountTmpfs(t, 300<<20), "home")
	startServer(t, home)
	id := addTask(t, home, "--", "echo small; exit 3")
	r := bgtask(t, home, "wait", id, "--json", "--timeout", "30s")
	if got := decode[struct {
		ExitCode *int `json:"exit_code"`
	}](t, r.stdout).ExitCode; got == nil || *got != 3 {
		t.Fatalf("wait: %s %s, want exit code 3", r.stdout, r.stderr)
	}
}

// A log stream asked to be larger than the disk holds is no start to retry: the
// server stops at once, and says why in one line.
func TestALogStreamLargerThanTheDiskFailsTheStartInOneLine(t *testing.T) {
	home := filepath.Join(mountTmpfs(t, 300<<20), "home")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out syncBuffer
	start := time.Now()
	err := Run(ctx, []string{"server", "--home", home, "--listen", "127.0.0.1:0", "--log-bytes", "1GiB"}, &out, &out)
	if err == nil || ctx.Err() != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("server: %v after %s, want a refusal at once\n%s", err, time.Since(start), out.String())
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "BGTASK_LOGS") || !strings.Contains(msg, "1GiB") || !strings.Contains(msg, "--log-bytes") {
		t.Fatalf("the refusal %q does not say in one line which stream asks for how much, and what to do", msg)
	}
}

// A server whose store's disk cannot hold the streams it makes stops within
// seconds, in one line naming the store, the free space it found there and the
// free space it needs, where it retried for ever; a disk that can hold them (100
// MB) starts one.
func TestAServerOnADiskTooSmallForItsStreamsSaysWhatItNeeds(t *testing.T) {
	home := filepath.Join(mountTmpfs(t, 64<<20), "home")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out syncBuffer
	start := time.Now()
	err := Run(ctx, []string{"server", "--home", home, "--listen", "127.0.0.1:0"}, &out, &out)
	if err == nil || ctx.Err() != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("server: %v after %s, want a refusal at once\n%s", err, time.Since(start), out.String())
	}
	msg := err.Error()
	m := regexp.MustCompile(`store at (\S+): ([0-9.]+)MiB free, and the server needs ([0-9.]+)MiB free there`).FindStringSubmatch(msg)
	if strings.Contains(msg, "\n") || m == nil || !strings.HasPrefix(m[1], home) {
		t.Fatalf("the refusal %q does not say in one line where, with how much free, and how much it needs", msg)
	}
	free, _ := strconv.ParseFloat(m[2], 64)
	need, _ := strconv.ParseFloat(m[3], 64)
	// JetStream stores 75% of the free disk; the streams need 64 MiB of output and 4 MiB more.
	if free > 64 || free < 60 || need < 90 || need > 91.5 {
		t.Fatalf("the refusal %q says %v MiB free and %v MiB needed, want what a 64 MiB disk has and 90.7 MiB", msg, free, need)
	}
	startServer(t, filepath.Join(mountTmpfs(t, 100<<20), "home"))
}

func TestTheLogStreamFitsWhatJetStreamMayStore(t *testing.T) {
	for _, c := range []struct{ asked, maxStore, want int64 }{
		{0, 0, 4 << 30},                   // unknown: the old default
		{0, 100 << 30, 4 << 30},           // a large disk
		{0, 225 << 20, 225 << 19},         // 300 MB free: half
		{0, 40 << 20, 64 << 20},           // the least a few tasks need, which checkStoreRoom refuses
		{0, 100 << 20, 64 << 20},          // the least a few tasks need
		{512 << 20, 225 << 20, 512 << 20}, // asked: as asked, refused by JetStream if it does not fit
	} {
		if got := logStreamBytes(c.asked, c.maxStore); got != c.want {
			t.Errorf("logStreamBytes(%d, %d) = %d, want %d", c.asked, c.maxStore, got, c.want)
		}
	}
	for _, c := range []struct {
		maxStore, logBytes int64
		refused            bool
	}{{0, 64 << 20, false}, {68 << 20, 64 << 20, false}, {68<<20 - 1, 64 << 20, true}, {1 << 30, 1 << 30, true}} {
		err := checkStoreRoom(c.maxStore, c.logBytes, "")
		if refused := err != nil; refused != c.refused || refused && !strings.Contains(err.Error(), "account may store "+formatBytes(c.maxStore)) {
			t.Errorf("checkStoreRoom(%d, %d) = %v, want refused %v, naming what the account may store", c.maxStore, c.logBytes, err, c.refused)
		}
	}
	for in, want := range map[string]int64{"512MiB": 512 << 20, "2GiB": 2 << 30, "1000": 1000, "3 MB": 3e6} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("--log-bytes %s = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1MiB", "1.5GiB", "99999999999GiB"} {
		var b byteSize
		if err := b.Set(bad); err == nil {
			t.Errorf("--log-bytes %q accepted", bad)
		}
	}
}

// fill writes to a file in dir until the disk is full, and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "fill")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 1<<20)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
}

// A disk that fills while a command runs, and has room again after it ended: the
// running server records the command's exit code, with no restart.
func TestAFullDiskFreedAgainLosesNoExitAndNeedsNoRestart(t *testing.T) {
	disk := mountTmpfs(t, 100<<20)
	home, dir := filepath.Join(disk, "home"), t.TempDir()
	srv := startServer(t, home)
	id := addTask(t, home, "--cwd", dir, "--", `while [ ! -e go ]; do sleep 0.05; done; exit 3`)
	eventually(t, 20*time.Second, "the command started", func() bool {
		_, err := os.Stat(filepath.Join(home, "worker", "runs", id+"-1", "pid.json"))
		return err == nil
	})
	filled := fill(t, disk)
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the full disk noticed", func() bool {
		return strings.Contains(srv.out.String(), "disk of the event store is full")
	})
	// A registration meanwhile is refused with the reason, not left unanswered.
	if r := bgtask(t, home, "add", "--json", "--", "true"); r.code == 0 || !strings.Contains(r.stdout, "disk is full") {
		t.Fatalf("add while the disk is full: exit %d, %s %s; want a refusal naming the disk", r.code, r.stdout, r.stderr)
	}
	if err := os.Remove(filled); err != nil {
		t.Fatal(err)
	}
	r := bgtask(t, home, "wait", id, "--json", "--timeout", "60s")
	if got := decode[struct {
		ExitCode *int `json:"exit_code"`
	}](t, r.stdout).ExitCode; got == nil || *got != 3 {
		t.Fatalf("wait: %s %s, want exit code 3\n%s", r.stdout, r.stderr, srv.out.String())
	}
}

// eventually polls cond until it holds, or fails the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %s", what, timeout)
		}
	}
}

// Clients keep asking over the network while the store's disk fills and has room
// again, three times over: each time the server loads its store again under their
// requests, and then answers them and records a registration. Loading JetStream
// again on its own, with clients connected, was a data race in nats-server.
func TestClientsAskingWhileTheDiskFillsAndFreesAreAnsweredAfter(t *testing.T) {
	disk := mountTmpfs(t, 100<<20)
	home := filepath.Join(disk, "home")
	srv := startServer(t, home)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		nc := connectAs(t, home, filepath.Join(home, serverhome.ClientSeedFile), nil)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = nc.RequestWithContext(ctx, api.SubjectList, []byte(`{"limit":10}`))
				_, _ = js.Stream(ctx, events.StreamName)
				cancel()
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	for round := 1; round <= 3; round++ {
		filled := fill(t, disk)
		// A write to the full disk is what raises the alarm; the first few may
		// still fit in the pages the store's files hold already.
		eventually(t, 30*time.Second, "the full disk noticed", func() bool {
			bgtask(t, home, "add", "--json", "--", "true")
			return strings.Count(srv.out.String(), "disk of the event store is full") >= round
		})
		if err := os.Remove(filled); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "a registration taken again", func() bool {
			return bgtask(t, home, "add", "--json", "--", "true").code == 0
		})
	}
	id := addTask(t, home, "--", "exit 4")
	r := bgtask(t, home, "wait", id, "--json", "--timeout", "60s")
	if got := decode[struct {
		ExitCode *int `json:"exit_code"`
	}](t, r.stdout).ExitCode; got == nil || *got != 4 {
		t.Fatalf("wait: %s %s, want exit code 4\n%s", r.stdout, r.stderr, srv.out.String())
	}
}
