package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

var errAckLost = errors.New("test: the append's ack was lost")

// lossyStore is the real store, except that the first lose appends that succeed
// are answered with an error, as when an ack is lost on the way back. It notes the
// id of every event it is asked to append.
type lossyStore struct {
	events.Store
	mu   sync.Mutex
	lose int
	ids  []string
}

func (l *lossyStore) Append(ctx context.Context, ev events.Event, expect uint64) (uint64, error) {
	seq, err := l.Store.Append(ctx, ev, expect)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, ev.ID)
	if err == nil && l.lose > 0 {
		l.lose--
		return 0, errAckLost
	}
	return seq, err
}

func TestUpdatePolicies(t *testing.T) {
	t.Parallel()
	tick := func(int) engine.Command { return engine.Tick{PID: 1} }
	exit := func(n int) engine.Command {
		if n > 0 {
			return nil
		}
		now := time.Now()
		return engine.Exit{Run: events.Exited{StartedAt: now, EndedAt: now}}
	}
	for _, tc := range []struct {
		name   string
		policy engine.UpdatePolicy
		// between is what the task's worker appends after the n-th load and before
		// the decision on it is appended; nil for nothing.
		between  func(n int) engine.Command
		lostAcks int
		// what Update returns, how often it decided, how many cancelled events it
		// wrote, and how often it was told of an error it retried.
		wantErr       error
		wantDecisions int
		wantCancelled int
		wantRetrying  int
	}{
		{name: "reload on conflict decides again", policy: engine.ReloadOnConflict{Max: 2},
			between: first(tick), wantDecisions: 2, wantCancelled: 1},
		{name: "reload on conflict returns a decision the reload made impossible", policy: engine.ReloadOnConflict{Max: 2},
			between: exit, wantErr: engine.ErrFinished, wantDecisions: 2},
		{name: "reload on conflict stops at its max", policy: engine.ReloadOnConflict{Max: 2},
			between: tick, wantErr: events.ErrConflict, wantDecisions: 3},
		{name: "reload on conflict with max 0 does not reload", policy: engine.ReloadOnConflict{},
			between: tick, wantErr: events.ErrConflict, wantDecisions: 1},
		{name: "reload on conflict returns another error at once", policy: engine.ReloadOnConflict{Max: 2},
			lostAcks: 1, wantErr: errAckLost, wantDecisions: 1, wantCancelled: 1},
		{name: "reload on error decides again after a conflict", policy: engine.ReloadOnError{Max: 2, Wait: time.Millisecond},
			between: first(tick), wantDecisions: 2, wantCancelled: 1},
		{name: "reload on error decides again after a lost ack", policy: engine.ReloadOnError{Max: 2},
			lostAcks: 1, wantErr: engine.ErrFinished, wantDecisions: 2, wantCancelled: 1, wantRetrying: 1},
		{name: "reload on error stops at its max", policy: engine.ReloadOnError{Max: 1},
			between: tick, wantErr: events.ErrConflict, wantDecisions: 2},
		{name: "retry same event keeps its id through lost acks", policy: engine.RetrySameEvent{Backoff: time.Millisecond},
			lostAcks: 2, wantDecisions: 1, wantCancelled: 1, wantRetrying: 2},
		{name: "retry same event decides again after a conflict", policy: engine.RetrySameEvent{Backoff: time.Millisecond},
			between: first(tick), wantDecisions: 2, wantCancelled: 1},
		{name: "retry same event returns a decision the reload made impossible", policy: engine.RetrySameEvent{},
			between: exit, wantErr: engine.ErrFinished, wantDecisions: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			id := b.register(t, `{"command":"true"}`)
			running := b.advance(t, id, "w1", engine.Spawn{})
			store := &lossyStore{Store: b.store, lose: tc.lostAcks}
			retrying := 0
			policy := tc.policy
			switch p := policy.(type) {
			case engine.ReloadOnError:
				p.Retrying = func(events.Event, error) { retrying++ }
				policy = p
			case engine.RetrySameEvent:
				p.Retrying = func(events.Event, error) { retrying++ }
				policy = p
			}
			decisions := 0
			decide := func(s engine.State) (events.Event, error) {
				if tc.between != nil {
					if c := tc.between(decisions); c != nil {
						b.advance(t, id, "w1", c)
					}
				}
				decisions++
				return engine.Decide(s, engine.Cancel{Reason: "test"}, engine.Meta{Writer: engineWriter, Now: time.Now()})
			}
			reload := func(ctx context.Context) (engine.State, error) { return engine.Load(ctx, b.store, id) }

			s, err := engine.Update(ctx, store, running, reload, decide, policy)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Update = %v, want %v", err, tc.wantErr)
			}
			if decisions != tc.wantDecisions || retrying != tc.wantRetrying {
				t.Errorf("decided %d times and retried %d errors, want %d and %d", decisions, retrying, tc.wantDecisions, tc.wantRetrying)
			}
			history, herr := b.store.History(ctx, id)
			if herr != nil {
				t.Fatal(herr)
			}
			var cancelled []string
			for _, rec := range history {
				if rec.Type == events.TypeCancelled {
					cancelled = append(cancelled, rec.ID)
				}
			}
			if len(cancelled) != tc.wantCancelled {
				t.Fatalf("%d cancelled events in the log, want %d", len(cancelled), tc.wantCancelled)
			}
			if err == nil {
				last := history[len(history)-1]
				if s.Phase != engine.PhaseCancelled || s.Seq != last.Seq {
					t.Errorf("Update returned phase %q at seq %d, want cancelled at the log's last, %d", s.Phase, s.Seq, last.Seq)
				}
			}
			if _, same := tc.policy.(engine.RetrySameEvent); same && tc.lostAcks > 0 {
				for _, sent := range store.ids {
					if sent != cancelled[0] {
						t.Errorf("appended ids %v, want each to be the one in the log, %s", store.ids, cancelled[0])
					}
				}
			}
		})
	}
}

// first is c for the first load only.
func first(c func(int) engine.Command) func(int) engine.Command {
	return func(n int) engine.Command {
		if n > 0 {
			return nil
		}
		return c(n)
	}
}

// An append over a closed connection is not retried, even by RetrySameEvent: no
// retry on it can succeed, and a worker stopping behind it would wait its bound.
func TestUpdateRetriesNoAppendOnAClosedConnection(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, js, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(store, "engine", engine.Base{})
	id, _, err := svc.Register(ctx, []byte(`{"command":"true"}`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.Load(ctx, store, id)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	decide := func(s engine.State) (events.Event, error) {
		return engine.Decide(s, engine.Cancel{}, engine.Meta{Writer: "engine", Now: time.Now()})
	}
	_, err = engine.Update(ctx, store, s, nil, decide, engine.RetrySameEvent{Backoff: 50 * time.Millisecond})
	if !errors.Is(err, events.ErrClosed) || time.Since(start) > 5*time.Second {
		t.Fatalf("Update on a closed connection: %v after %s, want ErrClosed at once", err, time.Since(start))
	}
}
