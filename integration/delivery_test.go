package integration

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// fastRetries keeps a push sink's retries quick: 50ms, then about 100ms, 200ms...
var fastRetries = []string{"--retry-base", "50ms"}

// hookRequest is one POST a test webhook received.
type hookRequest struct {
	id, attempt, signature string
	body                   []byte
	status                 int // 0 while the handler has not answered
}

// hook is a webhook receiver. reply gives the status of the nth request (from 1);
// it may block.
type hook struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []hookRequest
}

func newHook(t *testing.T, reply func(n int, r *http.Request) int) *hook {
	t.Helper()
	h := &hook{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		h.mu.Lock()
		h.reqs = append(h.reqs, hookRequest{
			id: r.Header.Get("Idempotency-Key"), attempt: r.Header.Get("X-Bgtask-Attempt"),
			signature: r.Header.Get("X-Bgtask-Signature"), body: body,
		})
		n := len(h.reqs)
		h.mu.Unlock()
		status := http.StatusOK
		if reply != nil {
			status = reply(n, r)
		}
		h.mu.Lock()
		h.reqs[n-1].status = status
		h.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hook) requests() []hookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reqs)
}

// of returns the requests for task id.
func (h *hook) of(id string) []hookRequest {
	var out []hookRequest
	for _, r := range h.requests() {
		if r.id == id {
			out = append(out, r)
		}
	}
	return out
}

// accepted returns the task ids of the requests answered 2xx, in the order received.
func (h *hook) accepted() []string {
	var ids []string
	for _, r := range h.requests() {
		if r.status >= 200 && r.status < 300 {
			ids = append(ids, r.id)
		}
	}
	return ids
}

// waitAccepted waits until the hook has accepted a request for id.
func (h *hook) waitAccepted(t *testing.T, id string) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "the webhook accepting "+id, func() bool { return slices.Contains(h.accepted(), id) })
}

// taskLog reads task histories straight from the event stream: cheap enough to poll,
// where a `bgtask history` process per poll is not.
type taskLog struct{ store *events.JetStreamStore }

// openLog connects to the server running on home; after a restart, open another.
func openLog(t *testing.T, home string) *taskLog {
	t.Helper()
	_, js := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := events.ConnectStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return &taskLog{store: store}
}

func (l *taskLog) count(t *testing.T, id string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := l.store.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[string(r.Type)]++
	}
	return n
}

// waitUntil polls task id's event counts until cond holds.
func (l *taskLog) waitUntil(t *testing.T, id, what string, cond func(n map[string]int) bool) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "task "+id+": "+what, func() bool { return cond(l.count(t, id)) })
}

// waitSinksDone waits until each push sink of task id delivered or gave up.
func (l *taskLog) waitSinksDone(t *testing.T, id string, sinks int) {
	t.Helper()
	l.waitUntil(t, id, "push sinks done", func(n map[string]int) bool {
		return okResults(t, l, id)+n["delivery-failed"] >= sinks
	})
}

// okResults counts the successful delivery-results of task id.
func okResults(t *testing.T, l *taskLog, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := l.store.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		if r.Type == events.TypeDeliveryResult {
			var p events.DeliveryResult
			if json.Unmarshal(r.Payload, &p) == nil && p.OK {
				n++
			}
		}
	}
	return n
}

// payloads decodes the payloads of the events of type typ in a history.
func payloads[T any](t *testing.T, h []historyEvent, typ string) []T {
	t.Helper()
	var out []T
	for _, e := range h {
		if e.Type == typ {
			out = append(out, decodeJSON[T](t, string(e.Raw)))
		}
	}
	return out
}

// firedSeq is the stream sequence of task id's fired event: the order wake-ups fired.
func firedSeq(t *testing.T, home, id string) uint64 {
	t.Helper()
	for _, e := range history(t, home, id) {
		if e.Type == "fired" {
			return e.Seq
		}
	}
	t.Fatalf("task %s has not fired", id)
	return 0
}

// webhookSecret is the key the server signs webhooks with, as a receiver reads it.
func webhookSecret(t *testing.T, home string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(home, "webhook-secret"))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(filepath.Join(home, "webhook-secret")); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("webhook-secret: %v, mode %v: want 0600", err, info.Mode())
	}
	return bytes.TrimSpace(data)
}

// signedBy reports whether a request's signature is body's HMAC-SHA256 under secret,
// computed here as a receiver in another language would.
func signedBy(r hookRequest, secret []byte) bool {
	mac := hmac.New(sha256.New, secret)
	mac.Write(r.body)
	return hmac.Equal([]byte(r.signature), []byte("sha256="+hex.EncodeToString(mac.Sum(nil))))
}

// jsonArg is a JSON array for --exec-json.
func jsonArg(t *testing.T, argv ...string) string {
	t.Helper()
	data, err := json.Marshal(argv)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// standIn is an exec sink's program: `sh standIn DIR NAME ARGS...` records its
// arguments (each ended by a NUL), its environment (as /proc gives it) and its stdin
// as DIR/NAME.args, .environ and .stdin, then exits with the code in DIR/NAME.exit
// if there is one (the file is removed: the next run exits 0).
const standIn = `dir=$1 name=$2
shift 2
printf '%s\0' "$@" > "$dir/$name.args"
cat /proc/$$/environ > "$dir/$name.environ"
cat > "$dir/$name.stdin.tmp" && mv "$dir/$name.stdin.tmp" "$dir/$name.stdin"
echo "$name was called" >&2
if [ -e "$dir/$name.exit" ]; then code=$(cat "$dir/$name.exit"); rm "$dir/$name.exit"; exit "$code"; fi
`

// writeStandIn writes the stand-in script and returns its path.
func writeStandIn(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stand-in.sh")
	if err := os.WriteFile(path, []byte(standIn), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// recorded reads what the stand-in recorded: its arguments, environment and stdin.
func recorded(t *testing.T, dir, name string) (args []string, env map[string]string, stdin string) {
	t.Helper()
	read := func(ext string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name+ext))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	args = strings.Split(strings.TrimSuffix(string(read(".args")), "\x00"), "\x00")
	env = map[string]string{}
	for _, kv := range strings.Split(string(read(".environ")), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return args, env, string(read(".stdin"))
}

// inboxLines reads a target's inbox once and returns its wake-ups as raw JSON.
func inboxLines(t *testing.T, home, target string) []string {
	t.Helper()
	out := strings.TrimSpace(ok(t, home, "inbox", "--target", target, "--json"))
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// sameJSON reports whether two JSON texts hold the same value, numbers as written.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	decode := func(data []byte) any {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, data)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// rawWakeup decodes a wake-up keeping its origin as written.
type rawWakeup struct {
	ID     string          `json:"id"`
	Status string          `json:"status"`
	Prompt string          `json:"prompt"`
	Target string          `json:"target"`
	Origin json.RawMessage `json:"origin"`
}

// A webhook that fails three times with 500 and then accepts gets the wake-up
// four times, signed and with the task id as its Idempotency-Key, and accepts it
// once; every attempt and result is in the history, and no delivery-failed.
func TestWebhookRetriedUntilAcceptedOnce(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, func(n int, _ *http.Request) int {
		if n <= 3 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})

	id := add(t, home, "--target", "hook-retry", "--webhook", hk.URL+"/wake", "--", "echo built")
	waitFor(t, home, id)
	log.waitSinksDone(t, id, 1)

	reqs := hk.requests()
	if len(reqs) != 4 {
		t.Fatalf("webhook got %d requests, want 4 (3 failures, 1 success)", len(reqs))
	}
	if got := hk.accepted(); !slices.Equal(got, []string{id}) {
		t.Fatalf("accepted deliveries = %v, want exactly one of %s", got, id)
	}
	secret := webhookSecret(t, home)
	inbox := inboxLines(t, home, "hook-retry")
	if len(inbox) != 1 {
		t.Fatalf("inbox has %d wake-ups, want 1", len(inbox))
	}
	for i, r := range reqs {
		if r.id != id {
			t.Errorf("request %d: Idempotency-Key %q, want the task id %s", i+1, r.id, id)
		}
		if want := fmt.Sprint(i + 1); r.attempt != want {
			t.Errorf("request %d: X-Bgtask-Attempt %q, want %s", i+1, r.attempt, want)
		}
		if !signedBy(r, secret) {
			t.Errorf("request %d: signature %q does not verify with HOME/webhook-secret", i+1, r.signature)
		}
		if signedBy(r, []byte("not-the-secret-not-the-secret-00")) {
			t.Errorf("request %d: signature verifies with another secret", i+1)
		}
		// The body is the wake-up, the same as the inbox's copy.
		if !sameJSON(t, r.body, []byte(inbox[0])) {
			t.Errorf("request %d: body\n%s\nis not the inbox's wake-up\n%s", i+1, r.body, inbox[0])
		}
	}

	h := history(t, home, id)
	n := countTypes(h)
	if n["delivery-attempt"] != 4 || n["delivery-result"] != 4 || n["delivery-failed"] != 0 {
		t.Fatalf("history: %v, want 4 delivery-attempt, 4 delivery-result, no delivery-failed", n)
	}
	results := payloads[events.DeliveryResult](t, h, "delivery-result")
	for i, r := range results {
		last := i == len(results)-1
		if r.Attempt != i+1 || r.OK != last {
			t.Errorf("result %d: attempt %d ok %v", i+1, r.Attempt, r.OK)
		}
		if want := map[bool]int{false: 500, true: 200}[last]; r.HTTPStatus != want {
			t.Errorf("result %d: http_status %d, want %d", i+1, r.HTTPStatus, want)
		}
		if (r.RetryAt != nil) == last {
			t.Errorf("result %d: retry_at %v: want one after each failure only", i+1, r.RetryAt)
		}
	}
	// No event of the history carries the secret.
	for _, e := range h {
		if bytes.Contains(e.Raw, secret) {
			t.Fatalf("the webhook secret is in the %s event", e.Type)
		}
	}
	auditClean(t, home)
}

// A 404 is not retried: one attempt, then delivery-failed; the inbox copy remains.
func TestWebhook404IsNotRetried(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, func(int, *http.Request) int { return http.StatusNotFound })

	id := add(t, home, "--target", "hook-404", "--webhook", hk.URL+"/gone", "--", "true")
	waitFor(t, home, id)
	log.waitUntil(t, id, "a delivery-failed", func(n map[string]int) bool { return n["delivery-failed"] == 1 })

	h := history(t, home, id)
	if n := countTypes(h); n["delivery-attempt"] != 1 || n["delivery-result"] != 1 || n["delivery-failed"] != 1 {
		t.Fatalf("history: %v, want one attempt, one result, one delivery-failed", n)
	}
	if r := payloads[events.DeliveryResult](t, h, "delivery-result")[0]; r.OK || r.HTTPStatus != 404 || r.RetryAt != nil {
		t.Fatalf("result: %+v, want 404 without a retry", r)
	}
	if f := payloads[events.DeliveryFailed](t, h, "delivery-failed")[0]; f.Attempts != 1 || !strings.Contains(f.Reason, "404") {
		t.Fatalf("delivery-failed: %+v, want 1 attempt and the 404 as reason", f)
	}
	if n := len(hk.requests()); n != 1 {
		t.Fatalf("webhook got %d requests, want 1", n)
	}
	inbox := inboxLines(t, home, "hook-404")
	if len(inbox) != 1 || decodeJSON[rawWakeup](t, inbox[0]).ID != id {
		t.Fatalf("inbox = %q, want the wake-up of %s", inbox, id)
	}
	auditClean(t, home)
}

// holdBarrier registers an immediate wake-up for target and waits until the hook
// accepted it. The pusher considered every wake-up that fired before it when it
// pushed it, so a queued one not pushed by then was held, not just slow.
func holdBarrier(t *testing.T, home, target string, hk *hook) string {
	t.Helper()
	id := add(t, home, "--target", target, "--policy", "immediate", "--webhook", hk.URL, "--", "true")
	waitFor(t, home, id)
	hk.waitAccepted(t, id)
	return id
}

// assertHeld checks that no push of the tasks was attempted.
func assertHeld(t *testing.T, log *taskLog, hk *hook, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if n := log.count(t, id); n["delivery-attempt"] != 0 {
			t.Fatalf("task %s was pushed while held: %v", id, n)
		}
		if got := hk.of(id); len(got) != 0 {
			t.Fatalf("the webhook got %d requests for held task %s", len(got), id)
		}
	}
}

// byFiring sorts task ids in the order they fired.
func byFiring(t *testing.T, home string, ids []string) []string {
	t.Helper()
	seq := map[string]uint64{}
	for _, id := range ids {
		seq[id] = firedSeq(t, home, id)
	}
	sorted := slices.Clone(ids)
	slices.SortFunc(sorted, func(a, b string) int { return cmp.Compare(seq[a], seq[b]) })
	return sorted
}

// Policy queue holds wake-ups while the target is busy, an immediate one goes
// out anyway, and when the target is idle the held ones are pushed once each, in
// the order they fired.
func TestQueueHoldsWhileBusyAndPushesInFiringOrder(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, nil)
	const target = "agent-q"

	ok(t, home, "target", "busy", target)
	var held []string
	for i := range 3 {
		held = append(held, add(t, home, "--target", target, "--webhook", hk.URL, "--", fmt.Sprintf("echo task %d", i)))
	}
	for _, id := range held {
		if w := waitFor(t, home, id); w.Status != "succeeded" {
			t.Fatalf("task %s: %+v", id, w)
		}
	}
	immediate := holdBarrier(t, home, target, hk)
	assertHeld(t, log, hk, held...)
	if n := log.count(t, immediate); n["delivery-attempt"] != 1 {
		t.Fatalf("the immediate wake-up: %v, want one attempt while the target is busy", n)
	}
	// The inbox copies are written at fire time whatever the target's state.
	if got := inboxLines(t, home, target); len(got) != 4 {
		t.Fatalf("inbox has %d wake-ups while the target is busy, want 4", len(got))
	}
	type row struct {
		Name string `json:"name"`
		Busy bool   `json:"busy"`
	}
	if rows := decodeJSON[[]row](t, ok(t, home, "target", "list", "--json")); !slices.Contains(rows, row{target, true}) {
		t.Fatalf("target list = %+v, want %s busy", rows, target)
	}

	ok(t, home, "target", "idle", target)
	for _, id := range held {
		log.waitSinksDone(t, id, 1)
	}
	got := hk.accepted()
	if want := append([]string{immediate}, byFiring(t, home, held)...); !slices.Equal(got, want) {
		t.Fatalf("pushed in the order %v, want %v (immediate, then the held ones as they fired)", got, want)
	}
	if n := len(hk.requests()); n != 4 {
		t.Fatalf("the webhook got %d requests, want 4", n)
	}
	pushedOnce(t, home, held...)
	auditClean(t, home)
}

// Wake-ups held for a busy target survive a SIGKILL of the server: after the
// restart they are still held, and when the target is idle each is pushed once,
// in the order they fired.
func TestHeldWakeupsSurviveAServerKill(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	srv := startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, nil)
	const target = "agent-r"

	ok(t, home, "target", "busy", target)
	var held []string
	for i := range 3 {
		held = append(held, add(t, home, "--target", target, "--webhook", hk.URL, "--", fmt.Sprintf("echo task %d", i)))
	}
	for _, id := range held {
		waitFor(t, home, id)
	}
	holdBarrier(t, home, target, hk)
	assertHeld(t, log, hk, held...)

	srv.stop(syscall.SIGKILL)
	startServer(t, home, fastRetries...)
	log = openLog(t, home)
	holdBarrier(t, home, target, hk) // the restarted server read the target busy
	assertHeld(t, log, hk, held...)

	ok(t, home, "target", "idle", target)
	for _, id := range held {
		log.waitSinksDone(t, id, 1)
	}
	var pushed []string
	for _, id := range hk.accepted() {
		if slices.Contains(held, id) {
			pushed = append(pushed, id)
		}
	}
	if want := byFiring(t, home, held); !slices.Equal(pushed, want) {
		t.Fatalf("held wake-ups pushed as %v, want each once in firing order %v", pushed, want)
	}
	pushedOnce(t, home, held...)
	auditClean(t, home)
}

// A push in flight when the server dies is made again after the restart, with the
// same Idempotency-Key, so the receiver can drop the repeat; the dead attempt has
// no result. Both are signed with the key of --webhook-secret-file.
func TestAPushInFlightWhenTheServerDiesIsMadeAgainWithTheSameKey(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	secret := []byte("a-key-the-operator-chose-1234567")
	secretFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(secretFile, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--webhook-secret-file", secretFile}, fastRetries...)
	srv := startServer(t, home, args...)
	hk := newHook(t, func(n int, r *http.Request) int {
		if n == 1 {
			<-r.Context().Done() // hangs until the server that sent it dies
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})

	id := add(t, home, "--target", "agent-f", "--webhook", hk.URL, "--", "true")
	waitFor(t, home, id)
	testkit.Eventually(t, 60*time.Second, "the first push arrived", func() bool { return len(hk.requests()) == 1 })
	srv.stop(syscall.SIGKILL)
	startServer(t, home, args...)
	log := openLog(t, home)
	log.waitSinksDone(t, id, 1)

	reqs := hk.requests()
	if len(reqs) != 2 || reqs[0].id != id || reqs[1].id != id || reqs[1].attempt != "2" {
		t.Fatalf("requests: %+v, want the same task twice, the second as attempt 2", reqs)
	}
	if !bytes.Equal(reqs[0].body, reqs[1].body) {
		t.Fatalf("the repeat has another body:\n%s\n%s", reqs[0].body, reqs[1].body)
	}
	for i, r := range reqs {
		if !signedBy(r, secret) {
			t.Errorf("request %d is not signed with the --webhook-secret-file key", i+1)
		}
	}
	if _, err := os.Stat(filepath.Join(home, "webhook-secret")); err == nil {
		t.Errorf("a webhook-secret was generated in the home though --webhook-secret-file was given")
	}
	h := history(t, home, id)
	if n := countTypes(h); n["delivery-attempt"] != 2 || n["delivery-result"] != 1 || n["delivery-failed"] != 0 {
		t.Fatalf("history: %v, want two attempts and one result", n)
	}
	auditClean(t, home)
}

// A busy state with a TTL ends by itself: a held wake-up is pushed when it ends,
// with no idle call.
func TestBusyWithATTLEndsByItself(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, nil)
	const target = "agent-t"

	// Busy without end until the wake-up is known to be held, then for one more
	// second only.
	ok(t, home, "target", "busy", target)
	id := add(t, home, "--target", target, "--webhook", hk.URL, "--", "true")
	waitFor(t, home, id)
	holdBarrier(t, home, target, hk)
	assertHeld(t, log, hk, id)
	ok(t, home, "target", "busy", target, "--ttl", "1s")
	type row struct {
		Name  string     `json:"name"`
		Until *time.Time `json:"until"`
	}
	var until time.Time
	for _, r := range decodeJSON[[]row](t, ok(t, home, "target", "list", "--json")) {
		if r.Name == target && r.Until != nil {
			until = *r.Until
		}
	}
	if until.IsZero() {
		t.Fatal("target list shows no end of the busy state")
	}

	hk.waitAccepted(t, id)
	h := history(t, home, id)
	attempts := 0
	for _, e := range h {
		if e.Type == "delivery-attempt" {
			attempts++
			if e.Time.Before(until) {
				t.Fatalf("pushed at %s, before the busy state ended at %s", e.Time, until)
			}
		}
	}
	if attempts != 1 {
		t.Fatalf("%d attempts, want 1", attempts)
	}
	auditClean(t, home)
}

// execGate is an exec sink's program that blocks until the test releases it:
// `sh gate DIR`, released by DIR/release-TASK_ID (or by the death of the server that
// ran it, so that a failed test leaves nothing running).
const execGate = `echo "$BGTASK_TASK_ID" >> "$1/started"
while [ ! -e "$1/release-$BGTASK_TASK_ID" ] && kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
echo "$BGTASK_TASK_ID" >> "$1/finished"
`

func lines(path string) []string {
	data, _ := os.ReadFile(path)
	return strings.Fields(string(data))
}

// Policy defer_idle gives the target one wake-up at a time: a second is not
// pushed until the exec sink of the first finished.
func TestDeferIdlePushesOneAtATime(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, nil)
	dir := t.TempDir()
	script := filepath.Join(dir, "gate.sh")
	if err := os.WriteFile(script, []byte(execGate), 0o600); err != nil {
		t.Fatal(err)
	}
	const target = "agent-d"
	sink := jsonArg(t, "sh", script, dir)
	started, finished := filepath.Join(dir, "started"), filepath.Join(dir, "finished")

	first := add(t, home, "--target", target, "--policy", "defer_idle", "--exec-json", sink, "--", "echo first")
	waitFor(t, home, first)
	testkit.Eventually(t, 60*time.Second, "the first exec started", func() bool { return len(lines(started)) == 1 })
	second := add(t, home, "--target", target, "--policy", "defer_idle", "--exec-json", sink, "--", "echo second")
	waitFor(t, home, second)
	holdBarrier(t, home, target, hk)
	assertHeld(t, log, hk, second)
	if got := lines(started); !slices.Equal(got, []string{first}) {
		t.Fatalf("started: %v, want only %s", got, first)
	}

	touch(t, filepath.Join(dir, "release-"+first))
	testkit.Eventually(t, 60*time.Second, "the second exec started", func() bool { return len(lines(started)) == 2 })
	if got := lines(finished); !slices.Equal(got, []string{first}) {
		t.Fatalf("the second exec started when finished = %v, want %s finished", got, first)
	}
	touch(t, filepath.Join(dir, "release-"+second))
	log.waitSinksDone(t, second, 1)
	if got := lines(started); !slices.Equal(got, []string{first, second}) {
		t.Fatalf("started: %v, want %s then %s", got, first, second)
	}
	auditClean(t, home)
}

// What tells defer_idle from queue: an earlier wake-up waiting for a retry of
// its push holds a later defer_idle one, not a later queue one.
func TestDeferIdleWaitsForAnEarlierWakeupsRetryAndQueueDoesNot(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	// The retry after a failed push waits minutes: longer than the test.
	startServer(t, home, "--retry-base", "10m")
	log := openLog(t, home)
	hk := newHook(t, nil)
	failing := jsonArg(t, "sh", "-c", "echo not now; exit 1")

	for _, policy := range []string{"defer_idle", "queue"} {
		target := "agent-" + strings.ReplaceAll(policy, "_", "-")
		first := add(t, home, "--target", target, "--policy", policy, "--exec-json", failing, "--", "true")
		waitFor(t, home, first)
		log.waitUntil(t, first, "the first push failed", func(n map[string]int) bool { return n["delivery-result"] == 1 })

		second := add(t, home, "--target", target, "--policy", policy, "--webhook", hk.URL, "--", "true")
		waitFor(t, home, second)
		holdBarrier(t, home, target, hk)
		switch policy {
		case "defer_idle":
			assertHeld(t, log, hk, second)
		case "queue":
			hk.waitAccepted(t, second)
		}
		if n := log.count(t, first); n["delivery-attempt"] != 1 {
			t.Fatalf("%s: the failed push was retried before its time: %v", policy, n)
		}
	}
	auditClean(t, home)
}

// An exec sink gets the prompt on stdin and the wake-up in its environment; a
// failure is retried, and after max_attempts the sink gives up with
// delivery-failed; a program that cannot start is not retried.
func TestExecSinkSuccessRetryAndGiveUp(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	script, dir := writeStandIn(t), t.TempDir()

	// Exits 1 the first time (the stand-in's .exit file), 0 the second.
	if err := os.WriteFile(filepath.Join(dir, "flaky.exit"), []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	success := add(t, home, "--target", "exec-ok", "--kind", "build", "--origin", `{"chat":"c-1"}`,
		"--exec-json", jsonArg(t, "sh", script, dir, "ok", "{{task_id}}", "{{status}}"), "--", "echo hello; exit 4")
	flaky := add(t, home, "--target", "exec-flaky", "--exec-json", jsonArg(t, "sh", script, dir, "flaky"), "--", "true")
	giveUp := add(t, home, "--target", "exec-give-up", "--spec", writeSpec(t,
		`{"deliver":[{"type":"exec","argv":["sh","-c","echo nope >&2; exit 2"],"max_attempts":3}]}`), "--", "true")
	missing := add(t, home, "--target", "exec-missing", "--spec", writeSpec(t,
		`{"deliver":[{"type":"exec","argv":["/nonexistent/bgtask-stand-in"]}]}`), "--", "true")

	// Success: one attempt, exit 0; stdin and environment as documented.
	w := waitFor(t, home, success)
	log.waitSinksDone(t, success, 1)
	args, env, stdin := recorded(t, dir, "ok")
	if stdin != w.Prompt {
		t.Errorf("stdin = %q, want the prompt %q", stdin, w.Prompt)
	}
	if want := []string{success, "failed"}; !slices.Equal(args, want) {
		t.Errorf("args = %q, want %q", args, want)
	}
	for k, want := range map[string]string{
		"BGTASK_TASK_ID": success, "BGTASK_STATUS": "failed", "BGTASK_EXIT_CODE": "4", "BGTASK_TARGET": "exec-ok",
		"BGTASK_KIND": "build", "BGTASK_ATTEMPT": "1", "BGTASK_ORIGIN": `{"chat":"c-1"}`, "BGTASK_ORIGIN_CHAT": "c-1",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
	h := history(t, home, success)
	if n := countTypes(h); n["delivery-attempt"] != 1 || n["delivery-result"] != 1 {
		t.Fatalf("success: history %v, want one attempt and one result", n)
	}
	if r := payloads[events.DeliveryResult](t, h, "delivery-result")[0]; !r.OK || r.ExitCode == nil || *r.ExitCode != 0 {
		t.Fatalf("success: result %+v, want ok with exit code 0", r)
	}

	// Failure then retry: two attempts, the first with its exit code and output.
	waitFor(t, home, flaky)
	log.waitSinksDone(t, flaky, 1)
	h = history(t, home, flaky)
	if n := countTypes(h); n["delivery-attempt"] != 2 || n["delivery-result"] != 2 || n["delivery-failed"] != 0 {
		t.Fatalf("flaky: history %v, want two attempts, two results", n)
	}
	results := payloads[events.DeliveryResult](t, h, "delivery-result")
	if r := results[0]; r.OK || r.ExitCode == nil || *r.ExitCode != 1 || r.RetryAt == nil || !strings.Contains(r.Output, "flaky was called") {
		t.Fatalf("flaky: first result %+v, want exit 1, its output and a retry", r)
	}
	if r := results[1]; !r.OK || r.Attempt != 2 {
		t.Fatalf("flaky: second result %+v, want attempt 2 ok", r)
	}
	if _, env, _ := recorded(t, dir, "flaky"); env["BGTASK_ATTEMPT"] != "2" {
		t.Fatalf("flaky: BGTASK_ATTEMPT = %q on the second run, want 2", env["BGTASK_ATTEMPT"])
	}

	// max_attempts 3, always failing: three attempts, then delivery-failed.
	waitFor(t, home, giveUp)
	log.waitUntil(t, giveUp, "a delivery-failed", func(n map[string]int) bool { return n["delivery-failed"] == 1 })
	h = history(t, home, giveUp)
	if n := countTypes(h); n["delivery-attempt"] != 3 || n["delivery-result"] != 3 || n["delivery-failed"] != 1 {
		t.Fatalf("give-up: history %v, want 3 attempts, 3 results, 1 delivery-failed", n)
	}
	results = payloads[events.DeliveryResult](t, h, "delivery-result")
	if r := results[2]; r.OK || r.RetryAt != nil || r.ExitCode == nil || *r.ExitCode != 2 || !strings.Contains(r.Output, "nope") {
		t.Fatalf("give-up: last result %+v, want exit 2 with its output and no retry", r)
	}
	if f := payloads[events.DeliveryFailed](t, h, "delivery-failed")[0]; f.Attempts != 3 {
		t.Fatalf("give-up: delivery-failed %+v, want 3 attempts", f)
	}
	if got := inboxLines(t, home, "exec-give-up"); len(got) != 1 {
		t.Fatalf("give-up: inbox has %d wake-ups, want the copy that remains", len(got))
	}

	// A program that cannot start is not retried.
	waitFor(t, home, missing)
	log.waitUntil(t, missing, "a delivery-failed", func(n map[string]int) bool { return n["delivery-failed"] == 1 })
	pushedOnce(t, home, missing)
	auditClean(t, home)
}

// consumerInfo reads the state of a target's durable inbox consumer.
func consumerInfo(t *testing.T, js jetstream.JetStream, target string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, events.InboxStreamName, events.InboxConsumerName(target))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// An inbox reader that dies after it got a wake-up and before it acknowledged it
// does not lose it: the next reader gets it. One that acknowledged is not given it
// again. Two readers die: a program using the consumer contract with its own NATS
// client, and `bgtask inbox` killed by SIGPIPE as it prints.
func TestAnInboxReaderKilledBeforeItsAckGetsTheWakeupAgain(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home)
	_, js := connect(t, home)
	const byClient, byCLI = "inbox-client", "inbox-cli"
	ids := map[string]string{}
	for _, target := range []string{byClient, byCLI} {
		ids[target] = add(t, home, "--target", target, "--", "echo for "+target)
		waitFor(t, home, ids[target])
	}

	// A program of its own: fetch, no ack, connection gone.
	nc, ownJS := connect(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := events.InboxConsumer(ctx, ownJS, byClient)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for msg := range batch.Messages() {
		got = append(got, msg)
	}
	if len(got) != 1 || decodeJSON[rawWakeup](t, string(got[0].Data())).ID != ids[byClient] {
		t.Fatalf("fetched %d messages, want the wake-up of %s", len(got), ids[byClient])
	}
	if msgID := got[0].Headers().Get("Nats-Msg-Id"); msgID != ids[byClient] {
		t.Errorf("Nats-Msg-Id = %q, want the task id", msgID)
	}
	nc.Close()

	// bgtask inbox, its stdout a pipe nobody reads any more: it dies as it prints.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	cmd := exec.Command(bin, "--home", home, "inbox", "--target", byCLI, "--json")
	cmd.Env = childEnv(home)
	cmd.Stdout = w
	err = cmd.Run()
	w.Close()
	if err == nil {
		t.Fatal("bgtask inbox printed into a closed pipe and exited 0")
	}

	for _, target := range []string{byClient, byCLI} {
		if info := consumerInfo(t, js, target); info.NumAckPending != 1 {
			t.Fatalf("%s: %d wake-ups wait for an ack, want the one the dead reader got", target, info.NumAckPending)
		}
	}

	// The next reader gets it, once the dead reader's ack wait is over.
	for _, target := range []string{byClient, byCLI} {
		reader := start(t, home, "inbox", "--follow", "--target", target, "--json")
		testkit.Eventually(t, 90*time.Second, target+": the wake-up at the next reader", func() bool {
			return strings.Contains(reader.out.String(), ids[target])
		})
		testkit.Eventually(t, 30*time.Second, target+": the wake-up acknowledged", func() bool {
			info := consumerInfo(t, js, target)
			return info.NumAckPending == 0 && info.NumPending == 0
		})
		reader.stop(syscall.SIGTERM)
		if out := strings.TrimSpace(reader.out.String()); strings.Count(out, "\n") != 0 {
			t.Fatalf("%s: the reader printed more than the wake-up:\n%s", target, out)
		}
		if again := inboxLines(t, home, target); len(again) != 0 {
			t.Fatalf("%s: read again after the ack: %q", target, again)
		}
	}
	auditClean(t, home)
}

// The origin comes back as it was given (a nested object, integers a float64
// would round, text that is not ASCII) through the inbox, the webhook body, and
// an exec sink's environment and argv.
func TestOriginRoundTripsIntact(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	startServer(t, home, fastRetries...)
	log := openLog(t, home)
	hk := newHook(t, nil)
	script, dir := writeStandIn(t), t.TempDir()
	const origin = `{"chat":{"id":9007199254740993,"thread":"スレッド 🧵"},"big":-9223372036854775808,` +
		`"user":"Zoë <z@example.com> & co","list":[1.5,"x",null,true,{"k":"v"}],"empty":{}}`

	id := add(t, home, "--target", "origin-trip", "--origin", origin, "--prompt", "chat {{origin.chat.id}} {{origin.user}}",
		"--webhook", hk.URL,
		"--exec-json", jsonArg(t, "sh", script, dir, "trip", "{{origin.chat.id}}", "{{origin.big}}", "{{origin.chat.thread}}", "{{origin.chat}}"),
		"--", "true")
	waitFor(t, home, id)
	log.waitSinksDone(t, id, 2)

	inbox := inboxLines(t, home, "origin-trip")
	if len(inbox) != 1 {
		t.Fatalf("inbox has %d wake-ups, want 1", len(inbox))
	}
	fromInbox := decodeJSON[rawWakeup](t, inbox[0])
	if !sameJSON(t, fromInbox.Origin, []byte(origin)) {
		t.Errorf("inbox origin = %s\nwant %s", fromInbox.Origin, origin)
	}
	if want := "chat 9007199254740993 Zoë <z@example.com> & co"; fromInbox.Prompt != want {
		t.Errorf("prompt = %q, want %q", fromInbox.Prompt, want)
	}

	reqs := hk.of(id)
	if len(reqs) != 1 {
		t.Fatalf("webhook got %d requests, want 1", len(reqs))
	}
	fromHook := decodeJSON[rawWakeup](t, string(reqs[0].body))
	if !sameJSON(t, fromHook.Origin, []byte(origin)) {
		t.Errorf("webhook origin = %s\nwant %s", fromHook.Origin, origin)
	}

	args, env, stdin := recorded(t, dir, "trip")
	if stdin != fromInbox.Prompt {
		t.Errorf("exec stdin = %q, want %q", stdin, fromInbox.Prompt)
	}
	if !sameJSON(t, []byte(env["BGTASK_ORIGIN"]), []byte(origin)) {
		t.Errorf("BGTASK_ORIGIN = %s\nwant %s", env["BGTASK_ORIGIN"], origin)
	}
	chat := `{"id":9007199254740993,"thread":"スレッド 🧵"}`
	if !sameJSON(t, []byte(env["BGTASK_ORIGIN_CHAT"]), []byte(chat)) {
		t.Errorf("BGTASK_ORIGIN_CHAT = %s, want %s", env["BGTASK_ORIGIN_CHAT"], chat)
	}
	for k, want := range map[string]string{
		"BGTASK_ORIGIN_BIG":  "-9223372036854775808",
		"BGTASK_ORIGIN_USER": "Zoë <z@example.com> & co",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
	if !sameJSON(t, []byte(env["BGTASK_ORIGIN_LIST"]), []byte(`[1.5,"x",null,true,{"k":"v"}]`)) {
		t.Errorf("BGTASK_ORIGIN_LIST = %s", env["BGTASK_ORIGIN_LIST"])
	}
	if len(args) != 4 || args[0] != "9007199254740993" || args[1] != "-9223372036854775808" || args[2] != "スレッド 🧵" ||
		!sameJSON(t, []byte(args[3]), []byte(chat)) {
		t.Errorf("argv = %q, want the origin's values as written", args)
	}
	auditClean(t, home)
}

// pushedOnce checks that each task's history has one push attempt and its result.
func pushedOnce(t *testing.T, home string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if n := countTypes(history(t, home, id)); n["delivery-attempt"] != 1 || n["delivery-result"] != 1 {
			t.Fatalf("task %s: %v, want one attempt and one result", id, n)
		}
	}
}
