package pgonceopenai_test

import (
	"encoding/json"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgonceopenai"
	"github.com/pgonce/pgonce/toolcall"
)

// functionCallOutputs returns the function_call_output items of a Responses
// request, by call_id: what the model reads of its calls.
func functionCallOutputs(t *testing.T, request map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	input, ok := request["input"].([]any)
	require.True(t, ok, "input: %v", request["input"])
	for _, item := range input {
		it, ok := item.(map[string]any)
		require.True(t, ok)
		if it["type"] != "function_call_output" {
			continue
		}
		id, ok := it["call_id"].(string)
		require.True(t, ok)
		output, ok := it["output"].(string)
		require.True(t, ok)
		out[id] = output
	}
	return out
}

func TestResponses(t *testing.T) {
	t.Parallel()

	t.Run("FunctionCallsAnsweredByCallIDOnceWhateverTheReask", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		// The first response asks for two refunds, one with invalid
		// arguments; asked again (the runtime lost the outputs), the model
		// writes them anew, with other call ids and other spellings.
		model.reply(
			responsesReply("resp_1",
				toolCall{"call_a", "refund", `{"order":8842,"amount":"42.00"}`},
				toolCall{"call_b", "refund", `{"order":8843,"amount":`}),
			responsesReply("resp_2"),
			responsesReply("resp_3",
				toolCall{"call_c", "refund", `{ "amount": "42.00", "order": 8842 }`},
				toolCall{"call_d", "refund", `{"order":8843,"amount":"7.50"}`}),
			responsesReply("resp_4"),
		)
		params := responses.ResponseNewParams{Model: "gpt-test", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Refund 8842 and 8843.")}}
		var read []map[string]string
		for range 2 {
			turn := toolcall.Turn{RunID: "run-1"} // the runtime's record: no calls before
			resp, err := ai.Responses.New(t.Context(), params)
			require.NoError(t, err)
			outputs := exec.FunctionCallOutputs(t.Context(), turn, resp.Output)
			require.Len(t, outputs, 2)
			require.Equal(t, toolcall.Turn{RunID: "run-1", FirstStep: 2}, turn.Next(len(outputs)))
			_, err = ai.Responses.New(t.Context(), responses.ResponseNewParams{
				Model: "gpt-test", PreviousResponseID: openai.String(resp.ID),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: outputs},
			})
			require.NoError(t, err)
			read = append(read, functionCallOutputs(t, model.lastRequest()))
		}
		require.Equal(t, "succeeded", observation(t, read[0]["call_a"])["status"], read[0]["call_a"])
		require.Equal(t, read[0]["call_a"], read[1]["call_c"], "the same bytes on every ask")
		require.Equal(t, "invalid_arguments", observation(t, read[0]["call_b"])["status"])
		require.Equal(t, "succeeded", observation(t, read[1]["call_d"])["status"], "corrected, it runs")
		require.Equal(t, 2, b.ledger.refunds(t))
	})

	t.Run("TurnCountsTheCallsOfTheInput", func(t *testing.T) {
		t.Parallel()
		input := []responses.ResponseInputItemUnionParam{
			responses.ResponseInputItemParamOfMessage("Refund 8842 and 8843.", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfFunctionCall(`{"order":8842}`, "call_a", "refund"),
			responses.ResponseInputItemParamOfFunctionCall(`{"order":8843}`, "call_b", "refund"),
			responses.ResponseInputItemParamOfFunctionCallOutput("…"),
			responses.ResponseInputItemParamOfCustomToolCall("call_c", "ship it", "note"),
		}
		require.Equal(t, toolcall.Turn{RunID: "run-1", FirstStep: 3}, pgonceopenai.ResponsesTurn("run-1", input))
	})

	t.Run("CallsAndOutputsOfMixedItems", func(t *testing.T) {
		t.Parallel()
		var resp responses.Response
		require.NoError(t, json.Unmarshal([]byte(`{"id":"resp_1","object":"response","output":[
			{"type":"reasoning","id":"rs_1","summary":[]},
			{"type":"function_call","id":"fc_1","call_id":"call_a","name":"refund","namespace":"payments","arguments":"{\"order\":8842}"},
			{"type":"web_search_call","id":"ws_1","status":"completed"},
			{"type":"custom_tool_call","id":"ct_1","call_id":"call_b","name":"note","input":"ship it"}]}`), &resp))
		turn := toolcall.Turn{RunID: "run-1", FirstStep: 5}
		calls := pgonceopenai.ResponsesCalls(turn, resp.Output)
		require.Equal(t, []toolcall.Call{
			{ID: "call_a", RunID: "run-1", Step: 5, Tool: "payments.refund", Arguments: `{"order":8842}`},
			{ID: "call_b", RunID: "run-1", Step: 6, Tool: "note", Arguments: `{"input":"ship it"}`},
		}, calls)
		items := pgonceopenai.ResponsesOutputs(resp.Output, []toolcall.Outcome{{Call: calls[0]}, {Call: calls[1]}})
		b, err := json.Marshal(items)
		require.NoError(t, err)
		var got []map[string]any
		require.NoError(t, json.Unmarshal(b, &got))
		require.Equal(t, "function_call_output", got[0]["type"])
		require.Equal(t, "call_a", got[0]["call_id"])
		require.Equal(t, "custom_tool_call_output", got[1]["type"])
		require.Equal(t, "call_b", got[1]["call_id"])
	})
}
