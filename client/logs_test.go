package client_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/events"
)

// A task's output comes in chunks with their sequences in the log stream, and a
// read after one of them resumes there.
func TestLogsResumeAfterAChunk(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.OpenLogs(ctx, js, events.LogConfig{}); err != nil { // a server opens it; the test's engine does not
		t.Fatal(err)
	}
	reg, err := c.Register(ctx, client.Spec{Command: "true"}) // no worker: it stays armed
	if err != nil {
		t.Fatal(err)
	}
	// publish writes a chunk of the task's output as a worker does.
	publish := func(stream string, offset int, data string, eof bool) uint64 {
		msg := &nats.Msg{Subject: events.LogSubject(reg.ID, stream), Data: []byte(data), Header: nats.Header{}}
		msg.Header.Set(events.LogOffsetHeader, strconv.Itoa(offset))
		if eof {
			msg.Header.Set(events.LogEOFHeader, "1")
		}
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	s1 := publish(client.Stdout, 0, "one\n", false)
	s2 := publish(client.Stderr, 0, "oops\n", true)
	s3 := publish(client.Stdout, 4, "two\n", true)
	read := func(o client.LogOptions) []client.LogChunk {
		t.Helper()
		var got []client.LogChunk
		if err := c.Logs(ctx, reg.ID[:8], o, func(ch client.LogChunk) error { got = append(got, ch); return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	all := read(client.LogOptions{Follow: true}) // both outputs have their end: the follow ends
	want := []struct {
		seq  uint64
		data string
		eof  bool
	}{{s1, "one\n", false}, {s2, "oops\n", false}, {s2, "", true}, {s3, "two\n", false}, {s3, "", true}}
	if len(all) != len(want) {
		t.Fatalf("chunks %+v, want %+v", all, want)
	}
	for i, w := range want {
		if all[i].Seq != w.seq || string(all[i].Data) != w.data || all[i].EOF != w.eof {
			t.Fatalf("chunk %d: %+v, want %+v", i, all[i], w)
		}
	}
	resumed := read(client.LogOptions{Streams: []string{client.Stdout}, After: s1})
	if len(resumed) != 2 || resumed[0].Seq != s3 || string(resumed[0].Data) != "two\n" || !resumed[1].EOF {
		t.Fatalf("stdout after %d: %+v", s1, resumed)
	}
}

// A target's state reads back as it was stored; a bad one is refused, naming
// its field, and changes nothing.
func TestTargetsStates(t *testing.T) {
	c := connect(t, os.Getenv("BGTASK_HOME"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := c.Target(ctx, "states-agent"); err != nil || st.State != client.TargetIdle {
		t.Fatalf("a target that never said: %+v, %v", st, err)
	}
	busy, err := c.SetTarget(ctx, "states-agent", client.TargetBusy, 10*time.Minute)
	if err != nil || busy.State != client.TargetBusy || busy.Until == nil || !busy.Until.Equal(busy.Since.Add(10*time.Minute)) {
		t.Fatalf("busy for 10m: %+v, %v", busy, err)
	}
	for _, bad := range []struct {
		name, state string
		ttl         time.Duration
		field       string
	}{
		{"states-agent", "asleep", 0, "state"},
		{"states-agent", client.TargetIdle, time.Minute, "ttl"},
		{"states-agent", client.TargetBusy, 1000 * time.Hour, "ttl"},
		{"a.b", client.TargetIdle, 0, "target"},
	} {
		var apiErr *client.Error
		if _, err := c.SetTarget(ctx, bad.name, bad.state, bad.ttl); !errors.As(err, &apiErr) || apiErr.Code != 400 || apiErr.Field != bad.field {
			t.Errorf("set %+v: %v, want a 400 naming %s", bad, err, bad.field)
		}
	}
	st, err := c.Target(ctx, "states-agent")
	if err != nil || st.State != client.TargetBusy || !st.Until.Equal(*busy.Until) || !st.Since.Equal(busy.Since) {
		t.Fatalf("read back: %+v, %v; want %+v", st, err, busy)
	}
	all, err := c.Targets(ctx)
	if err != nil || !all["states-agent"].Since.Equal(busy.Since) {
		t.Fatalf("targets: %+v, %v", all, err)
	}
}
