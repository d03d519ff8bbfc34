package projections

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// A snapshot file is the projection at one sequence of the event stream, so that a
// restart folds only the events after it. It is JSON lines: a header, one task's
// state per line, and a trailer with the count and a CRC-32C of everything before
// it. A settled task's line is its summary. It is a cache: a snapshot that is damaged, of another stream or build, or
// folded from events the stream no longer holds is removed, and the stream is
// replayed from its start.

// snapshotVersion names the fold a snapshot holds. Raise it when Apply folds an
// event differently: the state's type would not change, and a snapshot of the
// old fold would otherwise be taken for the new one. A change of the state's
// type is caught by its fingerprint.
const snapshotVersion = 2

const snapshotFormat = "bgtask-projection"

// maxSnapshotLine bounds one task's state in a snapshot: a state holds at most a
// few events' worth of data, and an event is at most 1 MiB.
const maxSnapshotLine = 64 << 20

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	// stateFingerprint changes whenever engine.State's fields or their types do,
	// or the summary's. It is worked out at the first snapshot read or written,
	// not at every start of the binary, a client command's too.
	stateFingerprint = sync.OnceValue(func() string { return mustFingerprint(reflect.TypeFor[snapshotState]()) })
	trailerPrefix    = []byte(`{"crc32c":`)
)

type snapshotHeader struct {
	Format      string `json:"format"`
	Version     int    `json:"version"`
	Fingerprint string `json:"fingerprint"`
	// Build is the build of bgtask that wrote it: an upgrade replays once.
	Build string `json:"build"`
	// Stream identifies the event stream the snapshot was folded from; Seq is the
	// last of its events in the snapshot, and CheckSeq and CheckID the last event
	// that decoded, read again at a restore: a stream that went back (a crash of
	// its host before its own fsync, a restored backup) holds another event there.
	Stream       string    `json:"stream"`
	Seq          uint64    `json:"seq"`
	CheckSeq     uint64    `json:"check_seq,omitempty"`
	CheckID      string    `json:"check_id,omitempty"`
	Tasks        int       `json:"tasks"`
	Problems     []Problem `json:"problems,omitempty"`
	ProblemCount int       `json:"problem_count,omitempty"`
	WrittenAt    time.Time `json:"written_at"`
}

type snapshotTrailer struct {
	CRC32C uint32 `json:"crc32c"`
	Tasks  int    `json:"tasks"`
}

// snapshotState is a task's line in a snapshot. A finished task's wake-up most
// often repeats its run's tail: the line holds it once (it is a third of a line).
type snapshotState struct {
	*engine.State
	SharedTail bool `json:"wakeup_tail_is_run_tail,omitempty"`
	// Summary is a settled task's line, in place of its state.
	Summary *summary `json:"summary,omitempty"`
}

// snapshot is a projection read back from a file.
type snapshot struct {
	header snapshotHeader
	tasks  map[string]*engine.State
	done   map[string]*summary
}

// writeSnapshotFile writes the states to path: to a temporary file beside it,
// synced, then renamed over it, so that a reader sees the old snapshot or the new
// one. It gives up when ctx ends, so that a stop does not wait for a whole write.
func writeSnapshotFile(ctx context.Context, path string, h snapshotHeader, states []engine.State, sums []summary) (size int64, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h.Format, h.Version, h.Fingerprint, h.Tasks = snapshotFormat, snapshotVersion, stateFingerprint(), len(states)+len(sums)
	buf := bufio.NewWriterSize(f, 1<<20)
	crc := crc32.New(castagnoli)
	enc := json.NewEncoder(io.MultiWriter(buf, crc))
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return 0, err
	}
	for i := range states {
		if i%1024 == 0 && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		line := snapshotState{State: &states[i]}
		if w := states[i].Wakeup; w != nil && states[i].Run != nil && slices.Equal(w.Tail, states[i].Run.Tail) {
			shared := *w
			shared.Tail, line.Wakeup, line.SharedTail = nil, &shared, len(w.Tail) > 0
		}
		if err := enc.Encode(line); err != nil {
			return 0, fmt.Errorf("task %s: %w", states[i].ID, err)
		}
	}
	for i := range sums {
		if i%1024 == 0 && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err := enc.Encode(snapshotState{Summary: &sums[i]}); err != nil {
			return 0, fmt.Errorf("task %s: %w", sums[i].ID, err)
		}
	}
	if err := json.NewEncoder(buf).Encode(snapshotTrailer{CRC32C: crc.Sum32(), Tasks: h.Tasks}); err != nil {
		return 0, err
	}
	if err := buf.Flush(); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return info.Size(), os.Rename(f.Name(), path)
}

// removeSnapshotLeftovers removes the temporary files of writes that a crash
// interrupted. Servers that share a home may be writing theirs now: a write takes
// seconds, so only files untouched for ten minutes are left over.
func removeSnapshotLeftovers(path string) {
	leftovers, _ := filepath.Glob(path + ".tmp-*")
	for _, name := range leftovers {
		if info, err := os.Stat(name); err == nil && time.Since(info.ModTime()) > 10*time.Minute {
			os.Remove(name)
		}
	}
}

// readSnapshot reads the snapshot at path if accept takes its header. The states
// are decoded on every core; a snapshot that is damaged in any way is an error.
func readSnapshot(path, build string, accept func(snapshotHeader) error) (*snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	lines := bufio.NewScanner(f)
	lines.Buffer(make([]byte, 1<<20), maxSnapshotLine)
	if !lines.Scan() {
		if err := lines.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("the file is empty")
	}
	crc := crc32.Update(0, castagnoli, lines.Bytes())
	crc = crc32.Update(crc, castagnoli, []byte{'\n'})
	var h snapshotHeader
	if err := json.Unmarshal(lines.Bytes(), &h); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	switch {
	case h.Format != snapshotFormat:
		return nil, fmt.Errorf("format %q is not %q", h.Format, snapshotFormat)
	case h.Version != snapshotVersion || h.Fingerprint != stateFingerprint() || h.Build != build:
		return nil, fmt.Errorf("it holds the state of another version of bgtask (%d/%s/%s, this is %d/%s/%s)",
			h.Version, h.Fingerprint, h.Build, snapshotVersion, stateFingerprint(), build)
	case h.Tasks < 0 || int64(h.Tasks) > info.Size()/2:
		return nil, fmt.Errorf("the header says %d tasks, in %d bytes", h.Tasks, info.Size())
	}
	if err := accept(h); err != nil {
		return nil, err
	}
	tasks, done, err := decodeStates(lines, crc, h.Tasks)
	if err != nil {
		return nil, err
	}
	return &snapshot{header: h, tasks: tasks, done: done}, nil
}

// SnapshotSeq is the stream sequence the snapshot at path holds the state up to,
// read from its header alone (the rest is not checked); fs.ErrNotExist if there is
// none. The bench and the tests wait with it for a snapshot to be written.
func SnapshotSeq(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var h snapshotHeader
	if err := json.NewDecoder(f).Decode(&h); err != nil {
		return 0, fmt.Errorf("snapshot %s: header: %w", path, err)
	}
	return h.Seq, nil
}

// stateBatch is a run of state lines, decoded by one goroutine.
type stateBatch struct {
	data []byte
	ends []int
}

type decodedBatch struct {
	states []*engine.State
	sums   []*summary
	err    error
}

// decodeStates decodes the state lines that follow the header, on every core, and
// checks them against the trailer.
func decodeStates(lines *bufio.Scanner, crc uint32, want int) (map[string]*engine.State, map[string]*summary, error) {
	batches := make(chan stateBatch, 4)
	results := make(chan decodedBatch, 4)
	stop := make(chan struct{})
	// Batches go back to the reader once decoded (the states copy what they keep):
	// a snapshot of hundreds of MiB then needs a few MiB of them.
	reuse := make(chan stateBatch, 8)
	var readErr error // written before batches closes
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(batches)
		readErr = scanStates(lines, crc, want, batches, reuse, stop)
	})
	var decoders sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		decoders.Go(func() {
			for b := range batches {
				results <- decodeBatch(b)
				select {
				case reuse <- b:
				default:
				}
			}
		})
	}
	go func() {
		decoders.Wait()
		close(results)
	}()
	tasks, done := map[string]*engine.State{}, make(map[string]*summary, want)
	var err error
	for r := range results {
		if err != nil {
			continue
		}
		if r.err != nil {
			err = r.err
			close(stop)
			continue
		}
		for _, s := range r.states {
			tasks[s.ID] = s
		}
		for _, s := range r.sums {
			done[s.ID] = s
		}
	}
	wg.Wait()
	if readErr != nil {
		err = readErr
	}
	if n := len(tasks) + len(done); err == nil && n != want {
		err = fmt.Errorf("%d distinct tasks, the header says %d", n, want)
	}
	return tasks, done, err
}

// scanStates reads the state lines into batches of 1 MiB or more until the trailer,
// and checks the count and the CRC the trailer holds. It reads to the end even
// when the decoding stopped: what is wrong with the file explains a bad line
// better than the line does. A batch is sent only once a line follows it, so a
// line cut short by the end of the file is never decoded.
func scanStates(lines *bufio.Scanner, crc uint32, want int, batches chan<- stateBatch, reuse <-chan stateBatch, stop <-chan struct{}) error {
	const batchBytes = 1 << 20
	fresh := func() stateBatch {
		select {
		case b := <-reuse:
			return stateBatch{data: b.data[:0], ends: b.ends[:0]}
		default:
			return stateBatch{data: make([]byte, 0, 2*batchBytes), ends: make([]int, 0, 512)}
		}
	}
	b := fresh()
	stopped := false
	send := func() {
		if !stopped && len(b.ends) > 0 {
			select {
			case batches <- b:
				b = fresh()
				return
			case <-stop:
				stopped = true
			}
		}
		b.data, b.ends = b.data[:0], b.ends[:0]
	}
	count := 0
	for lines.Scan() {
		line := lines.Bytes()
		if bytes.HasPrefix(line, trailerPrefix) {
			var t snapshotTrailer
			if err := json.Unmarshal(line, &t); err != nil {
				return fmt.Errorf("trailer: %w", err)
			}
			switch {
			case lines.Scan():
				return errors.New("lines after the trailer")
			case t.Tasks != count || count != want:
				return fmt.Errorf("%d task lines, the trailer says %d and the header %d", count, t.Tasks, want)
			case t.CRC32C != crc:
				return fmt.Errorf("CRC-32C %08x, the trailer says %08x", crc, t.CRC32C)
			}
			send()
			return nil
		}
		if len(b.data) >= batchBytes {
			send()
		}
		crc = crc32.Update(crc, castagnoli, line)
		crc = crc32.Update(crc, castagnoli, []byte{'\n'})
		count++
		b.data = append(b.data, line...)
		b.ends = append(b.ends, len(b.data))
	}
	if err := lines.Err(); err != nil {
		return err
	}
	return fmt.Errorf("no trailer after %d task lines: the file is cut short", count)
}

func decodeBatch(b stateBatch) decodedBatch {
	var out decodedBatch
	// Numbers as the events' decoder reads them (a completion's match values are
	// json.Number there): a float64 would change them.
	dec := json.NewDecoder(bytes.NewReader(b.data))
	dec.UseNumber()
	for range b.ends {
		line := snapshotState{State: new(engine.State)}
		if err := dec.Decode(&line); err != nil {
			out.err = fmt.Errorf("a task's state: %w", err)
			return out
		}
		if sum := line.Summary; sum != nil {
			if line.State.ID != "" || line.SharedTail || sum.ID == "" {
				out.err = errors.New("a task's summary has no id, or more than a summary")
				return out
			}
			out.sums = append(out.sums, sum)
			continue
		}
		s := line.State
		if s.ID == "" {
			out.err = errors.New("a task's state has no id")
			return out
		}
		if line.SharedTail {
			if s.Wakeup == nil || s.Run == nil {
				out.err = fmt.Errorf("task %s: a shared tail without a wake-up and a run", s.ID)
				return out
			}
			// Shared in memory too, as Apply shares it.
			s.Wakeup.Tail = s.Run.Tail
		}
		out.states = append(out.states, s)
	}
	if dec.More() {
		out.err = errors.New("a task's line holds more than its state")
	}
	return out
}

func mustFingerprint(t reflect.Type) string {
	var b strings.Builder
	if err := describeType(&b, t, map[reflect.Type]bool{}); err != nil {
		panic(fmt.Sprintf("projections: snapshots cannot hold %s: %v", t, err))
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

var (
	jsonMarshaler   = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
)

// describeType writes t's shape as JSON sees it: every field's name, JSON key and
// type. A field JSON would not carry (unexported, or "-") is an error: a snapshot
// would silently lose it.
func describeType(b *strings.Builder, t reflect.Type, seen map[reflect.Type]bool) error {
	if t.Implements(jsonMarshaler) && reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		b.WriteString(t.String()) // its own encoding, such as time.Time's
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		b.WriteString(t.Kind().String() + " ")
		return describeType(b, t.Elem(), seen)
	case reflect.Map:
		b.WriteString("map[" + t.Key().Kind().String() + "]")
		return describeType(b, t.Elem(), seen)
	case reflect.Struct:
		if seen[t] {
			b.WriteString(t.String())
			return nil
		}
		seen[t] = true
		b.WriteString("{")
		for f := range t.Fields() {
			tag := f.Tag.Get("json")
			if !f.IsExported() || tag == "-" {
				return fmt.Errorf("field %s.%s is not carried by JSON", t, f.Name)
			}
			b.WriteString(f.Name + " " + tag + " ")
			if err := describeType(b, f.Type, seen); err != nil {
				return err
			}
			b.WriteString(";")
		}
		b.WriteString("}")
		return nil
	case reflect.Interface:
		if t.NumMethod() == 0 {
			// Only JSON's own values, numbers as json.Number: every state is
			// decoded from JSON events so, and a snapshot is read back so.
			b.WriteString("any")
			return nil
		}
		return fmt.Errorf("%s is not carried by JSON whole", t)
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Complex64, reflect.Complex128:
		return fmt.Errorf("%s is not carried by JSON whole", t)
	}
	b.WriteString(t.Kind().String())
	return nil
}

// restore starts the projection from the snapshot, if there is one that is of
// this stream, no newer than target (its last event), and folded from the events
// the stream still holds. A snapshot that is not used is removed: it could fit
// again later (a stream that went back grows past it) without being right.
func (p *Projector) restore(ctx context.Context, target uint64) {
	if p.snapshots.Path == "" || p.snapshots.Every == 0 {
		return
	}
	stream, err := p.log.Identity(ctx)
	if err != nil {
		p.base.Logger.Warn("no projection snapshots: the stream's identity is unreadable", "err", err)
		return
	}
	p.stream = stream
	removeSnapshotLeftovers(p.snapshots.Path)
	start := time.Now()
	snap, err := readSnapshot(p.snapshots.Path, p.snapshots.Build, func(h snapshotHeader) error {
		switch {
		case h.Stream != stream:
			return fmt.Errorf("it is of another event stream (%s, this one is %s)", h.Stream, stream)
		case h.Seq > target:
			return fmt.Errorf("it is at seq %d, past the stream's last event %d", h.Seq, target)
		case h.CheckSeq == 0:
			return nil
		}
		id, err := p.log.EventID(ctx, h.CheckSeq)
		switch {
		case errors.Is(err, events.ErrNotFound):
			return nil // compacted away since: the archived event that replaced it comes later
		case err != nil:
			return fmt.Errorf("its last event, at seq %d, is unreadable: %w", h.CheckSeq, err)
		case id != h.CheckID:
			return fmt.Errorf("the stream holds another event at seq %d than the one it folded: the stream went back", h.CheckSeq)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		p.replayed.SnapshotSkipped = err.Error()
		p.base.Logger.Warn("projection snapshot not used: replaying the whole stream", "path", p.snapshots.Path, "reason", err)
		if err := os.Remove(p.snapshots.Path); err != nil {
			p.base.Logger.Warn("projection snapshot not removed", "path", p.snapshots.Path, "err", err)
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tasks, p.summaries = snap.tasks, snap.done
	for id, s := range p.tasks {
		p.index(id, "", s.Phase)
	}
	for _, s := range p.summaries {
		p.phases[s.Phase]++
		// One copy of each shared string, as the fold keeps them.
		s.Kind, s.Target, s.Status = p.interned.get(s.Kind), p.interned.get(s.Target), p.interned.get(s.Status)
		s.Placement = p.interned.placement(s.Placement)
	}
	p.problems, p.problemCount = snap.header.Problems, snap.header.ProblemCount
	p.applied, p.snapshotSeq, p.replayed.SnapshotSeq = snap.header.Seq, snap.header.Seq, snap.header.Seq
	p.checkSeq, p.checkID = snap.header.CheckSeq, snap.header.CheckID
	p.base.Logger.Info("projection snapshot read", "path", p.snapshots.Path, "seq", snap.header.Seq,
		"tasks", len(snap.tasks)+len(snap.done), "took", time.Since(start).Round(time.Millisecond))
}

// checkSnapshotDue asks for a snapshot once enough events were applied since the
// last. Called with the lock held.
func (p *Projector) checkSnapshotDue() {
	if p.applied-p.snapshotSeq < max(p.snapshots.Every, uint64(len(p.tasks)+len(p.summaries))) {
		return
	}
	select {
	case p.snapshotDue <- struct{}{}:
	default:
	}
}

func (p *Projector) snapshotLoop(ctx context.Context, due <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-due:
			if ctx.Err() != nil {
				return // both were ready: a stop starts no write
			}
		}
		p.saveSnapshot(ctx)
	}
}

// saveSnapshot writes the projection as it is now. The states are copied under
// the lock (they are values: nothing they point to changes) and encoded outside it.
func (p *Projector) saveSnapshot(ctx context.Context) {
	start := time.Now()
	p.mu.RLock()
	h := snapshotHeader{
		Build: p.snapshots.Build, Stream: p.stream, Seq: p.applied, CheckSeq: p.checkSeq, CheckID: p.checkID,
		WrittenAt: start, Problems: slices.Clone(p.problems), ProblemCount: p.problemCount,
	}
	states := make([]engine.State, 0, len(p.tasks))
	for _, s := range p.tasks {
		states = append(states, *s)
	}
	sums := make([]summary, 0, len(p.summaries))
	for _, s := range p.summaries {
		sums = append(sums, *s)
	}
	p.mu.RUnlock()
	size, err := writeSnapshotFile(ctx, p.snapshots.Path, h, states, sums)
	p.mu.Lock()
	// A failed write is tried again after as many events, not at the next one.
	p.snapshotSeq = h.Seq
	p.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			p.base.Logger.Warn("projection snapshot not written", "path", p.snapshots.Path, "err", err)
		}
		return
	}
	p.base.Logger.Info("projection snapshot written", "path", p.snapshots.Path, "seq", h.Seq,
		"tasks", len(states)+len(sums), "bytes", size, "took", time.Since(start).Round(time.Millisecond))
	p.TestSignals.Snapshotted.Signal(h.Seq)
}
