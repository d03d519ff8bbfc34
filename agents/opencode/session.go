package opencode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/client"
)

// TargetPrefix names a session's target: opencode-SESSION_ID.
const TargetPrefix = "opencode-"

// StateDir, in the bgtask home, holds each session's lock and ledger
// (opencode-SESSION.lock, opencode-SESSION.handed: client.Handoff's) and the
// log of what went wrong (LogName).
const StateDir = "opencode"

// LogName, in StateDir, is where the sessions say what went wrong: the plugin
// shows nobody their stderr.
const LogName = "opencode.log"

// BusyTTL ends a session's busy state by itself: an opencode killed in a turn
// says idle no more.
const BusyTTL = 30 * time.Minute

// stateBound bounds the report of one busy or idle; one that a server down
// makes fail is only logged.
const stateBound = 3 * time.Second

// pendingBound bounds the connection that looks for what is pending as a
// session opens: the message that opened it waits for the answer (the plugin
// waits 10 s at most).
const pendingBound = 8 * time.Second

// offerBatch is how many wake-ups that came together one offer holds at most:
// they are one message, one turn.
const offerBatch = 16

// retryAfter paces the offers of a wake-up that the plugin could not hand
// the session (opencode refused the message, or did not record it in time).
const retryAfter = 5 * time.Second

// CheckSession says why id cannot be a session's, if it cannot: its target,
// TargetPrefix+id, must be a valid one.
func CheckSession(id string) error {
	if client.CheckTarget(TargetPrefix+id) != nil {
		return fmt.Errorf("session %q: an opencode session id is letters, digits, '-' or '_'", id)
	}
	return nil
}

// Session is `bgtask hook opencode session ID`: the plugin's helper for one
// session of one opencode process, which it talks with in JSON lines, one
// object a line (Message). The plugin writes the session's states and its
// answers to In; the helper reports the states (the target busy, for BusyTTL
// at most, or idle) and writes its offers to Out. It ends when In does: the
// opencode process let it go, or is gone.
//
// Its first line is an offer of what the session's inbox holds now, or none:
// that rides along with the message that opened the session in this process.
// Then, Live (an opencode process that goes on after a turn, unlike `opencode
// run`), it offers each wake-up that comes, and the plugin makes it a new turn.
// An offer is handed over (client.Handoff) once the plugin answers that
// opencode recorded the message; a refusal, or an end of In before the answer,
// gives it back to the inbox. One helper of a session waits at a time, across
// processes (Handoff's lock); another offers nothing, and, Live, waits for the
// lock.
type Session struct {
	// Config reaches the bgtask server; Home is its home, in whose StateDir the
	// helpers keep their files.
	Config client.Config
	Home   string
	ID     string
	Live   bool
	In     io.Reader
	Out    io.Writer
	// Log is told what went wrong.
	Log io.Writer

	mu      sync.Mutex
	answers chan Message // the answer to the offer made, once one is awaited
	outMu   sync.Mutex   // one line at a time to Out
}

// Message is a line between the plugin and the helper.
type Message struct {
	// From the plugin: the session's state, busy or idle; or its answer to the
	// offer made, Taken, or not with Error.
	State string `json:"state,omitempty"`
	Taken *bool  `json:"taken,omitempty"`
	Error string `json:"error,omitempty"`
	// From the helper: an offer of wake-ups, their prompts as one text; or None,
	// nothing pending as the session opened here.
	Offer string `json:"offer,omitempty"`
	None  bool   `json:"none,omitempty"`
}

// Run serves the plugin until In ends, or ctx does.
func (s *Session) Run(ctx context.Context) error {
	if err := CheckSession(s.ID); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	states := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Go(func() { s.report(ctx, states) })
	wg.Go(func() { s.handOver(ctx) })
	ended := make(chan struct{})
	// Not waited for when ctx ends first: a read of In cannot be stopped, and the
	// process is ending.
	go func() {
		defer close(ended)
		s.read(states)
	}()
	select {
	case <-ended:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	return nil
}

// read reads the plugin's lines until In ends: the latest state goes to
// states, an answer to the offer that awaits one.
func (s *Session) read(states chan string) {
	dec := json.NewDecoder(s.In)
	for {
		var m Message
		if err := dec.Decode(&m); err != nil {
			if !errors.Is(err, io.EOF) {
				s.warn("read the plugin's line: %v", err)
			}
			return
		}
		switch {
		case m.State == client.TargetBusy || m.State == client.TargetIdle:
			// Only the latest state matters: one not reported yet is replaced.
			select {
			case <-states:
			default:
			}
			states <- m.State
		case m.Taken != nil:
			s.mu.Lock()
			if s.answers != nil {
				s.answers <- m
				s.answers = nil
			}
			s.mu.Unlock()
		}
	}
}

// report records each state the plugin says in the session's target.
func (s *Session) report(ctx context.Context, states <-chan string) {
	for {
		select {
		case <-ctx.Done():
			return
		case state := <-states:
			if err := s.mark(ctx, state); err != nil {
				s.warn("target %s%s %s: %v", TargetPrefix, s.ID, state, err)
			}
		}
	}
}

func (s *Session) mark(ctx context.Context, state string) error {
	ctx, cancel := context.WithTimeout(ctx, stateBound)
	defer cancel()
	return client.MarkSession(ctx, s.Config, TargetPrefix+s.ID, state, BusyTTL)
}

// handOver offers what is pending now, then, Live, each wake-up that comes,
// until ctx ends.
func (s *Session) handOver(ctx context.Context) {
	h := &client.Handoff{Target: TargetPrefix + s.ID, Dir: filepath.Join(s.Home, StateDir), Batch: offerBatch,
		Deliver: s.offer, Dropped: s.dropped,
		// A plugin gone before it answered (opencode exits) may not have handed it
		// over: it goes back. A helper killed meanwhile leaves it handing, most
		// often with its opencode: the next hands it over again (at least once).
		Revocable: true, Redeliver: true,
		// A `bgtask wait --consume` in the session's turn gives that turn the
		// wake-up itself.
		LeaveToWaits: true}
	unlock, err := s.lock(ctx, h)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, client.ErrLocked) {
			s.warn("lock: %v", err)
		}
		return
	}
	defer unlock()
	for s.Live && ctx.Err() == nil {
		if _, err := h.Await(ctx, s.quiet()); err != nil && ctx.Err() == nil {
			s.warn("hand over: %v", err)
			if !pause(ctx, retryAfter) {
				return
			}
		}
	}
}

// lock takes the session's lock and offers what is pending; it says None
// when it offers nothing. The lock held by another process (the session is open
// there too), it waits for it, Live, and else gives up.
func (s *Session) lock(ctx context.Context, h *client.Handoff) (unlock func(), err error) {
	unlock, err = h.Lock(ctx, false)
	switch {
	case err == nil:
		if s.pending(ctx, h) == 0 {
			s.send(Message{None: true})
		}
		return unlock, nil
	case errors.Is(err, client.ErrLocked) && s.Live:
		s.send(Message{None: true})
		return h.Lock(ctx, true)
	default:
		s.send(Message{None: true})
		return nil, err
	}
}

// pending offers, at once, what the inbox holds now; it returns how many
// wake-ups were handed over.
func (s *Session) pending(ctx context.Context, h *client.Handoff) int {
	cctx, cancel := context.WithTimeout(ctx, pendingBound)
	defer cancel()
	c, err := client.Connect(cctx, s.quiet())
	if err != nil {
		s.warn("look for pending wake-ups: %v", err)
		return 0
	}
	defer c.Close()
	n, err := h.Next(ctx, c, 0)
	if err != nil && ctx.Err() == nil {
		s.warn("hand over the pending wake-ups: %v", err)
	}
	return n
}

// offer hands a batch to the plugin and waits for its answer: nil once
// opencode recorded the message.
func (s *Session) offer(ctx context.Context, batch []client.Wakeup) error {
	prompts := make([]string, len(batch))
	for i, w := range batch {
		prompts[i] = strings.TrimRight(w.Prompt, "\n")
	}
	answer := make(chan Message, 1)
	s.mu.Lock()
	s.answers = answer
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.answers = nil
		s.mu.Unlock()
	}()
	if err := s.send(Message{Offer: strings.Join(prompts, "\n\n")}); err != nil {
		return err
	}
	select {
	case m := <-answer:
		if !*m.Taken {
			return fmt.Errorf("the plugin did not hand it to the session: %s", m.Error)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Session) send(m Message) error {
	line, err := json.Marshal(m)
	if err != nil {
		return err
	}
	s.outMu.Lock()
	defer s.outMu.Unlock()
	_, err = s.Out.Write(append(line, '\n'))
	return err
}

// dropped logs a message of the inbox that is no wake-up: never shown to the
// session, it is dropped.
func (s *Session) dropped(d *client.Delivery) {
	s.warn("dropped message %d of the inbox (%v): %.200q", d.Seq, d.Err, d.Raw)
}

func (s *Session) warn(format string, args ...any) {
	fmt.Fprintf(s.Log, "%s session %s: %s\n", time.Now().UTC().Format(time.RFC3339), s.ID, fmt.Sprintf(format, args...))
}

// quiet is s.Config with nats.go's errors dropped: its default handler writes
// to stderr, which nobody reads.
func (s *Session) quiet() client.Config {
	cfg := s.Config
	cfg.Waiting = nil
	cfg.Options = append(slices.Clone(cfg.Options), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	return cfg
}

// LogFile is the log of the sessions of home: each write appends, made (0600)
// if need be. Past LogMaxBytes the log so far becomes LogName.1 (replacing
// the one before), so two generations at most are kept however long the
// sessions run.
func LogFile(home string) io.Writer { return logFile(filepath.Join(home, StateDir, LogName)) }

// LogMaxBytes is how large the log grows before it is rotated.
const LogMaxBytes = 1 << 20

type logFile string

func (l logFile) Write(p []byte) (int, error) {
	if err := os.MkdirAll(filepath.Dir(string(l)), 0o700); err != nil {
		return 0, err
	}
	if st, err := os.Stat(string(l)); err == nil && st.Size()+int64(len(p)) > LogMaxBytes {
		_ = os.Rename(string(l), string(l)+".1") // a helper beside may have just done it
	}
	f, err := os.OpenFile(string(l), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Write(p)
}

// pause waits d, or until ctx ends: false then.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
