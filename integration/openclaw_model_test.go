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
	"time"
)

// openclawModel stands in for the Anthropic Messages API of the provider an
// OpenClaw gateway is configured with (api anthropic-messages, POST
// /v1/messages, streamed). A turn whose new user message holds "RUN:" and a
// command gets an exec tool call running that command; every other request a
// short text that ends the turn. It records the new user message of every
// request, which is what counts turns.
type openclawModel struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []openclawRequest
}

// openclawRequest is one request: when it came and the text of the user message
// it answers ("" for a request that continues a turn after a tool's result).
type openclawRequest struct {
	at   time.Time
	text string
}

func newOpenClawModel(t *testing.T) *openclawModel {
	m := &openclawModel{}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

// openclawInternal marks the context OpenClaw adds as a user message of its own
// at the end of every request.
const openclawInternal = "BEGIN_OPENCLAW_INTERNAL_CONTEXT"

// newUserText is the text of the user message a request answers: the last one,
// OpenClaw's internal context aside, unless a tool's result or an answer of the
// model's comes after it.
func newUserText(messages []struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}) string {
	for i := len(messages) - 1; i >= 0; i-- {
		msg := messages[i]
		if msg.Role != "user" {
			return ""
		}
		var text string
		if json.Unmarshal(msg.Content, &text) != nil {
			var blocks []struct{ Type, Text string }
			_ = json.Unmarshal(msg.Content, &blocks)
			for _, b := range blocks {
				if b.Type == "tool_result" {
					return ""
				}
				text += b.Text
			}
		}
		if !strings.Contains(text, openclawInternal) {
			return text
		}
	}
	return ""
}

func (m *openclawModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Stream bool `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	text := newUserText(req.Messages)
	m.mu.Lock()
	m.requests = append(m.requests, openclawRequest{at: time.Now(), text: text})
	n := len(m.requests)
	m.mu.Unlock()
	block := map[string]any{"type": "text", "text": fmt.Sprintf("Noted (%d).", n)}
	stop := "end_turn"
	if _, command, ok := strings.Cut(text, "RUN:"); ok {
		command, _, _ = strings.Cut(command, "\n")
		block = map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", n), "name": "exec", "input": map[string]any{"command": strings.TrimSpace(command)}}
		stop = "tool_use"
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": fmt.Sprintf("msg_%d", n), "type": "message", "role": "assistant",
			"model": "m1", "content": []any{block}, "stop_reason": stop, "stop_sequence": nil,
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
		"model": "m1", "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": 10, "output_tokens": 1}}})
	if block["type"] == "text" {
		send("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
		send("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": block["text"]}})
	} else {
		input, _ := json.Marshal(block["input"])
		send("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "tool_use", "id": block["id"], "name": "exec", "input": map[string]any{}}})
		send("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(input)}})
	}
	send("content_block_stop", map[string]any{"index": 0})
	send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": 5}})
	send("message_stop", map[string]any{})
}

// wakeTurns are the requests that start a turn with the wake-up of a task whose
// output holds mark: the turns bgtask's pushes ran.
func (m *openclawModel) wakeTurns(mark string) []openclawRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var turns []openclawRequest
	for _, r := range m.requests {
		if strings.Contains(r.text, "Background task") && strings.Contains(r.text, mark) {
			turns = append(turns, r)
		}
	}
	return turns
}

// lastRequest is when the model was last asked anything.
func (m *openclawModel) lastRequest() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.requests) == 0 {
		return time.Time{}
	}
	return m.requests[len(m.requests)-1].at
}
