package client_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/bgtask/bgtask/client"
)

// Unread counts what no reader acknowledged, before any reader too; ack tokens
// acknowledge only their own target's wake-ups, all of them or none, with no
// inbox open.
func TestUnreadAndAckTokens(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fired(t, c, "tokens", 2)
	fired(t, c, "tokens-other", 1)
	unread := func(target string) client.Unread {
		t.Helper()
		u, err := c.Unread(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	if u := unread("tokens"); u != (client.Unread{Count: 2, NoReader: true}) {
		t.Fatalf("before any reader: %+v", u)
	}
	read := func(target string) []string {
		t.Helper()
		inbox, err := c.Inbox(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		got, err := inbox.Fetch(ctx, 10, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var tokens []string
		for _, d := range got {
			tokens = append(tokens, d.Token())
		}
		return tokens
	}
	tokens := read("tokens")
	others := read("tokens-other")
	if u := unread("tokens"); len(tokens) != 2 || u != (client.Unread{Count: 2}) {
		t.Fatalf("read, not acknowledged: %d tokens, %+v", len(tokens), u)
	}
	for name, bad := range map[string][]string{
		"another target's":   {tokens[0], others[0]},
		"another subject":    {tokens[0], base64.RawURLEncoding.EncodeToString([]byte("bgtask.register"))},
		"not base64":         {tokens[0], "%%%"},
		"a wildcard subject": {base64.RawURLEncoding.EncodeToString([]byte("$JS.ACK.BGTASK_INBOX.inbox-tokens.>"))},
	} {
		var apiErr *client.Error
		if err := c.AckTokens(ctx, "tokens", bad...); !errors.As(err, &apiErr) || apiErr.Code != 400 || apiErr.Field != "acks" {
			t.Errorf("%s token: %v, want a 400 naming acks", name, err)
		}
	}
	if u := unread("tokens"); u.Count != 2 {
		t.Fatalf("refused tokens acknowledged: %+v", u)
	}
	if err := c.AckTokens(ctx, "tokens", tokens...); err != nil {
		t.Fatal(err)
	}
	if u := unread("tokens"); u != (client.Unread{}) {
		t.Fatalf("after the acknowledgements: %+v", u)
	}
	var apiErr *client.Error
	if _, err := c.Unread(ctx, "a.b"); !errors.As(err, &apiErr) || apiErr.Field != "target" {
		t.Fatalf("unread of a bad name: %v", err)
	}
}

// A fetch that may wait answers once a wake-up is there, with those there (up to
// its max), not at the end of its wait.
func TestAFetchAnswersOnceAWakeupIsThere(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := fired(t, c, "fetch-soon", 1)
	inbox, err := c.Inbox(ctx, "fetch-soon")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := inbox.Fetch(ctx, 10, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); len(got) != 1 || got[0].Wakeup.ID != ids[0] || took > 10*time.Second {
		t.Fatalf("fetched %d wake-ups in %s, want the one there, at once", len(got), took.Round(time.Millisecond))
	}
}
