package sinks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
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

func (r *Runner) webhook(ctx context.Context, url string, w events.Wakeup, attempt int) engine.SinkOutcome {
	body, err := json.Marshal(w)
	if err != nil {
		return engine.SinkOutcome{Permanent: true, Error: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return engine.SinkOutcome{Permanent: true, Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "bgtask")
	req.Header.Set(IdempotencyHeader, w.ID)
	req.Header.Set(AttemptHeader, strconv.Itoa(attempt))
	req.Header.Set(SignatureHeader, Sign(r.secret, body))
	resp, err := r.client.Do(req)
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
