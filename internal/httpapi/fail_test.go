package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// A client that leaves while its request is served (its context cancelled) is no
// failure of the server's: it is not logged as one; a failure is.
func TestAClientGoneIsNotLoggedAsAFailure(t *testing.T) {
	var logged bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logged, nil))}
	s.fail(httptest.NewRecorder(), fmt.Errorf("find stream BGTASK_EVENTS: %w", context.Canceled))
	if logged.Len() != 0 {
		t.Fatalf("a cancelled request logged %q", logged.String())
	}
	s.fail(httptest.NewRecorder(), errors.New("find stream BGTASK_EVENTS: no responders"))
	if !strings.Contains(logged.String(), "level=ERROR") {
		t.Fatalf("a failure logged %q, want an error", logged.String())
	}
}
