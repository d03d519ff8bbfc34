package server

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

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/serverhome"
	"github.com/bgtask/bgtask/internal/testkit"
)

// A server on a disk with far less free than the log stream's 4 GiB starts, and
// runs tasks: its streams' limits fit the disk it finds.
func TestTheServerStartsOnASmallDisk(t *testing.T) {
	home := filepath.Join(mountTmpfs(t, 300<<20), "home")
	startServer(t, home)
	c := newClient(t, home)
	id := register(t, c, client.Spec{Command: "echo small; exit 3"})
	if code := exitCodeOf(t, c, id, 30*time.Second); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
}

// runAtOnce runs a server with o and returns the error it stops with, failing
// the test if it serves or takes more than 10 seconds to refuse.
func runAtOnce(t *testing.T, o Options) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := Run(ctx, o)
	if err == nil || ctx.Err() != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("server: %v after %s, want a refusal at once", err, time.Since(start))
	}
	return err
}

// A log stream asked to be larger than the disk holds is no start to retry: the
// server stops at once, and says why in one line.
func TestALogStreamLargerThanTheDiskFailsTheStartInOneLine(t *testing.T) {
	o := testOptions(filepath.Join(mountTmpfs(t, 300<<20), "home"), &syncBuffer{})
	o.LogBytes = 1 << 30
	err := runAtOnce(t, o)
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
	msg := runAtOnce(t, testOptions(home, &syncBuffer{})).Error()
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
		var b ByteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("--log-bytes %s = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1MiB", "1.5GiB", "99999999999GiB"} {
		var b ByteSize
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
	testkit.FullOnly(t)
	disk := mountTmpfs(t, 100<<20)
	home, dir := filepath.Join(disk, "home"), t.TempDir()
	srv := startServer(t, home)
	c := newClient(t, home)
	id := register(t, c, client.Spec{Cwd: dir, Command: `while [ ! -e go ]; do sleep 0.05; done; exit 3`})
	testkit.Eventually(t, 20*time.Second, "the command started", func() bool {
		_, err := os.Stat(filepath.Join(home, "worker", "runs", id+"-1", "pid.json"))
		return err == nil
	})
	filled := fill(t, disk)
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the full disk noticed", func() bool {
		return strings.Contains(srv.log.String(), "disk of the event store is full")
	})
	// A registration meanwhile is refused with the reason, not left unanswered.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Register(ctx, client.Spec{Command: "true"}); err == nil || !strings.Contains(err.Error(), "disk is full") {
		t.Fatalf("register while the disk is full: %v; want a refusal naming the disk", err)
	}
	if err := os.Remove(filled); err != nil {
		t.Fatal(err)
	}
	if code := exitCodeOf(t, c, id, 60*time.Second); code != 3 {
		t.Fatalf("exit code %d, want 3\n%s", code, srv.log.String())
	}
}

// Clients keep asking over the network while the store's disk fills and has room
// again, three times over: each time the server loads its store again under their
// requests, and then answers them and records a registration. Loading JetStream
// again on its own, with clients connected, was a data race in nats-server.
func TestClientsAskingWhileTheDiskFillsAndFreesAreAnsweredAfter(t *testing.T) {
	testkit.FullOnly(t)
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
	c := newClient(t, home)
	registered := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.Register(ctx, client.Spec{Command: "true"})
		return err == nil
	}
	for round := 1; round <= 3; round++ {
		filled := fill(t, disk)
		// A write to the full disk is what raises the alarm; the first few may
		// still fit in the pages the store's files hold already.
		testkit.Eventually(t, 30*time.Second, "the full disk noticed", func() bool {
			registered()
			return strings.Count(srv.log.String(), "disk of the event store is full") >= round
		})
		if err := os.Remove(filled); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, "a registration taken again", registered)
	}
	id := register(t, c, client.Spec{Command: "exit 4"})
	if code := exitCodeOf(t, c, id, 60*time.Second); code != 4 {
		t.Fatalf("exit code %d, want 4\n%s", code, srv.log.String())
	}
}
