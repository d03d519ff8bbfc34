package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestMCPAnswersMalformedLinesAndGoesOn feeds Serve lines that are no JSON-RPC
// message: each gets its JSON-RPC error, and the session goes on.
func TestMCPAnswersMalformedLinesAndGoesOn(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), Config{}, inR, outW)
		outW.Close()
	}()
	// A server that stops answering fails the test instead of hanging it.
	hung := time.AfterFunc(2*time.Minute, func() { outR.CloseWithError(errors.New("no answer in 2 minutes")) })
	defer func() {
		hung.Stop()
		inW.Close()
		go io.Copy(io.Discard, outR) // what the server says as it ends
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve still runs 10s after its input closed")
		}
	}()
	out := bufio.NewReader(outR)
	type answer struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	// roundTrip sends line and reads the one answer to it.
	roundTrip := func(line string) answer {
		t.Helper()
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatalf("writing %.60s: %v", line, err)
		}
		data, err := out.ReadBytes('\n')
		if err != nil {
			t.Fatalf("no answer to %.60s: %v", line, err)
		}
		var a answer
		if err := json.Unmarshal(data, &a); err != nil {
			t.Fatalf("the answer to %.60s is no JSON: %v: %s", line, err, data)
		}
		return a
	}
	initialized := roundTrip(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if initialized.Error != nil {
		t.Fatalf("initialize: %+v", initialized.Error)
	}
	if _, err := io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	deep := func(id, depth int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list","params":{"x":%s%s}}`, id, strings.Repeat("[", depth), strings.Repeat("]", depth))
	}
	for _, c := range []struct {
		name, line string
		code       int
		id         string // of the answer
	}{
		{"not JSON", "this is not json", -32700, "null"},
		{"an empty array", "[]", -32600, "null"},
		{"a batch", `[{"jsonrpc":"2.0","id":2,"method":"tools/list"}]`, -32600, "null"},
		{"an object as id", `{"jsonrpc": "2.0", "id": {"x": 1}, "method": "tools/list"}`, -32600, "null"},
		{"a boolean as id", `{"jsonrpc": "2.0", "id": true, "method": "tools/list"}`, -32600, "null"},
		{"100,000-deep params", deep(3, 100_000), -32700, "null"},
		{"5,000-deep params", deep(4, 5_000), -32600, "4"},
		{"a truncated line", `{"jsonrpc":"2.0","id":5,"method":"tools/li`, -32700, "null"},
		{"a string", `"tools/list"`, -32600, "null"},
		{"null", "null", -32600, "null"},
		{"another version", `{"jsonrpc":"1.0","id":"v","method":"tools/list"}`, -32600, `"v"`},
		{"no method, no result", `{"jsonrpc":"2.0","id":6}`, -32600, "6"},
		{"a method that is no string", `{"jsonrpc":"2.0","id":7,"method":7}`, -32600, "7"},
		{"two messages on a line", `{"jsonrpc":"2.0","method":"notifications/initialized"} {"jsonrpc":"2.0","method":"notifications/initialized"}`, -32700, "null"},
		{"a line over the limit", `{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"x":"` + strings.Repeat("a", maxLine) + `"}}`, -32600, "null"},
	} {
		a := roundTrip(c.line)
		if a.Error == nil || a.Error.Code != c.code || string(a.ID) != c.id {
			t.Errorf("%s: answered id %s, error %+v; want id %s, code %d", c.name, a.ID, a.Error, c.id, c.code)
		}
	}
	list := roundTrip(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
	var tools struct{ Tools []struct{ Name string } }
	if err := json.Unmarshal(list.Result, &tools); err != nil || string(list.ID) != "9" || len(tools.Tools) == 0 {
		t.Errorf("tools/list after the malformed lines: id %s, %v, %+v", list.ID, err, list.Error)
	}
}
