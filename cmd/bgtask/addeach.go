package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
)

// addEach registers one task for each line of in, the line its command and the
// rest of its spec the flags' (and --spec's), over one connection: a shell loop of
// 'bgtask add' pays a program start and a connection for every task. Each task's
// id (or, with --json, its registration) is printed as it is armed, so a failure
// part way, which names its line, leaves on stdout the ids of those armed before
// it. Blank lines are passed over. Each task has a key of its own: with
// --idempotency-key K, K-N for the Nth line, so that the same input given again
// arms each task once. One registration at a time: eight at once were no faster,
// each waiting its turn for the event stream's disk.
func (o *addOptions) addEach(ctx context.Context, g *globals, cmd *cobra.Command, in io.Reader) error {
	// The command is the line's: what a command brings (a cwd, this host's
	// placement) is set here once, for a stand-in.
	base, err := o.fields(cmd, []string{"true"})
	if err != nil {
		return err
	}
	key, err := baseKey(base["idempotency_key"])
	if err != nil {
		return err
	}
	dialCtx, cancel := g.bounded(ctx)
	c, err := g.open(dialCtx, g.timeout)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	lines, readErr := readLines(readCtx, in)
	n, armed := 0, 0
	for line := range lines {
		n++
		if line == "" {
			continue
		}
		doc := maps.Clone(base)
		doc["command"] = line
		ownKey := key == ""
		if ownKey {
			doc["idempotency_key"] = client.NewIdempotencyKey()
		} else {
			doc["idempotency_key"] = key + "-" + strconv.Itoa(n)
		}
		if err := o.addLine(ctx, g, c, doc, ownKey); err != nil {
			return onLine(n, err)
		}
		armed++
	}
	switch err := readErr(); {
	case errors.Is(err, bufio.ErrTooLong):
		return usageErr("--each-line: line %d is longer than a spec may be (%d bytes)", n+1, engine.MaxSpecBytes)
	case err != nil:
		return fmt.Errorf("--each-line: line %d: %w", n+1, err)
	}
	if armed == 0 {
		return usageErr("--each-line: no command on standard input")
	}
	return nil
}

// readLines yields the lines of in, trimmed, until it ends, fails or ctx ends: a
// read of a terminal or a pipe blocks, and an interrupt must not wait for the next
// line. err, once the lines are over, says why they stopped short, if they did.
func readLines(ctx context.Context, in io.Reader) (lines iter.Seq[string], err func() error) {
	ch := make(chan string)
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 0, 64<<10), engine.MaxSpecBytes)
		for sc.Scan() {
			select {
			case ch <- strings.TrimSpace(sc.Text()):
			case <-ctx.Done():
				return
			}
		}
		readErr = sc.Err()
	}()
	lines = func(yield func(string) bool) {
		for {
			select {
			case line := <-ch:
				if !yield(line) {
					return
				}
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}
	return lines, func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		<-done
		return readErr
	}
}

// addLine registers the task of one line, again through a restart of the server
// within --timeout (its key makes that safe), and prints it.
func (o *addOptions) addLine(ctx context.Context, g *globals, c *client.Client, doc map[string]any, ownKey bool) error {
	raw, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	ctx, cancel := g.bounded(ctx)
	defer cancel()
	return g.noServer(o.registerTask(ctx, g, c, raw, ownKey))
}

// onLine is err, the error of line n's task, with the line named in its message.
func onLine(n int, err error) error {
	status, obj := classify(err)
	named := *obj
	named.Message = "line " + strconv.Itoa(n) + ": " + obj.Message
	return &exitError{code: status, err: &named}
}

// baseKey is the idempotency key the flags or --spec give, "" for none.
func baseKey(v any) (string, error) {
	if !givenKey(v) {
		return "", nil
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case json.RawMessage:
		var key string
		if json.Unmarshal(v, &key) == nil {
			return key, nil
		}
	}
	return "", usageErr("--spec: idempotency_key is not a string")
}
