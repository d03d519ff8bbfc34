package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// claudeModel stands in for the Anthropic Messages API that the claude CLI calls
// (POST /v1/messages, streamed as server-sent events). It answers the first
// request of the session's main loop that carries the user's prompt trigger with a
// Bash tool call running command, every other request with a short text that ends
// the turn, and records every request. What is not /v1/messages gets a 404, and is
// recorded too.
type claudeModel struct {
	t       *testing.T
	trigger string
	command string
	srv     *httptest.Server

	mu       sync.Mutex
	requests []claudeRequest
	others   []string // method and path of what was not /v1/messages
	calls    int      // tool calls answered
}

// claudeRequest is a request of the session's main loop (the one offered the Bash
// tool), with its raw body.
type claudeRequest struct {
	body     string
	messages []claudeMessage
}

type claudeMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func newClaudeModel(t *testing.T, trigger, command string) *claudeModel {
	m := &claudeModel{t: t, trigger: trigger, command: command}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *claudeModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		m.mu.Lock()
		m.others = append(m.others, r.Method+" "+r.URL.Path)
		m.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	var req struct {
		Messages []claudeMessage `json:"messages"`
		Tools    []struct {
			Name string `json:"name"`
		} `json:"tools"`
		Stream bool `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	mainLoop := false
	for _, tool := range req.Tools {
		mainLoop = mainLoop || tool.Name == "Bash"
	}
	var blocks []map[string]any
	stop := "end_turn"
	m.mu.Lock()
	if mainLoop {
		m.requests = append(m.requests, claudeRequest{body: string(body), messages: req.Messages})
		if m.calls == 0 && strings.Contains(string(body), m.trigger) {
			m.calls++
			stop = "tool_use"
			blocks = append(blocks, map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", m.calls), "name": "Bash",
				"input": map[string]any{"command": m.command, "description": "Start the background work"}})
		}
	}
	n := len(m.requests)
	m.mu.Unlock()
	if blocks == nil {
		blocks = append(blocks, map[string]any{"type": "text", "text": fmt.Sprintf("Noted (%d).", n)})
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": fmt.Sprintf("msg_%d", n), "type": "message", "role": "assistant",
			"model": "claude-scripted", "content": blocks, "stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": 10, "output_tokens": 5}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(typ string, v map[string]any) {
		v["type"] = typ
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
	}
	send("message_start", map[string]any{"message": map[string]any{"id": fmt.Sprintf("msg_%d", n), "type": "message", "role": "assistant",
		"model": "claude-scripted", "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": 10, "output_tokens": 1}}})
	for i, b := range blocks {
		if b["type"] == "text" {
			send("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			send("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "text_delta", "text": b["text"]}})
		} else {
			input, _ := json.Marshal(b["input"])
			send("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
			send("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(input)}})
		}
		send("content_block_stop", map[string]any{"index": i})
	}
	send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": 5}})
	send("message_stop", map[string]any{})
}

// mainRequests is a copy of the main loop's requests so far.
func (m *claudeModel) mainRequests() []claudeRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]claudeRequest(nil), m.requests...)
}

func (m *claudeModel) otherRequests() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.others...)
}

// typedByUser counts the user messages a person typed: text that is neither a
// tool's result nor a notification or reminder Claude Code added itself.
func (r claudeRequest) typedByUser(trigger string) int {
	n := 0
	for _, msg := range r.messages {
		if msg.Role == "user" && strings.Contains(string(msg.Content), trigger) {
			n++
		}
	}
	return n
}
