package sinks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// testWakeup is a wake-up as the dispatcher fires it, with an origin that a float64
// would round and text that is not ASCII.
func testWakeup() events.Wakeup {
	code := 3
	return events.Wakeup{
		ID:       "0194f1c2-7a3b-7c4d-8e5f-601234567890",
		Status:   "failed",
		ExitCode: &code,
		Prompt:   "Build failed (exit 3).\nLast line: ünïcødé ✓\n",
		Tail:     []string{"compiling", "error: boom"},
		Kind:     "build",
		Command:  "make test",
		Target:   "agent-7",
		Origin:   json.RawMessage(`{"chat":"c-42","user_id":9007199254740993,"nested":{"a":[1,"ü"]},"thread-id":"t 1"}`),
	}
}

// request is what a test webhook server received.
type request struct {
	method string
	header http.Header
	body   []byte
}

// receiver is a webhook server that records every request and answers with reply.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []request
}

func newReceiver(t *testing.T, reply http.HandlerFunc) *receiver {
	t.Helper()
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			t.Errorf("read request body: %v", err)
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, request{method: req.Method, header: req.Header.Clone(), body: body})
		r.mu.Unlock()
		reply(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.reqs...)
}

func webhookSink(url string) engine.Sink { return engine.Sink{Type: engine.SinkWebhook, URL: url} }

func push(t *testing.T, ctx context.Context, sink engine.Sink, w events.Wakeup, attempt int) engine.SinkOutcome {
	t.Helper()
	return New(testSecret).Push(ctx, sink, w, attempt)
}

func TestWebhookPostsTheSignedWakeupWithItsIdempotencyKey(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "queued")
	})
	wake := testWakeup()

	o := push(t, context.Background(), webhookSink(rcv.URL+"/hook"), wake, 2)
	if !o.OK || o.Permanent || o.HTTPStatus != http.StatusAccepted || o.Error != "" {
		t.Fatalf("outcome = %+v, want OK with status 202 and no error", o)
	}
	if o.Output != "queued" {
		t.Errorf("output = %q, want the response body", o.Output)
	}
	if o.ExitCode != nil {
		t.Errorf("a webhook outcome has exit code %d", *o.ExitCode)
	}
	reqs := rcv.requests()
	if len(reqs) != 1 {
		t.Fatalf("server got %d requests, want 1", len(reqs))
	}
	req := reqs[0]
	if req.method != http.MethodPost {
		t.Errorf("method = %s, want POST", req.method)
	}
	if got, want := req.header.Get("Content-Type"), "application/json"; got != want {
		t.Errorf("Content-Type = %q, want %q", got, want)
	}
	if got := req.header.Get(IdempotencyHeader); got != wake.ID {
		t.Errorf("%s = %q, want the task id %q", IdempotencyHeader, got, wake.ID)
	}
	if got := req.header.Get(AttemptHeader); got != "2" {
		t.Errorf("%s = %q, want 2", AttemptHeader, got)
	}

	// The body is the wake-up JSON, the same the inbox holds.
	want, err := json.Marshal(wake)
	if err != nil {
		t.Fatal(err)
	}
	if string(req.body) != string(want) {
		t.Errorf("body =\n%s\nwant\n%s", req.body, want)
	}
	var got events.Wakeup
	if err := json.Unmarshal(req.body, &got); err != nil {
		t.Fatalf("body is not a wake-up: %v", err)
	}
	if got.ID != wake.ID || got.Prompt != wake.Prompt || got.ExitCode == nil || *got.ExitCode != 3 {
		t.Errorf("body decodes to %+v, want %+v", got, wake)
	}
	if !strings.Contains(string(got.Origin), "9007199254740993") {
		t.Errorf("origin in the body = %s, want the 64-bit id as written", got.Origin)
	}

	// The signature is the receiver's proof: it verifies under the secret only.
	sig := req.header.Get(SignatureHeader)
	if !strings.HasPrefix(sig, "sha256=") || len(sig) != len("sha256=")+64 {
		t.Fatalf("%s = %q, want sha256= and 64 hex digits", SignatureHeader, sig)
	}
	if !Verify(testSecret, req.body, sig) {
		t.Errorf("signature %q does not verify with the secret", sig)
	}
	if Verify([]byte("another-secret-of-32-bytes------"), req.body, sig) {
		t.Errorf("signature verifies with another secret")
	}
	tampered := append([]byte(nil), req.body...)
	tampered[len(tampered)-2] ^= 1
	if Verify(testSecret, tampered, sig) {
		t.Errorf("signature verifies for another body")
	}
}

func TestWebhookStatuses(t *testing.T) {
	t.Parallel()
	httpDate := time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		ok         bool
		permanent  bool
		// The Retry-After the outcome must carry: within [minWait, maxWait].
		minWait, maxWait time.Duration
	}{
		{name: "200", status: 200, ok: true},
		{name: "204", status: 204, ok: true},
		{name: "500", status: 500},
		{name: "503 retry-after seconds", status: 503, retryAfter: "7", minWait: 7 * time.Second, maxWait: 7 * time.Second},
		{name: "408", status: 408},
		{name: "429 retry-after date", status: 429, retryAfter: httpDate, minWait: 20 * time.Second, maxWait: 30 * time.Second},
		{name: "429 retry-after garbage", status: 429, retryAfter: "soon"},
		{name: "502", status: 502},
		{name: "400", status: 400, permanent: true},
		{name: "401", status: 401, permanent: true},
		{name: "404", status: 404, permanent: true},
		{name: "410 with retry-after", status: 410, retryAfter: "5", permanent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, "answer "+tc.name)
			})
			o := push(t, context.Background(), webhookSink(rcv.URL), testWakeup(), 1)
			if o.OK != tc.ok || o.Permanent != tc.permanent || o.HTTPStatus != tc.status {
				t.Fatalf("outcome = %+v, want ok %v, permanent %v, status %d", o, tc.ok, tc.permanent, tc.status)
			}
			if !tc.ok && o.Error == "" {
				t.Errorf("a failed attempt has no error")
			}
			if !tc.ok && !strings.Contains(o.Output, "answer "+tc.name) {
				t.Errorf("output = %q, want the response body for the history", o.Output)
			}
			if !tc.permanent && (o.RetryAfter < tc.minWait || o.RetryAfter > tc.maxWait) {
				t.Errorf("RetryAfter = %v, want %v to %v", o.RetryAfter, tc.minWait, tc.maxWait)
			}
			if n := len(rcv.requests()); n != 1 {
				t.Errorf("server got %d requests, want 1", n)
			}
		})
	}
}

func TestWebhookRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	elsewhere := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		rcv := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+"/stolen", status)
		})
		o := push(t, context.Background(), webhookSink(rcv.URL), testWakeup(), 1)
		if o.OK || !o.Permanent || o.HTTPStatus != status || !strings.Contains(o.Error, "redirect") {
			t.Errorf("%d: outcome = %+v, want a permanent failure that names the redirect", status, o)
		}
	}
	if n := len(elsewhere.requests()); n != 0 {
		t.Fatalf("the redirect target got %d requests: a wake-up went where the spec did not say", n)
	}
}

func TestWebhookRefusedConnectionIsRetried(t *testing.T) {
	t.Parallel()
	url := fmt.Sprintf("http://127.0.0.1:%d/hook", testkit.FreePort(t)) // nothing listens there

	o := push(t, context.Background(), webhookSink(url), testWakeup(), 1)
	if o.OK || o.Permanent || o.HTTPStatus != 0 || o.Error == "" {
		t.Fatalf("outcome = %+v, want a retryable failure with an error and no status", o)
	}
}

func TestWebhookTimeoutEndsAHangingRequest(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	rcv := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	// Registered after the server's Close: runs first, so Close does not wait on
	// a handler that still hangs.
	t.Cleanup(func() { close(release) })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan engine.SinkOutcome, 1)
	go func() { done <- New(testSecret).Push(ctx, webhookSink(rcv.URL), testWakeup(), 1) }()
	var o engine.SinkOutcome
	select {
	case o = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the attempt did not end when its context did")
	}
	if o.OK || o.Permanent || o.Error == "" {
		t.Fatalf("outcome = %+v, want a retryable failure", o)
	}
	if ctx.Err() == nil {
		t.Fatalf("the attempt ended before its deadline: %+v", o)
	}
}

func TestWebhookOutputKeepsTheTailOfALongAnswer(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3*maxOutput) + "THE END"
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, long)
	})
	o := push(t, context.Background(), webhookSink(rcv.URL), testWakeup(), 1)
	if !strings.HasSuffix(o.Output, "THE END") {
		t.Fatalf("output does not end with the answer's end: ...%q", o.Output[max(0, len(o.Output)-40):])
	}
	if len(o.Output) > maxOutput+100 {
		t.Fatalf("output is %d bytes, want at most about %d", len(o.Output), maxOutput)
	}
}

func TestSignIsHMACSHA256OfTheBody(t *testing.T) {
	t.Parallel()
	// RFC 4231 test case 2: HMAC-SHA-256 with key "Jefe".
	got := Sign([]byte("Jefe"), []byte("what do ya want for nothing?"))
	want := "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
	if got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if !Verify([]byte("Jefe"), []byte("what do ya want for nothing?"), want) {
		t.Fatal("Verify rejects its own signature")
	}
	if Verify([]byte("Jefe"), []byte("what do ya want for nothing?"), strings.TrimPrefix(want, "sha256=")) {
		t.Fatal("Verify accepts a signature without its sha256= prefix")
	}
}

// TestDenyPrivateRefusesLoopbackDestinations: under the rule, a webhook to a real
// server on 127.0.0.1 is refused for good and the server gets nothing, whether the
// URL names the address, a name that resolves to it, or its IPv6-mapped form; the
// same server is reached without the rule.
func TestDenyPrivateRefusesLoopbackDestinations(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	_, port, err := net.SplitHostPort(rcv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if o := push(t, context.Background(), webhookSink(rcv.URL), testWakeup(), 1); !o.OK {
		t.Fatalf("without the rule: outcome = %+v, want delivered", o)
	}
	deny := New(testSecret).DenyPrivate()
	for _, host := range []string{"127.0.0.1", "localhost", "[::ffff:127.0.0.1]"} {
		url := "http://" + host + ":" + port + "/hook"
		o := deny.Push(context.Background(), webhookSink(url), testWakeup(), 1)
		if o.OK || !o.Permanent || o.HTTPStatus != 0 || !strings.Contains(o.Error, "loopback") ||
			!strings.Contains(o.Error, "--webhook-deny-private") {
			t.Errorf("%s: outcome = %+v, want a permanent failure that names the loopback range and the option", url, o)
		}
	}
	if n := len(rcv.requests()); n != 1 {
		t.Fatalf("the server got %d requests, want the 1 made without the rule", n)
	}
}

// TestDenyDestinationsFollowsNoRedirect: a destination that is allowed and answers
// with a redirect to a denied one sends nothing there.
func TestDenyDestinationsFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	denied := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the denied destination got a request")
	}))
	denied.Listener.Close()
	denied.Listener = l
	denied.Start()
	t.Cleanup(denied.Close)
	rcv := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, denied.URL+"/metadata", http.StatusTemporaryRedirect)
	})
	runner := New(testSecret).denyDestinations(func(a netip.Addr) string {
		if a == netip.MustParseAddr("127.0.0.2") {
			return "test"
		}
		return ""
	})
	o := runner.Push(context.Background(), webhookSink(rcv.URL), testWakeup(), 1)
	if o.OK || !o.Permanent || o.HTTPStatus != http.StatusTemporaryRedirect {
		t.Fatalf("outcome = %+v, want a permanent failure on the redirect", o)
	}
	o = runner.Push(context.Background(), webhookSink(denied.URL), testWakeup(), 1)
	if o.OK || !o.Permanent || !strings.Contains(o.Error, "127.0.0.2 is a test address") {
		t.Fatalf("direct to the denied address: outcome = %+v, want it refused", o)
	}
}

// bearerFile writes token into a file of its own and returns the bearer that
// reads it, sent only under prefix.
func bearerFile(t *testing.T, name, token, prefix string) engine.WebhookBearer {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".token")
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := engine.ParseURLPrefix(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return engine.WebhookBearer{Name: name, File: file, Prefixes: []engine.URLPrefix{p}}
}

// TestWebhookSendsTheRenderedBodyAndTheBearerToken: what an OpenClaw gateway's
// /hooks/wake gets: the body template filled in as JSON, signed, and the token
// read from the server's file (white space trimmed) in the Authorization header.
func TestWebhookSendsTheRenderedBodyAndTheBearerToken(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	b := bearerFile(t, "openclaw", "  s3cret-token\n", rcv.URL+"/hooks")
	sink := engine.Sink{Type: engine.SinkWebhook, URL: rcv.URL + "/hooks/wake", Bearer: "openclaw",
		Body: json.RawMessage(`{"text":"{{prompt}}","mode":"now"}`)}
	wake := testWakeup()
	wake.Prompt = "He said \"done\"\n\x00\x1b end"
	for _, runner := range []*Runner{
		New(testSecret).WithBearers(engine.Bearers{Flags: engine.WebhookBearers{"openclaw": b}}),
		// The rule of --webhook-deny-private keeps the runner's bearers.
		New(testSecret).WithBearers(engine.Bearers{Flags: engine.WebhookBearers{"openclaw": b}}).denyDestinations(func(netip.Addr) string { return "" }),
	} {
		if o := runner.Push(context.Background(), sink, wake, 1); !o.OK || o.HTTPStatus != http.StatusOK {
			t.Fatalf("outcome = %+v, want delivered", o)
		}
	}
	reqs := rcv.requests()
	if len(reqs) != 2 {
		t.Fatalf("server got %d requests, want 2", len(reqs))
	}
	req := reqs[1]
	var got struct{ Text, Mode string }
	if err := json.Unmarshal(req.body, &got); err != nil || got.Text != wake.Prompt || got.Mode != "now" {
		t.Fatalf("body %s decodes to %+v (%v), want the prompt and mode now", req.body, got, err)
	}
	if ct := req.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if !Verify(testSecret, req.body, req.header.Get(SignatureHeader)) || req.header.Get(IdempotencyHeader) != wake.ID {
		t.Errorf("headers %v: want the rendered body signed and the task id as Idempotency-Key", req.header)
	}
}

// TestBearerTokenIsReadAtEachAttempt: a token file rotated between two attempts
// sends the new token; one that is gone or empty fails the attempt, to be retried,
// with a reason that names the bearer and holds neither the token nor the path.
func TestBearerTokenIsReadAtEachAttempt(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	b := bearerFile(t, "hook", "first-token", rcv.URL+"/")
	runner := New(testSecret).WithBearers(engine.Bearers{Flags: engine.WebhookBearers{"hook": b}})
	sink := engine.Sink{Type: engine.SinkWebhook, URL: rcv.URL + "/wake", Bearer: "hook"}
	if o := runner.Push(context.Background(), sink, testWakeup(), 1); !o.OK {
		t.Fatalf("attempt 1: %+v", o)
	}
	rotated := b.File + ".new"
	if err := os.WriteFile(rotated, []byte("second-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rotated, b.File); err != nil {
		t.Fatal(err)
	}
	if o := runner.Push(context.Background(), sink, testWakeup(), 2); !o.OK {
		t.Fatalf("attempt 2: %+v", o)
	}
	for _, broken := range []struct {
		name, content, reason string
	}{
		{"gone", "", "its token file cannot be read: no such file or directory"},
		{"empty", " \n", "its token is empty"},
		{"header injection", "tok\r\nX-Evil: 1", "its token holds a character other than visible ASCII"},
	} {
		if broken.name == "gone" {
			if err := os.Remove(b.File); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(b.File, []byte(broken.content), 0o600); err != nil {
			t.Fatal(err)
		}
		o := runner.Push(context.Background(), sink, testWakeup(), 3)
		if o.OK || o.Permanent || !strings.Contains(o.Error, `bearer "hook": `+broken.reason) ||
			strings.Contains(o.Error, b.File) || strings.Contains(o.Error, "second-token") || strings.Contains(o.Error, "X-Evil") {
			t.Errorf("%s: outcome = %+v, want a retryable failure: ...%s", broken.name, o, broken.reason)
		}
	}
	reqs := rcv.requests()
	if len(reqs) != 2 || reqs[0].header.Get("Authorization") != "Bearer first-token" || reqs[1].header.Get("Authorization") != "Bearer second-token" {
		t.Fatalf("server got %d requests with %q, %q; want the first token, then the rotated one, and nothing without a token",
			len(reqs), reqs[0].header.Get("Authorization"), reqs[len(reqs)-1].header.Get("Authorization"))
	}
}

// TestBearerTokenGoesNowhereElse: a sink whose bearer the runner does not declare,
// or whose URL is outside the bearer's prefixes (a spec registered before the
// server's flags changed), makes no request at all.
func TestBearerTokenGoesNowhereElse(t *testing.T) {
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	t.Setenv("BGTASK_TEST_HOOK_TOKEN", "env-token")
	p, err := engine.ParseURLPrefix(rcv.URL + "/hooks/")
	if err != nil {
		t.Fatal(err)
	}
	runner := New(testSecret).WithBearers(engine.Bearers{Flags: engine.WebhookBearers{"hook": {Name: "hook", Env: "BGTASK_TEST_HOOK_TOKEN", Prefixes: []engine.URLPrefix{p}}}})
	for _, tc := range []struct{ url, bearer, reason string }{
		{rcv.URL + "/other", "hook", "is not under its URL prefixes"},
		{rcv.URL + "/hooks/../other", "hook", "is not under its URL prefixes"},
		{rcv.URL + "/hooks/x", "nope", "declares no such bearer token"},
	} {
		o := runner.Push(context.Background(), engine.Sink{Type: engine.SinkWebhook, URL: tc.url, Bearer: tc.bearer}, testWakeup(), 1)
		if o.OK || !strings.Contains(o.Error, tc.reason) {
			t.Errorf("%s with %s: outcome = %+v, want ...%s", tc.url, tc.bearer, o, tc.reason)
		}
	}
	if n := len(rcv.requests()); n != 0 {
		t.Fatalf("the server got %d requests", n)
	}
	o := runner.Push(context.Background(), engine.Sink{Type: engine.SinkWebhook, URL: rcv.URL + "/hooks/wake", Bearer: "hook"}, testWakeup(), 1)
	if reqs := rcv.requests(); !o.OK || len(reqs) != 1 || reqs[0].header.Get("Authorization") != "Bearer env-token" {
		t.Fatalf("under the prefix: outcome %+v, requests %d", o, len(reqs))
	}
}

// TestHomeBearerIsFoundAtEachAttempt: a bearer the server's home declares is
// looked up at each attempt, so one declared after the server started is sent,
// and one taken back, or whose declaration cannot be read, fails the attempt (to
// be retried) without a request, with a reason that does not hold the token. A
// flag's bearer of the same name wins.
func TestHomeBearerIsFoundAtEachAttempt(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	p, err := engine.ParseURLPrefix(rcv.URL + "/hooks/agent")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		declared *engine.WebhookBearer
		broken   error
	)
	home := func(name string) (engine.WebhookBearer, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if broken != nil || declared == nil || name != declared.Name {
			return engine.WebhookBearer{}, false, broken
		}
		return *declared, true, nil
	}
	set := func(b *engine.WebhookBearer, err error) {
		mu.Lock()
		declared, broken = b, err
		mu.Unlock()
	}
	runner := New(testSecret).WithBearers(engine.Bearers{Home: home})
	sink := engine.Sink{Type: engine.SinkWebhook, URL: rcv.URL + "/hooks/agent", Bearer: "openclaw"}
	push := func(attempt int) engine.SinkOutcome {
		return runner.Push(context.Background(), sink, testWakeup(), attempt)
	}

	if o := push(1); o.OK || o.Permanent || !strings.Contains(o.Error, "declares no such bearer token") {
		t.Fatalf("before the home declares it: %+v, want a retryable failure", o)
	}
	set(&engine.WebhookBearer{Name: "openclaw", Held: " home-token\n", Prefixes: []engine.URLPrefix{p}}, nil)
	if o := push(2); !o.OK {
		t.Fatalf("once the home declares it: %+v", o)
	}
	set(nil, errors.New("its declaration in the server's home is damaged"))
	if o := push(3); o.OK || o.Permanent || !strings.Contains(o.Error, `bearer "openclaw": its declaration in the server's home is damaged`) {
		t.Fatalf("a damaged declaration: %+v, want a retryable failure", o)
	}
	flag := bearerFile(t, "openclaw", "flag-token", rcv.URL+"/hooks/")
	set(&engine.WebhookBearer{Name: "openclaw", Held: "home-token", Prefixes: []engine.URLPrefix{p}}, nil)
	if o := New(testSecret).WithBearers(engine.Bearers{Flags: engine.WebhookBearers{"openclaw": flag}, Home: home}).Push(context.Background(), sink, testWakeup(), 4); !o.OK {
		t.Fatalf("with a flag of the same name: %+v", o)
	}
	reqs := rcv.requests()
	if len(reqs) != 2 || reqs[0].header.Get("Authorization") != "Bearer home-token" || reqs[1].header.Get("Authorization") != "Bearer flag-token" {
		t.Fatalf("the receiver got %d requests; want the home's token once, then the flag's", len(reqs))
	}
}
