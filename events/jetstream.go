package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDuplicates is the event stream's and the inbox's dedupe window unless
// configured. NATS keeps every message id of the window in memory (about 100
// bytes each: 7 of them a task), and reads the window's messages back to rebuild
// that set when it restarts. The window need only outlast a retry of one append
// (a worker's is bounded by 10 s); a retry after it is still resolved, by the
// task's last event id or by searching the inbox.
const DefaultDuplicates = 30 * time.Second

// StreamConfig is how the event stream is created.
type StreamConfig struct {
	Replicas int
	// Duplicates is JetStream's dedupe window for event ids. A retry after it has
	// passed is still resolved, by comparing the task's last event id.
	Duplicates time.Duration
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	return c
}

// JetStreamStore is the Store over a JetStream stream.
type JetStreamStore struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

var _ Store = (*JetStreamStore)(nil)

// The event stream takes the events on their published subjects and stores them
// on their task's StoredSubject: one subject, and one entry of the stream's
// subject index, per task.
var (
	streamSubjects = []string{SubjectPrefix + ".*", SubjectPrefix + ".*.*"}
	storedSubject  = &jetstream.SubjectTransformConfig{
		Source:      SubjectPrefix + ".*.*",
		Destination: SubjectPrefix + ".{{wildcard(1)}}",
	}
)

func streamConfig(cfg StreamConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:             StreamName,
		Description:      "bgtask lifecycle events, stored on one subject per task",
		Subjects:         streamSubjects,
		SubjectTransform: storedSubject,
		Storage:          jetstream.FileStorage,
		Retention:        jetstream.LimitsPolicy,
		Discard:          jetstream.DiscardNew,
		Replicas:         cfg.Replicas,
		Duplicates:       cfg.Duplicates,
		AllowDirect:      true,
	}
}

// OpenStore creates or updates the event stream and returns a store over it. An
// event stream of the layout before one subject per task is upgraded first; see
// upgradeStream.
func OpenStore(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (*JetStreamStore, error) {
	cfg = cfg.withDefaults()
	if err := upgradeStream(ctx, js, cfg); err != nil {
		return nil, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, streamConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", StreamName, err)
	}
	return &JetStreamStore{js: js, stream: stream}, nil
}

// Append implements Store.
func (s *JetStreamStore) Append(ctx context.Context, ev Event, expect uint64) (uint64, error) {
	if !ValidToken(ev.TaskID) {
		return 0, fmt.Errorf("events: invalid task id %q", ev.TaskID)
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: TaskSubject(ev.TaskID, ev.Type), Data: data, Header: nats.Header{}}
	opts := []jetstream.PublishOpt{
		jetstream.WithMsgID(ev.ID),
		jetstream.WithExpectStream(StreamName),
		jetstream.WithExpectLastSequenceForSubject(expect, StoredSubject(ev.TaskID)),
	}
	ack, err := s.js.PublishMsg(ctx, msg, opts...)
	// A retry that reaches a replicated stream while the first attempt is still
	// being replicated gets 10158 ("duplicate message id is in process"); once the
	// first is stored, the same publish gets its duplicate acknowledgement.
	for wait := inProcessWait; isInProcess(err) && wait > 0; wait -= noDirectGetPause {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(noDirectGetPause):
		}
		ack, err = s.js.PublishMsg(ctx, msg, opts...)
	}
	if err == nil && ack.Duplicate {
		// On a replicated stream, inside the dedupe window, a retry of an append
		// that was stored is acknowledged as a duplicate with the original
		// sequence before its condition is checked. It is the same answer as on
		// one server only while the event is still the task's last.
		last, lerr := s.Last(ctx, ev.TaskID)
		switch {
		case lerr != nil:
			return 0, fmt.Errorf("append %s to task %s: %w", ev.Type, ev.TaskID, lerr)
		case last.Seq > ack.Sequence:
			return 0, ErrConflict
		}
	}
	if err == nil {
		return ack.Sequence, nil
	}
	if !isWrongLastSequence(err) {
		return 0, fmt.Errorf("append %s to task %s: %w", ev.Type, ev.TaskID, err)
	}
	// Either another writer won, or this is a retry of our own append whose ack was
	// lost: the two look the same to the server, so ask which event is last.
	last, lerr := s.Last(ctx, ev.TaskID)
	if lerr == nil && last.ID == ev.ID {
		return last.Seq, nil
	}
	return 0, ErrConflict
}

// jsErrCodeMsgIDInProcess is JetStream's 10158: a message with this id is being
// stored by another publish right now.
const jsErrCodeMsgIDInProcess jetstream.ErrorCode = 10158

// inProcessWait bounds how long Append waits out 10158.
const inProcessWait = 2 * time.Second

func isInProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeMsgIDInProcess
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// Last implements Store.
func (s *JetStreamStore) Last(ctx context.Context, taskID string) (Record, error) {
	if !ValidToken(taskID) {
		return Record{}, ErrNotFound
	}
	raw, err := s.lastRaw(ctx, taskID)
	if err != nil {
		return Record{}, err
	}
	return DecodeRecord(raw.Sequence, raw.Data)
}

// replicated reports whether the stream keeps more than one copy. A direct get on
// a replicated stream may be answered by a follower that has not yet applied an
// append the leader acknowledged, so Last asks the leader there.
func (s *JetStreamStore) replicated() bool {
	info := s.stream.CachedInfo()
	return info != nil && info.Config.Replicas > 1
}

// directGet runs get, a direct get of a message, and runs it again while no server
// answers, for up to noDirectGetWait: the servers of a replicated stream answer
// direct gets once they are current, and for a moment after the stream is made or
// its leader elected, none may.
func directGet(ctx context.Context, get func() (*jetstream.RawStreamMsg, error)) (*jetstream.RawStreamMsg, error) {
	msg, err := get()
	for wait := noDirectGetWait; errors.Is(err, nats.ErrNoResponders) && wait > 0; wait -= noDirectGetPause {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(noDirectGetPause):
		}
		msg, err = get()
	}
	return msg, err
}

// How long directGet waits for a server to answer, and how often it asks.
const (
	noDirectGetWait  = 2 * time.Second
	noDirectGetPause = 50 * time.Millisecond
)

// History implements Store.
func (s *JetStreamStore) History(ctx context.Context, taskID string) ([]Record, error) {
	return s.HistoryOf(ctx, taskID, 0)
}

// historyBatch is the most events a history read asks a server for at once.
const historyBatch = 256

// HistoryOf is History for a task known to have n events (0: not known), which
// sizes the first read; see readHistory.
func (s *JetStreamStore) HistoryOf(ctx context.Context, taskID string, n int) ([]Record, error) {
	return s.readHistory(ctx, taskID, n, nil)
}

// historyCatchUp is how long a history read waits for the replica it reads from
// to reach the last event another replica showed.
const historyCatchUp = 2 * time.Second

// LastSeq implements Store. It is the sequence of the last event stored, read
// from the stream's leader, not the stream's own last sequence: a write that fails
// for lack of space takes a sequence and stores nothing, and a replay that waited
// for that sequence waited for ever.
func (s *JetStreamStore) LastSeq(ctx context.Context) (uint64, error) {
	raw, err := leaderLast(ctx, s.js.Conn(), StreamName, SubjectPrefix+".>")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the last event: %w", err)
	}
	return raw.Sequence, nil
}

// Identity is the stream's name and creation time: a stream deleted and created
// again under the same name has another.
func (s *JetStreamStore) Identity(ctx context.Context) (string, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return "", err
	}
	return info.Config.Name + "@" + info.Created.UTC().Format(time.RFC3339Nano), nil
}

// EventID is the id of the event at seq, or ErrNotFound.
func (s *JetStreamStore) EventID(ctx context.Context, seq uint64) (string, error) {
	raw, err := directGet(ctx, func() (*jetstream.RawStreamMsg, error) { return s.stream.GetMsg(ctx, seq) })
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", err
	}
	rec, err := DecodeRecord(raw.Sequence, raw.Data)
	if err != nil {
		return "", err
	}
	return rec.ID, nil
}

// shortReadInactivity lets the server remove the consumer of a one-off read soon
// after it is done if endRead could not, instead of keeping it for the default
// five minutes.
const shortReadInactivity = 5 * time.Second

// readConsumer makes the consumer of a one-off read, which the reader fetches
// with and removes with endRead. A plain consumer, not an ordered one: an ordered
// consumer makes a new one on the server for every fetch.
func readConsumer(ctx context.Context, stream jetstream.Stream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.InactiveThreshold = shortReadInactivity
	cfg.MemoryStorage = true
	cfg.Replicas = 1
	return stream.CreateConsumer(ctx, cfg)
}

// endRead removes the consumer of a read that is done. JetStream counts a stream's
// consumers against a limit (1,000 a stream by default since nats-server 2.15), and
// a consumer left to its inactivity threshold holds its place that long: reads at
// more than the limit over the threshold a second failed with "maximum consumers
// limit reached". Best effort, also after ctx ended: the threshold removes what
// this cannot.
func endRead(stream jetstream.Stream, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return // never made on the server: nothing was read
	}
	ctx, cancel := context.WithTimeout(context.Background(), endReadTimeout)
	defer cancel()
	_ = stream.DeleteConsumer(ctx, info.Name)
}

// endReadTimeout bounds endRead, which a reader whose server went away waits for.
const endReadTimeout = time.Second

// ConnectStore returns a store over an event stream that the server created.
func ConnectStore(ctx context.Context, js jetstream.JetStream) (*JetStreamStore, error) {
	stream, err := js.Stream(ctx, StreamName)
	if err != nil {
		return nil, fmt.Errorf("find stream %s (is bgtask server running?): %w", StreamName, err)
	}
	return &JetStreamStore{js: js, stream: stream}, nil
}

// Follow calls fn with every event after sequence after, in order, then waits for new
// ones; taskID limits it to one task, "" follows the whole log. A record that does not
// decode is passed with its error, so one bad event cannot stop a reader. Follow
// returns when fn returns false (nil) or ctx ends (its error).
//
// Every reader of Follow folds every event, so a record's payload comes decoded
// (Decode returns it without reading it again); and the events are decoded on
// every core ahead of fn, which decoding would otherwise hold up: on a restart it
// is most of the work of reading the whole stream.
func (s *JetStreamStore) Follow(ctx context.Context, taskID string, after uint64, fn func(Record, error) bool) error {
	cfg := jetstream.OrderedConsumerConfig{}
	if taskID != "" {
		cfg.FilterSubjects = []string{StoredSubject(taskID)}
	}
	if after > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = after + 1
	}
	cons, err := s.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("follow events: %w", err)
	}
	defer endRead(s.stream, cons)
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("follow events: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	stopped, err := decodeInOrder(it, fn)
	switch {
	case stopped:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("follow events: %w", err)
}

// followed is one message of a Follow, decoded.
type followed struct {
	rec Record
	err error
	// fatal: the message has no metadata, so no sequence: Follow ends with it.
	fatal error
}

// decodeInOrder reads it until it ends, decodes its messages on one goroutine per
// core, and calls fn with them in the order read, until fn returns false (stopped)
// or it ends (its error, or a message without metadata). Message i goes to decoder
// i mod n and its result is taken from that decoder's queue in turn, so the order
// needs no bookkeeping.
func decodeInOrder(it jetstream.MessagesContext, fn func(Record, error) bool) (stopped bool, err error) {
	n := runtime.GOMAXPROCS(0)
	in := make([]chan jetstream.Msg, n)
	out := make([]chan followed, n)
	for k := range n {
		in[k], out[k] = make(chan jetstream.Msg, 128), make(chan followed, 128)
	}
	var readErr error // written before the queues close, read after
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() {
			for _, c := range in {
				close(c)
			}
		}()
		for i := 0; ; i++ {
			msg, err := it.Next()
			if err != nil {
				readErr = err
				return
			}
			in[i%n] <- msg
		}
	})
	for k := range n {
		wg.Go(func() {
			defer close(out[k])
			for msg := range in[k] {
				meta, err := msg.Metadata()
				if err != nil {
					out[k] <- followed{fatal: err}
					continue
				}
				rec, err := decodeFolded(meta.Sequence.Stream, msg.Data())
				out[k] <- followed{rec: rec, err: err}
			}
		})
	}
	// Once fn is done, the rest is drained so that every goroutine ends.
	done := false
	for i := 0; ; i++ {
		f, ok := <-out[i%n]
		if !ok {
			break
		}
		switch {
		case done:
		case f.fatal != nil:
			done, err = true, f.fatal
			it.Stop()
		case !fn(f.rec, f.err):
			done, stopped = true, true
			it.Stop()
		}
	}
	wg.Wait()
	if done {
		return stopped, err
	}
	return false, readErr
}
