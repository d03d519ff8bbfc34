package sinks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// Headers of a webhook request.
const (
	// SignatureHeader carries "sha256=" and the hex HMAC-SHA256 of the body under
	// the server's webhook secret.
	SignatureHeader = "X-Bgtask-Signature"
	// IdempotencyHeader is the task id: the same for every attempt, so a receiver
	// can drop a repeat.
	IdempotencyHeader = "Idempotency-Key"
	AttemptHeader     = "X-Bgtask-Attempt"
)

// Sign returns the signature header's value for body.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify reports whether signature is body's under secret, in constant time: what
// a receiver does first.
func Verify(secret, body []byte, signature string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(signature))
}

func (r *Runner) webhook(ctx context.Context, sink engine.Sink, w events.Wakeup, attempt int) engine.SinkOutcome {
	var body []byte
	var err error
	if sink.Body != nil {
		body, err = engine.RenderBody(sink.Body, w, sink.OmitEmpty)
	} else {
		body, err = json.Marshal(w)
	}
	if err != nil {
		return engine.SinkOutcome{Permanent: true, Error: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sink.URL, bytes.NewReader(body))
	if err != nil {
		return engine.SinkOutcome{Permanent: true, Error: err.Error()}
	}
	if sink.Bearer != "" {
		token, err := r.bearerToken(sink)
		if err != nil {
			return engine.SinkOutcome{Error: err.Error()} // the operator can fix it before the next attempt
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "bgtask")
	req.Header.Set(IdempotencyHeader, w.ID)
	req.Header.Set(AttemptHeader, strconv.Itoa(attempt))
	req.Header.Set(SignatureHeader, Sign(r.secret, body))
	resp, err := r.client.Do(req)
	if denied := (*deniedError)(nil); errors.As(err, &denied) {
		return engine.SinkOutcome{Permanent: true, Error: denied.Error()}
	}
	if err != nil {
		return engine.SinkOutcome{Error: err.Error()} // refused, reset, timed out: worth another try
	}
	defer resp.Body.Close()
	answer := &tailBuffer{max: maxOutput}
	_, _ = io.Copy(answer, io.LimitReader(resp.Body, 1<<20))
	o := engine.SinkOutcome{HTTPStatus: resp.StatusCode, Output: answer.String()}
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		o.OK = true
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		o.Error = resp.Status
		o.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	case code >= 300 && code < 400:
		o.Permanent, o.Error = true, resp.Status+" (redirects are not followed)"
	default:
		o.Permanent, o.Error = true, resp.Status
	}
	return o
}

// MaxTokenBytes bounds a bearer token.
const MaxTokenBytes = 16 << 10

// bearerToken is the token of the bearer sink names, read now, if it may go to
// the sink's URL. Its errors never hold the token.
func (r *Runner) bearerToken(sink engine.Sink) (string, error) {
	b, ok, err := r.bearers.Find(sink.Bearer)
	if err != nil {
		return "", fmt.Errorf("bearer %q: %v", sink.Bearer, err)
	}
	if !ok {
		return "", fmt.Errorf("bearer %q: this server declares no such bearer token (server --webhook-bearer, or a setup such as 'bgtask setup openclaw')", sink.Bearer)
	}
	if !b.Allows(sink.URL) {
		return "", fmt.Errorf("bearer %q: %s is not under its URL prefixes, so its token is not sent", sink.Bearer, sink.URL)
	}
	return Token(b)
}

// Token reads the token of bearer b: the text of its file, the value of its
// environment variable, or the token its home declaration holds, surrounding
// white space trimmed. A token that is missing, empty, over MaxTokenBytes, or
// holds a character other than visible ASCII is an error that names where it was
// looked for, never what it holds.
// The token and its variable are held (secretenv): no program bgtask starts for
// others gets them.
func Token(b engine.WebhookBearer) (string, error) {
	raw := b.Held
	switch {
	case b.File != "":
		f, err := os.Open(b.File)
		if err != nil {
			return "", fmt.Errorf("bearer %q: its token file cannot be read: %v", b.Name, pathReason(err))
		}
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, MaxTokenBytes+1))
		if err != nil {
			return "", fmt.Errorf("bearer %q: its token file cannot be read: %v", b.Name, pathReason(err))
		}
		raw = string(data)
	case b.Env != "":
		secretenv.HoldName(b.Env)
		v, ok := os.LookupEnv(b.Env)
		if !ok {
			return "", fmt.Errorf("bearer %q: $%s is not set in the server's environment", b.Name, b.Env)
		}
		raw = v
	}
	token := strings.TrimSpace(raw)
	secretenv.Hold(token)
	switch {
	case token == "":
		return "", fmt.Errorf("bearer %q: its token is empty", b.Name)
	case len(token) > MaxTokenBytes:
		return "", fmt.Errorf("bearer %q: its token is over %d bytes", b.Name, MaxTokenBytes)
	case strings.IndexFunc(token, func(c rune) bool { return c <= ' ' || c >= 0x7f }) >= 0:
		return "", fmt.Errorf("bearer %q: its token holds a character other than visible ASCII, which a header cannot carry", b.Name)
	}
	return token, nil
}

// pathReason is a file error without the path, which stays the operator's.
func pathReason(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

// DenyPrivate returns a runner whose webhooks refuse every destination outside the
// public unicast ranges (engine.NonPublic).
// The rule is checked on the address each connection actually dials, after the
// name is resolved at push time, so a name that resolves to 127.0.0.1 is refused
// however it was registered. Redirects are never followed. No HTTP proxy of the
// environment is used, since the address dialled would then be the proxy's.
func (r *Runner) DenyPrivate() *Runner { return r.denyDestinations(engine.NonPublic) }

// denyDestinations returns a runner whose webhooks dial no address that class names
// a range of.
func (r *Runner) denyDestinations(class func(netip.Addr) string) *Runner {
	control := func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("webhook destination %q: not an IP address and port", address)
		}
		if c := class(ap.Addr()); c != "" {
			return &deniedError{addr: ap.Addr().Unmap(), class: c}
		}
		return nil
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: control}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil
	transport.DialContext = dialer.DialContext
	c := *r
	c.client = &http.Client{Transport: transport, CheckRedirect: r.client.CheckRedirect}
	return &c
}

// deniedError is a connection to a destination that DenyPrivate refuses.
type deniedError struct {
	addr  netip.Addr
	class string
}

func (e *deniedError) Error() string {
	return fmt.Sprintf("webhook destination %s is a %s address, which this server refuses (--webhook-deny-private)", e.addr, e.class)
}
