package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
)

// The log stream's size limit is a reservation: JetStream refuses a stream whose
// limit does not fit in what it may store, which on the embedded server is 75% of
// the disk it found free at its first start (and what it stores itself). A limit
// fixed at 4 GiB kept a server on a disk with less than 5.4 GB free retrying its
// start for ever; so did one that left no room for the streams made after it.
const (
	maxLogStreamBytes = 4 << 30
	// minLogStreamBytes holds a few tasks' output, each keeping its last
	// events.MaxLogBytes of stdout and of stderr.
	minLogStreamBytes = 8 * 2 * events.MaxLogBytes
	// otherStreamsBytes is the least room left beside the log stream, for the
	// events, the inbox, the archive and the buckets, which reserve nothing but
	// take room as they grow.
	otherStreamsBytes = 4 << 20
)

// logStreamBytes is the log stream's size limit: asked, if given (more than 0), or
// else half of what JetStream may store (maxStore; 0 or less: unknown) up to
// 4 GiB, and minLogStreamBytes at least. The other half is the events', the
// inbox's and the archive's.
func logStreamBytes(asked, maxStore int64) int64 {
	switch {
	case asked > 0:
		return asked
	case maxStore <= 0:
		return maxLogStreamBytes
	}
	return max(min(maxLogStreamBytes, maxStore/2), minLogStreamBytes)
}

// checkStoreRoom refuses, in one line, a store that cannot hold the log stream
// (logBytes, reserved) and otherStreamsBytes beside it: a stream made after the
// log's would be refused at every retry. maxStore is what JetStream may store (0
// or less: unknown, nothing is checked); dir is the embedded server's store, ""
// for a cluster's account.
func checkStoreRoom(maxStore, logBytes int64, dir string) error {
	need := logBytes + otherStreamsBytes
	if maxStore <= 0 || need <= maxStore {
		return nil
	}
	streams := fmt.Sprintf("%s (%s for the tasks' output in BGTASK_LOGS, %s for their events and wake-ups)",
		formatBytes(need), formatBytes(logBytes), formatBytes(otherStreamsBytes))
	if dir == "" {
		return fmt.Errorf("the JetStream account may store %s, and bgtask's streams need %s: give the account more storage, or a smaller --log-bytes",
			formatBytes(maxStore), streams)
	}
	// JetStream may store 75% of the free disk and of what its store holds, so
	// each byte it lacks takes a third more free.
	free := freeSpace(dir)
	return fmt.Errorf("not enough disk for the store at %s: %s free, and the server needs %s free there: JetStream stores at most 75%% of the free disk, and bgtask's streams need %s. Free disk space there, start the server with a --home on a larger disk, or give a smaller --log-bytes",
		dir, formatBytes(free), formatBytes(free+(need-maxStore+2)/3*4), streams)
}

// freeSpace is the free space on the disk of dir, for an unprivileged writer; 0
// if unknown.
func freeSpace(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// accountMaxStore is what the account of js may store, per copy of a stream of
// replicas copies, as its JetStream says; 0 when it has no limit of its own (the
// server's is then not told to clients).
func accountMaxStore(ctx context.Context, js jetstream.JetStream, replicas int) int64 {
	info, err := js.AccountInfo(ctx)
	if err != nil || info.Limits.MaxStore <= 0 {
		return 0
	}
	return info.Limits.MaxStore / int64(max(replicas, 1))
}

// jsInsufficientStorage is JetStream's error code for a stream whose limits do not
// fit in what it may store.
const jsInsufficientStorage jetstream.ErrorCode = 10047

// errStreamTooBig says in one line why a stream cannot be made, for an error that
// no retry mends: the stream's limit is more than the disk JetStream was given.
func errStreamTooBig(err error, stream string, asked, maxStore int64) error {
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != jsInsufficientStorage {
		return nil
	}
	room := "what JetStream may store"
	if maxStore > 0 {
		room += " (" + formatBytes(maxStore) + ", 75% of the free disk)"
	}
	return badOption("stream %s asks for %s, more than %s: free disk space, or give a smaller --log-bytes",
		stream, formatBytes(asked), room)
}

// ByteSize is a size in bytes; as a flag's value (a pflag.Value), a number with
// an optional KiB, MiB, GiB (or KB, MB, GB) suffix.
type ByteSize int64

func (b *ByteSize) String() string {
	if *b == 0 {
		return "0"
	}
	return formatBytes(int64(*b))
}

func (b *ByteSize) Type() string { return "size" }

func (b *ByteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q: want a size such as 512MiB or 2GiB", s)
	}
	*b = ByteSize(n * mult)
	return nil
}

// formatBytes writes a size in the largest binary unit that keeps it whole, or
// to one decimal above it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size {
			if n%u.size == 0 {
				return strconv.FormatInt(n/u.size, 10) + u.name
			}
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// diskRoomBytes is the free space at which a disk that filled is taken to have
// room again.
const diskRoomBytes = 16 << 20

// storeAlarm passes on the embedded server's log, and notes a write of its store
// that failed for lack of space.
type storeAlarm struct {
	natsserver.Logger
	mu     sync.Mutex
	full   bool
	raised chan struct{} // closed when full becomes true
}

func newStoreAlarm(l natsserver.Logger) *storeAlarm {
	return &storeAlarm{Logger: l, raised: make(chan struct{})}
}

func (a *storeAlarm) Errorf(format string, v ...any) {
	if strings.Contains(fmt.Sprintf(format, v...), syscall.ENOSPC.Error()) {
		a.raise()
	}
	a.Logger.Errorf(format, v...)
}

func (a *storeAlarm) raise() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.full {
		a.full = true
		close(a.raised)
	}
}

// Full reports whether the store's disk is full.
func (a *storeAlarm) Full() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.full
}

// Raised is closed when the disk is next found full (at once if it is).
func (a *storeAlarm) Raised() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.raised
}

// watchStoreDisk has the embedded server log through an alarm that notes a write
// of its store that failed for lack of space.
func watchStoreDisk(ns *natsserver.Server, logger *slog.Logger) *storeAlarm {
	alarm := newStoreAlarm(natsLogger{logger.With("component", "nats")})
	ns.SetLoggerV2(alarm, false, false, false)
	return alarm
}

// refuseWhenFull is the store of the API's requests: while the store's disk is
// full, an append fails at once with events.ErrNoSpace, so a registration says
// why instead of waiting for an answer JetStream does not give. An append in flight
// when the disk fills gets no answer either: it too fails with ErrNoSpace as soon
// as the alarm is raised. Such an append may have been stored all the same; a
// registration made again with its idempotency key finds that task.
type refuseWhenFull struct {
	events.Store
	alarm diskAlarm
}

// diskAlarm says whether the store's disk is full, and when it fills.
type diskAlarm interface {
	Full() bool
	Raised() <-chan struct{}
}

func (s refuseWhenFull) Append(ctx context.Context, ev events.Event, expect uint64) (uint64, error) {
	raised := s.alarm.Raised()
	if s.alarm.Full() {
		return 0, events.ErrNoSpace
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-raised:
			cancel()
		case <-ctx.Done():
		}
	}()
	seq, err := s.Store.Append(ctx, ev, expect)
	if err != nil && s.alarm.Full() {
		return 0, events.ErrNoSpace
	}
	return seq, err
}

// awaitRoom returns a channel closed once the store's disk, found full by alarm,
// has room again; the watch ends with ctx.
func awaitRoom(ctx context.Context, dir string, alarm *storeAlarm, logger *slog.Logger) <-chan struct{} {
	hasRoom := make(chan struct{})
	go func() {
		told := false
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !alarm.Full() {
				continue
			}
			if freeSpace(dir) >= diskRoomBytes {
				close(hasRoom)
				return
			}
			if !told {
				logger.Error("the disk of the event store is full: no event is recorded until it has room again", "dir", dir)
				told = true
			}
		}
	}()
	return hasRoom
}
