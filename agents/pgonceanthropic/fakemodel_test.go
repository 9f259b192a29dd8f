package pgonceanthropic_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"
)

// fakeModel is an Anthropic API that answers from a script: each request to
// /v1/messages gets the next reply of the script, and every request body is
// kept, to read what the model was told.
type fakeModel struct {
	t        *testing.T
	mu       sync.Mutex
	replies  []string
	requests []map[string]any
}

// newFakeModel starts a fake model and returns it with an SDK client of it.
func newFakeModel(t *testing.T) (*fakeModel, anthropic.Client) {
	t.Helper()
	m := &fakeModel{t: t}
	server := httptest.NewServer(m)
	t.Cleanup(server.Close)
	client := anthropic.NewClient(
		option.WithBaseURL(server.URL),
		option.WithAPIKey("sk-ant-test"),
		option.WithMaxRetries(0),
	)
	return m, client
}

// reply queues the next replies.
func (m *fakeModel) reply(replies ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.replies = append(m.replies, replies...)
}

func (m *fakeModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/v1/messages") {
		http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"not the fake model's"}}`, http.StatusNotFound)
		return
	}
	var request map[string]any
	if err := json.Unmarshal(body, &request); err != nil {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"not JSON"}}`, http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.requests = append(m.requests, request)
	if len(m.replies) == 0 {
		m.mu.Unlock()
		http.Error(w, `{"type":"error","error":{"type":"api_error","message":"the script has no more replies"}}`, http.StatusInternalServerError)
		return
	}
	reply := m.replies[0]
	m.replies = m.replies[1:]
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, reply)
}

// request returns the body of the i-th request the model received.
func (m *fakeModel) request(i int) map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	require.Greater(m.t, len(m.requests), i)
	return m.requests[i]
}

// toolUse is a tool_use block a scripted reply makes; input is the JSON the
// model wrote.
type toolUse struct{ id, name, input string }

// reply is a message that stops for tool use with the given blocks, or ends
// its turn with text when there are none.
func reply(uses ...toolUse) string {
	content := []any{map[string]any{"type": "text", "text": "Let me do that."}}
	stop := "end_turn"
	for _, u := range uses {
		content = append(content, map[string]any{"type": "tool_use", "id": u.id, "name": u.name, "input": json.RawMessage(u.input)})
		stop = "tool_use"
	}
	b, err := json.Marshal(map[string]any{
		"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test",
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 1, "output_tokens": 1},
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// toolResult is a tool_result block as the model received it.
type toolResult struct {
	text    string
	isError bool
}

// toolResults returns the tool_result blocks of the last user message of a
// request, by tool_use_id: what the model reads of its calls.
func toolResults(t *testing.T, request map[string]any) map[string]toolResult {
	t.Helper()
	messages, ok := request["messages"].([]any)
	require.True(t, ok, "messages: %v", request)
	last, ok := messages[len(messages)-1].(map[string]any)
	require.True(t, ok)
	require.Equal(t, "user", last["role"])
	blocks, ok := last["content"].([]any)
	require.True(t, ok, "content: %v", last["content"])
	out := map[string]toolResult{}
	for _, b := range blocks {
		block, ok := b.(map[string]any)
		require.True(t, ok)
		if block["type"] != "tool_result" {
			continue
		}
		id, ok := block["tool_use_id"].(string)
		require.True(t, ok)
		var text strings.Builder
		switch content := block["content"].(type) {
		case string:
			text.WriteString(content)
		case []any:
			for _, c := range content {
				part, ok := c.(map[string]any)
				require.True(t, ok)
				require.Equal(t, "text", part["type"], "content: %v", content)
				s, ok := part["text"].(string)
				require.True(t, ok)
				text.WriteString(s)
			}
		}
		isError, _ := block["is_error"].(bool)
		out[id] = toolResult{text: text.String(), isError: isError}
	}
	return out
}
