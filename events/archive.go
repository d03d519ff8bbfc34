package events

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The archive keeps the whole history of a finished task after the task was
// compacted in the event stream down to its archived event. It has one subject, so
// JetStream keeps no per-task index for it: an archived history is found by the
// sequence its archived event names.
const (
	ArchiveStreamName = "BGTASK_ARCHIVE"
	ArchiveSubject    = "bgtask.archive"
	// maxArchivedBytes stays under JetStream's default 1 MiB message limit.
	maxArchivedBytes = 1000 << 10
)

// TypeArchived is the last event of a compacted task; see Archived.
const TypeArchived Type = "archived"

// Archived ends a finished task's life in the event stream: its history is in the
// archive at ArchiveSeq, the task's subject keeps only this event, and Summary is
// what listings show of it.
type Archived struct {
	ArchiveSeq uint64      `json:"archive_seq"`
	Summary    TaskSummary `json:"summary"`
}

func (*Archived) EventType() Type { return TypeArchived }

// TaskSummary is what stays in memory of an archived task.
type TaskSummary struct {
	Phase    string     `json:"state"`
	Status   string     `json:"status,omitempty"`
	Command  string     `json:"command"`
	Kind     string     `json:"kind,omitempty"`
	Target   string     `json:"target"`
	ArmedAt  time.Time  `json:"armed_at"`
	EndedAt  *time.Time `json:"ended_at,omitempty"`
	FiredAt  *time.Time `json:"fired_at,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Events   int        `json:"events"`
}

// ArchivedHistory is one message of the archive.
type ArchivedHistory struct {
	TaskID string   `json:"task_id"`
	Events []Record `json:"events"`
}

// Archive is the archive stream.
type Archive struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

// OpenArchive creates or updates the archive stream. It keeps histories for good.
func OpenArchive(ctx context.Context, js jetstream.JetStream, replicas int) (*Archive, error) {
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        ArchiveStreamName,
		Description: "bgtask: the gzipped histories of compacted tasks, one message each",
		Subjects:    []string{ArchiveSubject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    max(replicas, 1),
		Duplicates:  10 * time.Minute,
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", ArchiveStreamName, err)
	}
	return &Archive{js: js, stream: stream}, nil
}

// ConnectArchive returns the archive stream a server created.
func ConnectArchive(ctx context.Context, js jetstream.JetStream) (*Archive, error) {
	stream, err := js.Stream(ctx, ArchiveStreamName)
	if err != nil {
		return nil, fmt.Errorf("find stream %s (is bgtask server running?): %w", ArchiveStreamName, err)
	}
	return &Archive{js: js, stream: stream}, nil
}

// gzipWriters are reused: a new gzip.Writer allocates 800 KB of compressor state,
// which costs many times what compressing and publishing a history does
// (BenchmarkArchivePut).
var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// Put stores a task's history and returns its sequence. The message id is the task
// id, so a retry within the dedupe window returns the first copy's sequence.
func (a *Archive) Put(ctx context.Context, taskID string, history []Record) (uint64, error) {
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&buf)
	if err := json.NewEncoder(zw).Encode(ArchivedHistory{TaskID: taskID, Events: history}); err != nil {
		return 0, err
	}
	if err := zw.Close(); err != nil {
		return 0, err
	}
	if buf.Len() > maxArchivedBytes {
		return 0, fmt.Errorf("archive task %s: its history is %d bytes gzipped, over %d", taskID, buf.Len(), maxArchivedBytes)
	}
	ack, err := a.js.PublishMsg(ctx, &nats.Msg{Subject: ArchiveSubject, Data: buf.Bytes()},
		jetstream.WithMsgID(taskID), jetstream.WithExpectStream(ArchiveStreamName))
	if err != nil {
		return 0, fmt.Errorf("archive task %s: %w", taskID, err)
	}
	return ack.Sequence, nil
}

// Get reads the archived history at seq.
func (a *Archive) Get(ctx context.Context, seq uint64) (ArchivedHistory, error) {
	msg, err := directGet(ctx, func() (*jetstream.RawStreamMsg, error) { return a.stream.GetMsg(ctx, seq) })
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ArchivedHistory{}, fmt.Errorf("%w: nothing at archive seq %d", ErrNotFound, seq)
	}
	if err != nil {
		return ArchivedHistory{}, fmt.Errorf("read archive seq %d: %w", seq, err)
	}
	return decodeArchived(msg.Data)
}

func decodeArchived(data []byte) (ArchivedHistory, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return ArchivedHistory{}, fmt.Errorf("archived history: %w", err)
	}
	var h ArchivedHistory
	if err := json.NewDecoder(io.LimitReader(zr, 64<<20)).Decode(&h); err != nil {
		return ArchivedHistory{}, fmt.Errorf("archived history: %w", err)
	}
	return h, nil
}

// Each calls fn with every archived history in order until fn returns false or the
// archive ends. A message that does not decode is passed with its error.
func (a *Archive) Each(ctx context.Context, fn func(seq uint64, h ArchivedHistory, err error) bool) error {
	info, err := a.stream.Info(ctx)
	if err != nil {
		return err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := readConsumer(ctx, a.stream, jetstream.ConsumerConfig{})
	if err != nil {
		return fmt.Errorf("read archive: %w", err)
	}
	defer endRead(a.stream, cons)
	for {
		batch, err := cons.FetchNoWait(64)
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				return err
			}
			h, err := decodeArchived(msg.Data())
			if !fn(meta.Sequence.Stream, h, err) || meta.Sequence.Stream >= last {
				return nil
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if n == 0 {
			return nil
		}
	}
}

// Compact removes every event of a task but its last, which must be its archived
// event: its per-subject state in the stream goes with them.
func (s *JetStreamStore) Compact(ctx context.Context, taskID string) error {
	if !ValidToken(taskID) {
		return ErrNotFound
	}
	err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(StoredSubject(taskID)), jetstream.WithPurgeKeep(1))
	if err != nil {
		return fmt.Errorf("compact task %s: %w", taskID, err)
	}
	return nil
}
