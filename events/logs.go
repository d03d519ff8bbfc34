package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The output of every task is kept in its own stream, one subject per task and
// output stream, in chunks: bgtask.logs.<task-id>.stdout and .stderr.
const (
	LogStreamName = "BGTASK_LOGS"
	LogPrefix     = "bgtask.logs"
	Stdout        = "stdout"
	Stderr        = "stderr"
)

// Log chunk headers: where the chunk starts in its output stream, and the end mark a
// worker puts on the last chunk of an output that ended with something left to
// publish; Read hands it on as a chunk of its own. An output that ended with
// nothing left to publish (an empty stderr, most often) gets no message for its
// end: a run's output is in the log before its end is in the task's history, so
// the task's end says as much, and a message that says nothing new would cost an
// append to the disk with every task.
const (
	LogOffsetHeader = "Bgtask-Offset"
	LogEOFHeader    = "Bgtask-Eof"
)

// Limits of the task logs.
const (
	// MaxLogBytes is how much of each of a task's stdout and stderr is kept: past it,
	// the oldest chunks are dropped (and counted: the first kept chunk's offset says
	// how many bytes went).
	MaxLogBytes = 4 << 20
	// logChunkBytes is the largest chunk one message holds.
	logChunkBytes = 64 << 10
	// logPendingBytes bounds the output waiting to be published; past it the oldest
	// waiting bytes are dropped, so a flood never blocks the command or grows memory.
	// It equals MaxLogBytes: what it drops is older than the last MaxLogBytes, which
	// would go anyway, so the output kept is always one unbroken end of the stream.
	logPendingBytes = MaxLogBytes
	// logFlushInterval is how long output may wait to be published.
	logFlushInterval = 100 * time.Millisecond
)

// LogSubject is the subject of one output stream of a task.
func LogSubject(taskID, stream string) string { return LogPrefix + "." + taskID + "." + stream }

// LogConfig is how the log stream is created.
type LogConfig struct {
	Replicas int
	// MaxAge is how long output is kept after it was written.
	MaxAge time.Duration
	// MaxBytes bounds the whole log stream; the oldest output goes first.
	MaxBytes int64
}

// Logs is the task output store over JetStream.
type Logs struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

// OpenLogs creates or updates the log stream.
func OpenLogs(ctx context.Context, js jetstream.JetStream, cfg LogConfig) (*Logs, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = 7 * 24 * time.Hour
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 4 << 30
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        LogStreamName,
		Description: "bgtask command output, one subject per task and output stream",
		Subjects:    []string{LogPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", LogStreamName, err)
	}
	return &Logs{js: js, stream: stream}, nil
}

// ConnectLogs returns the log store a server created.
func ConnectLogs(ctx context.Context, js jetstream.JetStream) (*Logs, error) {
	stream, err := js.Stream(ctx, LogStreamName)
	if err != nil {
		return nil, fmt.Errorf("find stream %s (is bgtask server running?): %w", LogStreamName, err)
	}
	return &Logs{js: js, stream: stream}, nil
}

// LogChunk is a piece of a task's output.
type LogChunk struct {
	Stream string
	Offset int64
	Data   []byte
	// EOF marks the end of the output stream: a chunk of Read's without data, whose
	// Offset is the stream's total size.
	EOF bool
	// Seq is the chunk's sequence in the log stream (an end mark that rode on the
	// last chunk has that chunk's), where a read after it starts again.
	Seq uint64
}

// Read calls fn with a task's output chunks in the order they were written, from
// the given streams (both if none), up to the current end.
func (l *Logs) Read(ctx context.Context, taskID string, streams []string, fn func(LogChunk) error) error {
	return l.ReadAfter(ctx, taskID, streams, 0, fn)
}

// ReadAfter is Read from the chunks after the log stream's sequence after (0: all),
// for a reader that resumes where it stopped.
func (l *Logs) ReadAfter(ctx context.Context, taskID string, streams []string, after uint64, fn func(LogChunk) error) error {
	return l.read(ctx, taskID, streams, after, closedChannel, fn)
}

// Follow is ReadAfter that waits for more output until every stream read has its
// end mark, or taskEnded is closed: then it returns at the end of what the log
// holds, which is all of the output (see LogEOFHeader). A nil taskEnded waits for
// the end marks alone.
func (l *Logs) Follow(ctx context.Context, taskID string, streams []string, after uint64, taskEnded <-chan struct{}, fn func(LogChunk) error) error {
	return l.read(ctx, taskID, streams, after, taskEnded, fn)
}

var closedChannel = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// followWait is how long a follower's fetch waits for output: a bound on how late
// it sees that the task has ended.
const followWait = 250 * time.Millisecond

func (l *Logs) read(ctx context.Context, taskID string, streams []string, after uint64, taskEnded <-chan struct{}, fn func(LogChunk) error) error {
	if len(streams) == 0 {
		streams = []string{Stdout, Stderr}
	}
	filters := make([]string, len(streams))
	for i, s := range streams {
		filters[i] = LogSubject(taskID, s)
	}
	cfg := jetstream.ConsumerConfig{FilterSubjects: filters}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := readConsumer(ctx, l.stream, cfg)
	if err != nil {
		return fmt.Errorf("read logs of %s: %w", taskID, err)
	}
	defer endRead(l.stream, cons)
	open := map[string]bool{}
	for _, s := range streams {
		open[s] = true
	}
	for len(open) > 0 {
		ended := isClosed(taskEnded)
		var batch jetstream.MessageBatch
		if ended {
			batch, err = cons.FetchNoWait(256)
		} else {
			batch, err = cons.Fetch(256, jetstream.FetchMaxWait(followWait))
		}
		if err != nil {
			return fmt.Errorf("read logs of %s: %w", taskID, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			chunk := decodeChunk(msg)
			if chunk.EOF && len(chunk.Data) > 0 {
				// The last chunk, with the end mark: its data, then the mark.
				data := chunk
				data.EOF = false
				if err := fn(data); err != nil {
					return err
				}
				chunk = LogChunk{Stream: chunk.Stream, Offset: chunk.Offset + int64(len(chunk.Data)), EOF: true, Seq: chunk.Seq}
			}
			if chunk.EOF {
				delete(open, chunk.Stream)
			}
			if err := fn(chunk); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read logs of %s: %w", taskID, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if n == 0 && ended {
			return nil
		}
	}
	return nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// End returns where a task's output stream stands in the log: the offset after its
// last chunk (0 if it has none).
func (l *Logs) End(ctx context.Context, taskID, stream string) (int64, error) {
	msg, err := directGet(ctx, func() (*jetstream.RawStreamMsg, error) {
		return l.stream.GetLastMsgForSubject(ctx, LogSubject(taskID, stream))
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	offset, _ := strconv.ParseInt(msg.Header.Get(LogOffsetHeader), 10, 64)
	return offset + int64(len(msg.Data)), nil
}

func decodeChunk(msg jetstream.Msg) LogChunk {
	subject := msg.Subject()
	stream := subject[len(subject)-len(Stdout):] // stdout and stderr have one length
	offset, _ := strconv.ParseInt(msg.Headers().Get(LogOffsetHeader), 10, 64)
	var seq uint64
	if meta, err := msg.Metadata(); err == nil {
		seq = meta.Sequence.Stream
	}
	return LogChunk{Stream: stream, Offset: offset, Data: msg.Data(), EOF: msg.Headers().Get(LogEOFHeader) != "", Seq: seq}
}

// LogWriter keeps one output stream of one task in the log stream. Write never
// blocks and never fails: output is buffered and published in chunks by a
// goroutine of its own, which runs only while output waits to be published (a
// quiet command's writer costs no goroutine), and what cannot be kept is
// dropped and counted.
type LogWriter struct {
	logs    *Logs
	subject string
	ctx     context.Context
	cancel  context.CancelFunc

	mu       sync.Mutex
	pending  []byte
	offset   int64 // offset of pending[0] in the output stream
	dropped  int64
	kept     []keptChunk // published chunks still in the stream, oldest first
	keptSize int64
	closed   bool
	final    bool
	// flushing: the writer's goroutine (run) runs.
	flushing bool
	wake     chan struct{}
	done     chan struct{}
}

type keptChunk struct {
	seq  uint64
	size int64
}

// Writer starts a writer for one output stream of a task. offset continues an
// output that an earlier run of the same task began.
func (l *Logs) Writer(taskID, stream string, offset int64) *LogWriter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &LogWriter{
		logs: l, subject: LogSubject(taskID, stream), ctx: ctx, cancel: cancel,
		offset: offset, wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	return w
}

// Write implements io.Writer.
func (w *LogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if !w.closed {
		w.pending = append(w.pending, p...)
		if over := len(w.pending) - logPendingBytes; over > 0 {
			w.pending = w.pending[over:]
			w.offset += int64(over)
			w.dropped += int64(over)
		}
	}
	full := len(w.pending) >= logChunkBytes
	w.startFlushing()
	w.mu.Unlock()
	if full { // a full chunk goes now; less waits up to logFlushInterval
		w.signal()
	}
	return len(p), nil
}

// startFlushing starts the writer's goroutine unless it runs. w.mu is held.
func (w *LogWriter) startFlushing() {
	if !w.flushing {
		w.flushing = true
		go w.run()
	}
}

// Skip drops the next n bytes of the output, which the writer never had: they
// were lost before they were read. What is pending goes with them (pending output
// is one unbroken run of bytes): it is older than what follows the gap, and a
// gap comes after more output than the log keeps.
func (w *LogWriter) Skip(n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	gone := int64(len(w.pending)) + n
	w.pending = w.pending[:0]
	w.offset += gone
	w.dropped += gone
}

func (w *LogWriter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Close publishes what is left, with final the end mark on its last chunk (a run
// that is followed by another of the same task leaves it to the last one), waiting
// at most until ctx ends. It returns the total size of the output and how many of
// its bytes were dropped. Nothing left to publish, no end mark (LogEOFHeader).
func (w *LogWriter) Close(ctx context.Context, final bool) (total, dropped int64) {
	w.mu.Lock()
	w.closed, w.final = true, final
	w.startFlushing()
	w.mu.Unlock()
	w.signal()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.cancel()
		<-w.done
	}
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	total = w.offset + int64(len(w.pending))
	w.dropped += int64(len(w.pending))
	w.offset, w.pending = total, nil
	return total, w.dropped
}

// run publishes the pending output, at most logFlushInterval after it came,
// until none is left; once the writer is closed, until it is all published (or
// Close gives up), and then it is done.
func (w *LogWriter) run() {
	due := time.NewTimer(logFlushInterval)
	defer due.Stop()
	for {
		select {
		case <-w.wake:
		case <-due.C:
		case <-w.ctx.Done():
			close(w.done)
			return
		}
		w.mu.Lock()
		closed, final := w.closed, w.final
		w.mu.Unlock()
		published := w.flush(closed && final)
		w.mu.Lock()
		switch {
		case published && closed: // all of it, its end mark on the last chunk
			w.mu.Unlock()
			close(w.done)
			return
		case published && !w.closed && len(w.pending) == 0:
			w.flushing = false
			w.mu.Unlock()
			return
		}
		// Output came meanwhile, or a publish failed: again, within the interval;
		// closed meanwhile: again at once, on Close's signal.
		w.mu.Unlock()
		due.Reset(logFlushInterval)
	}
}

// flush publishes the pending output in chunks. It reports whether all of it went;
// what did not stays pending for the next flush. With final (the writer is closed
// for good: nothing more comes) the last chunk carries the end mark, which saves
// the exit a round trip to the log stream.
func (w *LogWriter) flush(final bool) bool {
	for {
		w.mu.Lock()
		n := min(len(w.pending), logChunkBytes)
		chunk := append([]byte(nil), w.pending[:n]...)
		offset := w.offset
		last := final && n == len(w.pending)
		w.mu.Unlock()
		if n == 0 {
			return true
		}
		if !w.publish(chunk, offset, last) {
			return false
		}
	}
}

func (w *LogWriter) publish(chunk []byte, offset int64, eof bool) bool {
	msg := &nats.Msg{Subject: w.subject, Data: chunk, Header: nats.Header{}}
	msg.Header.Set(LogOffsetHeader, strconv.FormatInt(offset, 10))
	if eof {
		msg.Header.Set(LogEOFHeader, "1")
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	ack, err := w.logs.js.PublishMsg(ctx, msg)
	if err != nil {
		return false
	}
	w.mu.Lock()
	// Output dropped from the front while the chunk was on its way is already gone.
	if consumed := offset + int64(len(chunk)) - w.offset; consumed > 0 {
		w.pending = w.pending[consumed:]
		w.offset += consumed
	}
	w.kept = append(w.kept, keptChunk{seq: ack.Sequence, size: int64(len(chunk))})
	w.keptSize += int64(len(chunk))
	w.mu.Unlock()
	w.trim()
	return true
}

// trim drops the oldest chunks once the kept output is over MaxLogBytes. It purges
// down to three quarters of the limit, so a steady flood purges now and then, not
// with every chunk. Only the writer's goroutine calls it; the purge runs without
// the lock, so the command's writes never wait for the network.
func (w *LogWriter) trim() {
	w.mu.Lock()
	if w.keptSize <= MaxLogBytes {
		w.mu.Unlock()
		return
	}
	var drop int
	var size int64
	for drop < len(w.kept)-1 && w.keptSize-size > MaxLogBytes*3/4 {
		size += w.kept[drop].size
		drop++
	}
	firstKept := w.kept[drop].seq
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	if err := w.logs.stream.Purge(ctx, jetstream.WithPurgeSubject(w.subject), jetstream.WithPurgeSequence(firstKept)); err != nil {
		return // tried again after the next chunk
	}
	w.mu.Lock()
	w.kept = w.kept[drop:]
	w.keptSize -= size
	w.dropped += size
	w.mu.Unlock()
}
