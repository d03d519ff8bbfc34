package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The stdio transport: one JSON-RPC message a line, as the MCP spec's stdio
// transport has it. The SDK's own (mcp.IOTransport) ends the session at the first
// line it cannot decode, which takes the agent's tools away for the rest of its
// session. This one answers such a line with the JSON-RPC error for it and reads
// on.

// maxLine bounds one message, as the SDK bounds one frame: a longer line is
// refused.
const maxLine = mcp.DefaultMaxLineLength

// stdioTransport serves one session on r and w.
type stdioTransport struct {
	r io.Reader
	w io.Writer
}

func (t *stdioTransport) Connect(context.Context) (mcp.Connection, error) {
	c := &stdioConn{w: t.w, lines: make(chan inLine), closed: make(chan struct{})}
	go c.readLines(bufio.NewReaderSize(t.r, 64<<10))
	return c, nil
}

// stdioConn is an mcp.Connection over newline-delimited JSON-RPC.
type stdioConn struct {
	writeMu sync.Mutex // one line at a time on w: the SDK's messages and the errors for bad lines
	w       io.Writer

	lines     chan inLine // from readLines
	closeOnce sync.Once
	closed    chan struct{}
}

// inLine is a line read, or the error that ended the input.
type inLine struct {
	data    []byte
	tooLong bool // the line was longer than the limit and was dropped
	err     error
}

// readLines sends the input's lines to c.lines until it ends or c closes. A read
// of stdin cannot be interrupted: this goroutine ends at the input's end, as the
// SDK's own reader does.
func (c *stdioConn) readLines(r *bufio.Reader) {
	for {
		data, tooLong, err := readLine(r, maxLine)
		if len(bytes.TrimSpace(data)) > 0 || tooLong {
			if !c.send(inLine{data: data, tooLong: tooLong}) {
				return
			}
		}
		if err != nil {
			c.send(inLine{err: err})
			return
		}
	}
}

func (c *stdioConn) send(l inLine) bool {
	select {
	case c.lines <- l:
		return true
	case <-c.closed:
		return false
	}
}

// readLine reads one line without its end. A line longer than maxLine bytes is
// read to its end and dropped: tooLong is true. At the end of the input, err is
// io.EOF and data is what came after the last newline.
func readLine(r *bufio.Reader, maxLine int) (data []byte, tooLong bool, err error) {
	for {
		var chunk []byte
		chunk, err = r.ReadSlice('\n')
		if !tooLong && len(data)+len(chunk) > maxLine+len("\r\n") {
			data, tooLong = nil, true
		}
		if !tooLong {
			data = append(data, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		data = bytes.TrimSuffix(bytes.TrimSuffix(data, []byte("\n")), []byte("\r"))
		if len(data) > maxLine {
			data, tooLong = nil, true
		}
		return data, tooLong, err
	}
}

// Read returns the next message; a line that is none is answered here and
// skipped.
func (c *stdioConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		var l inLine
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, io.EOF
		case l = <-c.lines:
		}
		if l.err != nil {
			return nil, l.err
		}
		msg, refusal := parseMessage(l.data, l.tooLong)
		if refusal == nil {
			return msg, nil
		}
		data, err := json.Marshal(refusal)
		if err != nil {
			return nil, err
		}
		if err := c.writeLine(data); err != nil {
			return nil, err
		}
	}
}

func (c *stdioConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("encoding a JSON-RPC message: %w", err)
	}
	return c.writeLine(data)
}

func (c *stdioConn) writeLine(data []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err := c.w.Write(append(data, '\n'))
	return err
}

// Close stops the reads; stdin and stdout stay open, the command's.
func (c *stdioConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *stdioConn) SessionID() string { return "" }

// rpcRefusal is the JSON-RPC error that answers a line that is not a message. Its
// id is null unless the line had one that can be read; the SDK's encoding would
// leave a null id out.
type rpcRefusal struct {
	JSONRPC string         `json:"jsonrpc"`
	ID      any            `json:"id"`
	Error   *jsonrpc.Error `json:"error"`
}

func refuse(id any, code int64, format string, args ...any) *rpcRefusal {
	return &rpcRefusal{JSONRPC: "2.0", ID: id, Error: &jsonrpc.Error{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// parseMessage reads a line as one JSON-RPC 2.0 message, or says why it is none:
// a parse error (-32700) for a line that is not JSON, an invalid request (-32600)
// for JSON that is not a message. A batch, an array of messages, is an invalid
// request: MCP has had none since its version 2025-06-18.
func parseMessage(line []byte, tooLong bool) (jsonrpc.Message, *rpcRefusal) {
	if tooLong {
		return nil, refuse(nil, jsonrpc.CodeInvalidRequest, "invalid request: a line of more than %d bytes", maxLine)
	}
	var fields map[string]json.RawMessage
	err := json.Unmarshal(line, &fields)
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntaxErr):
		return nil, refuse(nil, jsonrpc.CodeParseError, "parse error: %v", err)
	case errors.As(err, &typeErr) && typeErr.Value == "array":
		return nil, refuse(nil, jsonrpc.CodeInvalidRequest, "invalid request: a batch (a JSON array); send one message a line")
	case errors.As(err, &typeErr):
		return nil, refuse(nil, jsonrpc.CodeInvalidRequest, "invalid request: a JSON %s, not a message (a JSON object)", typeErr.Value)
	case err != nil:
		return nil, refuse(nil, jsonrpc.CodeParseError, "parse error: %v", err)
	case fields == nil:
		return nil, refuse(nil, jsonrpc.CodeInvalidRequest, "invalid request: null, not a message (a JSON object)")
	}
	id, problem := messageID(fields["id"])
	if problem == "" {
		problem = checkFields(fields)
	}
	if problem != "" {
		return nil, refuse(id, jsonrpc.CodeInvalidRequest, "invalid request: %s", problem)
	}
	msg, err := jsonrpc.DecodeMessage(line) // what is left: params nested too deep for the SDK
	if err != nil {
		return nil, refuse(id, jsonrpc.CodeInvalidRequest, "invalid request: %v", err)
	}
	return msg, nil
}

// messageID reads a message's id: the value to answer with (nil for none or
// null), or what is wrong with it.
func messageID(raw json.RawMessage) (id any, problem string) {
	var v any
	if raw == nil || json.Unmarshal(raw, &v) != nil || v == nil {
		return nil, ""
	}
	switch v.(type) {
	case string, float64:
		return raw, ""
	case bool:
		return nil, "id: want a string, a number or null, not a boolean"
	case []any:
		return nil, "id: want a string, a number or null, not an array"
	}
	return nil, "id: want a string, a number or null, not an object"
}

// checkFields says what is wrong with a message's fields besides its id, if
// anything: a request has a method, a string; a response, a result or an error.
func checkFields(fields map[string]json.RawMessage) string {
	var version string
	if json.Unmarshal(fields["jsonrpc"], &version) != nil || version != "2.0" {
		return `jsonrpc: want "2.0"`
	}
	if method, ok := fields["method"]; ok {
		var name string
		if json.Unmarshal(method, &name) != nil {
			return "method: want a string"
		}
		return ""
	}
	_, hasResult := fields["result"]
	_, hasError := fields["error"]
	if !hasResult && !hasError {
		return "no method, and not a response (no result or error)"
	}
	return ""
}
