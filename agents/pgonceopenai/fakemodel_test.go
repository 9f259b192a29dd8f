package pgonceopenai_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
)

// fakeModel is an OpenAI API that answers from a script: each request to
// /v1/chat/completions or /v1/responses gets the next reply of the script,
// and every request body is kept, to read what the model was told.
type fakeModel struct {
	t        *testing.T
	mu       sync.Mutex
	replies  []string
	requests []map[string]any
}

// newFakeModel starts a fake model and returns it with an SDK client of it.
func newFakeModel(t *testing.T) (*fakeModel, openai.Client) {
	t.Helper()
	m := &fakeModel{t: t}
	server := httptest.NewServer(m)
	t.Cleanup(server.Close)
	client := openai.NewClient(
		option.WithBaseURL(server.URL+"/v1/"),
		option.WithAPIKey("sk-test"),
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
	if err != nil || r.Method != http.MethodPost ||
		(!strings.HasSuffix(r.URL.Path, "/chat/completions") && !strings.HasSuffix(r.URL.Path, "/responses")) {
		http.Error(w, `{"error":{"message":"not the fake model's"}}`, http.StatusNotFound)
		return
	}
	var request map[string]any
	if err := json.Unmarshal(body, &request); err != nil {
		http.Error(w, `{"error":{"message":"not JSON"}}`, http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.requests = append(m.requests, request)
	if len(m.replies) == 0 {
		m.mu.Unlock()
		http.Error(w, `{"error":{"message":"the script has no more replies"}}`, http.StatusInternalServerError)
		return
	}
	reply := m.replies[0]
	m.replies = m.replies[1:]
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, reply)
}

// lastRequest returns the body of the last request the model received.
func (m *fakeModel) lastRequest() map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	require.NotEmpty(m.t, m.requests)
	return m.requests[len(m.requests)-1]
}

// toolCall is a function call a scripted reply makes.
type toolCall struct{ id, name, arguments string }

// chatReply is a chat completion whose message asks for calls, or says text
// when there are none.
func chatReply(text string, calls ...toolCall) string {
	var tcs []map[string]any
	for _, c := range calls {
		tcs = append(tcs, map[string]any{
			"id": c.id, "type": "function",
			"function": map[string]any{"name": c.name, "arguments": c.arguments},
		})
	}
	message := map[string]any{"role": "assistant", "content": text, "refusal": nil}
	finish := "stop"
	if len(tcs) > 0 {
		message["content"], message["tool_calls"], finish = nil, tcs, "tool_calls"
	}
	b, err := json.Marshal(map[string]any{
		"id": "chatcmpl-test", "object": "chat.completion", "created": 1, "model": "gpt-test",
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "message": message, "logprobs": nil}},
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// responsesReply is a response whose output has the given function calls.
func responsesReply(id string, calls ...toolCall) string {
	output := []any{}
	for i, c := range calls {
		output = append(output, map[string]any{
			"type": "function_call", "id": fmt.Sprintf("fc_%d", i), "call_id": c.id,
			"name": c.name, "arguments": c.arguments, "status": "completed",
		})
	}
	if len(calls) == 0 {
		output = append(output, map[string]any{
			"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": "Done.", "annotations": []any{}}},
		})
	}
	b, err := json.Marshal(map[string]any{
		"id": id, "object": "response", "created_at": 1, "model": "gpt-test", "status": "completed",
		"output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// toolMessages returns the tool messages of a chat completion request, by
// tool_call_id: what the model reads of its calls.
func toolMessages(t *testing.T, request map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	messages, ok := request["messages"].([]any)
	require.True(t, ok, "messages: %v", request)
	for _, m := range messages {
		msg, ok := m.(map[string]any)
		require.True(t, ok)
		if msg["role"] != "tool" {
			continue
		}
		id, ok := msg["tool_call_id"].(string)
		require.True(t, ok)
		content, ok := msg["content"].(string)
		require.True(t, ok, "content: %v", msg["content"])
		out[id] = content
	}
	return out
}
