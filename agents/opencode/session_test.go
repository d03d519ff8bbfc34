package opencode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/client/clienttest"
	"github.com/bgtask/bgtask/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// plugin is the plugin's side of a session's helper, run in the test process.
type plugin struct {
	t     *testing.T
	in    *io.PipeWriter // the helper's stdin
	lines chan Message   // what it writes
	done  chan error     // its end
	log   *syncBuffer
	once  sync.Once
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startHelper runs the helper of session id against home, as the plugin
// starts it; it is stopped, as opencode's exit stops it, at the test's end.
func startHelper(t *testing.T, home, id string, live bool) *plugin {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &plugin{t: t, in: inW, lines: make(chan Message, 16), done: make(chan error, 1), log: &syncBuffer{}}
	s := &Session{Config: client.Config{Home: home}, Home: home, ID: id, Live: live, In: inR, Out: outW, Log: p.log}
	go func() {
		err := s.Run(context.Background())
		outW.Close()
		p.done <- err
	}()
	go func() {
		dec := json.NewDecoder(outR)
		for {
			var m Message
			if dec.Decode(&m) != nil {
				close(p.lines)
				return
			}
			p.lines <- m
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// next is the helper's next line.
func (p *plugin) next(what string) Message {
	p.t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("waiting for %s: the helper ended; its log: %s", what, p.log.String())
		}
		return m
	case <-time.After(45 * time.Second):
		p.t.Fatalf("waiting for %s: nothing came; the helper's log: %s", what, p.log.String())
		return Message{}
	}
}

func (p *plugin) say(m Message) {
	p.t.Helper()
	line, _ := json.Marshal(m)
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		p.t.Fatal(err)
	}
}

func (p *plugin) answer(taken bool) {
	p.t.Helper()
	p.say(Message{Taken: &taken, Error: "refused by the test"})
}

// stop ends the helper's stdin, as opencode's exit does, and waits for its end.
func (p *plugin) stop() {
	p.once.Do(func() {
		p.in.Close()
		select {
		case <-p.done:
		case <-time.After(45 * time.Second):
			p.t.Errorf("the helper did not end with its stdin")
		}
		for range p.lines {
		}
	})
}

func connect(t *testing.T, home string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// fire registers a timer whose wake-up, "WAKE ID", goes to target, and returns
// its id once it fired.
func fire(t *testing.T, home, target string) string {
	t.Helper()
	c := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: "WAKE {{task_id}}", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, reg.ID); err != nil {
		t.Fatal(err)
	}
	return reg.ID
}

// unread is how many of target's wake-ups are not acknowledged.
func unread(t *testing.T, home, target string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := connect(t, home).Unread(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	return u.Count
}

// What waited while the session was closed is offered first, all in one, and
// acknowledged once the plugin says opencode recorded it; `opencode run` (not
// live) is offered nothing more.
func TestWhatIsPendingIsOfferedFirstAndAcknowledgedOnceTaken(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	ids := []string{fire(t, home, "opencode-ses_1"), fire(t, home, "opencode-ses_1")}
	p := startHelper(t, home, "ses_1", false)
	if m, want := p.next("the pending offer"), "WAKE "+ids[0]+"\n\nWAKE "+ids[1]; m.Offer != want {
		t.Fatalf("first line %+v, want the offer %q", m, want)
	}
	if n := unread(t, home, "opencode-ses_1"); n != 2 {
		t.Fatalf("%d unacknowledged before the plugin answered, want 2", n)
	}
	p.answer(true)
	testkit.Eventually(t, 30*time.Second, "the offered wake-ups acknowledged", func() bool {
		return unread(t, home, "opencode-ses_1") == 0
	})
	fire(t, home, "opencode-ses_1")
	p.stop()
	if n := unread(t, home, "opencode-ses_1"); n != 1 {
		t.Fatalf("%d unacknowledged after a wake-up came to a helper of opencode run, want 1: it waits for the next", n)
	}
}

// A live helper with nothing pending says so, then offers each wake-up as it
// comes; one the plugin could not hand over goes back to the inbox and is
// offered again.
func TestALiveHelperOffersWhatComesAndOffersARefusedOneAgain(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	p := startHelper(t, home, "ses_2", true)
	if m := p.next("the first line"); !m.None {
		t.Fatalf("first line %+v, want none pending", m)
	}
	id := fire(t, home, "opencode-ses_2")
	if m := p.next("the offer"); m.Offer != "WAKE "+id {
		t.Fatalf("line %+v, want the offer of %s", m, id)
	}
	p.answer(false)
	if m := p.next("the offer again"); m.Offer != "WAKE "+id {
		t.Fatalf("line %+v, want the refused offer again", m)
	}
	if n := unread(t, home, "opencode-ses_2"); n != 1 {
		t.Fatalf("%d unacknowledged while offered again, want 1", n)
	}
	p.answer(true)
	testkit.Eventually(t, 30*time.Second, "the wake-up acknowledged", func() bool {
		return unread(t, home, "opencode-ses_2") == 0
	})
}

// opencode gone (the helper's stdin ends) before the plugin answered: the
// wake-up goes back to the inbox, and the next helper of the session offers it.
func TestAnOfferNotAnsweredGoesBackToTheInbox(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	p := startHelper(t, home, "ses_3", true)
	p.next("the first line")
	id := fire(t, home, "opencode-ses_3")
	p.next("the offer")
	p.stop()
	if n := unread(t, home, "opencode-ses_3"); n != 1 {
		t.Fatalf("%d unacknowledged after the helper ended unanswered, want 1", n)
	}
	next := startHelper(t, home, "ses_3", false)
	if m := next.next("the pending offer"); m.Offer != "WAKE "+id {
		t.Fatalf("the next helper's first line %+v, want the offer of %s", m, id)
	}
}

// A helper that was waiting (opencode exited) leaves the inbox a request for
// the next wake-up, which takes it when it comes; the next helper of the
// session, in `opencode run -s`, still offers it once the inbox takes it back.
func TestAWakeUpAGoneHelperAskedForIsOfferedByTheNext(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	first := startHelper(t, home, "ses_6", true)
	first.next("the first helper's first line")
	first.stop()
	id := fire(t, home, "opencode-ses_6")
	next := startHelper(t, home, "ses_6", false)
	if m := next.next("the next helper's first line"); m.Offer != "WAKE "+id {
		t.Fatalf("the next helper's first line %+v, want the offer of %s", m, id)
	}
	next.answer(true)
	testkit.Eventually(t, 30*time.Second, "the wake-up acknowledged", func() bool {
		return unread(t, home, "opencode-ses_6") == 0
	})
}

// A helper killed while its offer was out (SIGKILL, with its opencode most
// often) leaves the wake-up handing in the session's ledger: the next helper
// offers it again rather than lose it.
func TestAnOfferLeftHandingIsOfferedAgain(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	id := fire(t, home, "opencode-ses_7")
	if err := os.MkdirAll(filepath.Join(home, StateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	ledger := fmt.Sprintf("handing %d %s\n", time.Now().Unix(), id)
	if err := os.WriteFile(filepath.Join(home, StateDir, "opencode-ses_7.handed"), []byte(ledger), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startHelper(t, home, "ses_7", false)
	if m := p.next("the first line"); m.Offer != "WAKE "+id {
		t.Fatalf("first line %+v, want the offer of %s again", m, id)
	}
}

// One helper of a session waits at a time: another (the session open in a
// second process) offers nothing and waits for the lock, then takes over.
func TestOneHelperOfASessionWaitsAtATime(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	first := startHelper(t, home, "ses_4", true)
	first.next("the first helper's first line")
	second := startHelper(t, home, "ses_4", true)
	if m := second.next("the second helper's first line"); !m.None {
		t.Fatalf("the second helper's first line %+v, want none", m)
	}
	id := fire(t, home, "opencode-ses_4")
	first.next("the first helper's offer")
	first.stop()
	if m := second.next("the second helper's offer"); m.Offer != "WAKE "+id {
		t.Fatalf("the second helper's line %+v, want the offer of %s", m, id)
	}
	second.answer(true)
	testkit.Eventually(t, 30*time.Second, "the wake-up acknowledged", func() bool {
		return unread(t, home, "opencode-ses_4") == 0
	})
	if locks, _ := filepath.Glob(filepath.Join(home, StateDir, "*.handed")); len(locks) != 0 {
		t.Errorf("ledgers left: %v", locks)
	}
}

// The session's states mark its target: busy with a TTL, idle.
func TestStatesMarkTheSessionsTarget(t *testing.T) {
	home := t.TempDir()
	clienttest.Run(t, home)
	p := startHelper(t, home, "ses_5", false)
	p.next("the first line")
	c := connect(t, home)
	state := func() client.TargetState {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := c.Target(ctx, "opencode-ses_5")
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	p.say(Message{State: client.TargetBusy})
	testkit.Eventually(t, 30*time.Second, "the target busy", func() bool { return state().State == client.TargetBusy })
	if st := state(); st.Until == nil || st.Until.Sub(st.Since) != BusyTTL {
		t.Errorf("busy %+v, want it to end by itself after %v", st, BusyTTL)
	}
	p.say(Message{State: client.TargetIdle})
	testkit.Eventually(t, 30*time.Second, "the target idle", func() bool { return state().State == client.TargetIdle })
}

func TestABadSessionIDIsRefused(t *testing.T) {
	s := &Session{ID: "ses 1"}
	if err := s.Run(context.Background()); err == nil {
		t.Fatal("a session id with a space was taken")
	}
}

// The sessions' log keeps two generations at most, however much is written.
func TestTheLogIsRotatedPastItsBound(t *testing.T) {
	home := t.TempDir()
	log := LogFile(home)
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range 3 * LogMaxBytes / len(line) {
		if _, err := log.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	var total int64
	for _, name := range []string{LogName, LogName + ".1"} {
		st, err := os.Stat(filepath.Join(home, StateDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > LogMaxBytes {
			t.Errorf("%s: %d bytes, over the bound of %d", name, st.Size(), LogMaxBytes)
		}
		total += st.Size()
	}
	if total < LogMaxBytes {
		t.Errorf("the two generations hold %d bytes: less than the last %d written", total, LogMaxBytes)
	}
}
