package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
)

const customer = "ana@example.com"

// scriptedModel stands in for a model: it answers a conversation with tool
// calls or a final message, by a script that reads the tool results it was
// given as a model would. Like a sampled model, it spells the same intent
// differently from one sampling to the next; sample names the sampling (the
// runtime's process), so that a turn asked again after the crash comes back
// re-spelled, with new call ids.
type scriptedModel struct {
	sample string
}

// observation is what the model reads of a tool result.
type observation struct {
	Status   string          `json:"status"`
	Response json.RawMessage `json:"response"`
}

// respond returns the model's next message.
func (m *scriptedModel) respond(history []message) message {
	calls, seen := m.read(history)
	var reply []toolCall
	switch {
	case len(calls) == 0 && m.sample == "1":
		reply = append(reply, m.call("refund", object(", ", ": ", "order", 8842, "amount", "42.00")))
	case len(calls) == 0:
		// Sampled again, the model re-plans: another amount, for the same
		// step. To pgonce another action in a step that holds one, a
		// conflict.
		reply = append(reply, m.call("refund", object(", ", ": ", "amount", "40.00", "order", 8842)))
	default:
		reply = m.again(history)
	}
	if len(reply) > 0 || len(calls) == 0 {
		return message{Role: "assistant", ToolCalls: m.ids(history, reply)}
	}

	refund, refunded := seen["refund"]
	_, asked := calls["send_email"]
	if refunded && refund.Status == "succeeded" && !asked {
		var r struct {
			RefundID string `json:"refund_id"`
			Amount   string `json:"amount"`
		}
		_ = json.Unmarshal(refund.Response, &r)
		body := fmt.Sprintf("We refunded %s on order 8842 (%s). Sorry for the double charge.", r.Amount, r.RefundID)
		subject := "Your refund for order 8842"
		reply = []toolCall{
			m.call("send_email", object(", ", ": ", "to", customer, "subject", subject, "body", body)),
			m.call("create_ticket", object(", ", ": ", "title", "Order 8842 charged twice", "order", 8842)),
			// The same e-mail again, in the same turn: models do that.
			m.call("send_email", object(",", ":", "body", body, "subject", subject, "to", customer)),
		}
		return message{Role: "assistant", ToolCalls: m.ids(history, reply)}
	}
	return message{Role: "assistant", Content: m.summary(seen)}
}

// again re-asks the calls of the last turn that the model was told are in
// progress, with the same arguments (spelled otherwise: members in another
// order), as the observation's message tells it to; and after a refund that
// conflicted, it asks for the original one again, spelled otherwise: the
// amount a number, the order in an exponent.
func (m *scriptedModel) again(history []message) []toolCall {
	last := len(history) - 1
	for last >= 0 && history[last].Role != "assistant" {
		last--
	}
	if last < 0 {
		return nil
	}
	results := map[string]observation{}
	for _, msg := range history[last+1:] {
		var obs observation
		_ = json.Unmarshal([]byte(msg.Content), &obs)
		results[msg.ToolCallID] = obs
	}
	var reply []toolCall
	for _, tc := range history[last].ToolCalls {
		switch obs := results[tc.ID]; {
		case obs.Status == "in_progress" || obs.Status == "unavailable":
			reply = append(reply, m.call(tc.Name, reordered(tc.Arguments)))
		case obs.Status == "conflict" && tc.Name == "refund":
			reply = append(reply, m.call("refund", object(",", ":", "amount", 42, "order", json.Number("8.842e3"))))
		}
	}
	return reply
}

// read returns the tools the model has called, and the last result it saw
// of each.
func (m *scriptedModel) read(history []message) (calls map[string]bool, seen map[string]observation) {
	calls, seen = map[string]bool{}, map[string]observation{}
	tools := map[string]string{}
	for _, msg := range history {
		for _, tc := range msg.ToolCalls {
			calls[tc.Name] = true
			tools[tc.ID] = tc.Name
		}
		if msg.Role == "tool" {
			var obs observation
			_ = json.Unmarshal([]byte(msg.Content), &obs)
			seen[tools[msg.ToolCallID]] = obs
		}
	}
	return calls, seen
}

// summary is the model's last message: what it did, from the tool results.
func (m *scriptedModel) summary(seen map[string]observation) string {
	var (
		refund struct {
			RefundID string `json:"refund_id"`
			Amount   string `json:"amount"`
		}
		mail struct {
			MessageID string `json:"message_id"`
		}
		ticket struct {
			Ticket string `json:"ticket"`
		}
	)
	for tool, target := range map[string]any{"refund": &refund, "send_email": &mail, "create_ticket": &ticket} {
		if seen[tool].Status != "succeeded" {
			return fmt.Sprintf("I could not finish: %s came back %q. A person will look into it.", tool, seen[tool].Status)
		}
		_ = json.Unmarshal(seen[tool].Response, target)
	}
	return fmt.Sprintf("Done: I refunded %s on order 8842 (%s), e-mailed the confirmation to %s (%s), "+
		"and opened ticket %s so that billing finds out why you were charged twice.",
		refund.Amount, refund.RefundID, customer, mail.MessageID, ticket.Ticket)
}

func (m *scriptedModel) call(tool, arguments string) toolCall {
	return toolCall{Name: tool, Arguments: arguments}
}

// ids gives the calls of a reply their ids, which the model makes up.
func (m *scriptedModel) ids(history []message, reply []toolCall) []toolCall {
	for i := range reply {
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d/%d", m.sample, len(history), i)
		reply[i].ID = fmt.Sprintf("call_%08x", h.Sum32())
	}
	return reply
}

// object writes a JSON object with its members in the order given, pairs
// separated by comma and names by colon.
func object(comma, colon string, pairs ...any) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteString(comma)
		}
		name, _ := json.Marshal(pairs[i])
		value, _ := json.Marshal(pairs[i+1])
		b.Write(name)
		b.WriteString(colon)
		b.Write(value)
	}
	b.WriteByte('}')
	return b.String()
}

// reordered writes a JSON object's members in the reverse order.
func reordered(arguments string) string {
	dec := json.NewDecoder(strings.NewReader(arguments))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return arguments
	}
	var pairs []any
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return arguments
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return arguments
		}
		pairs = append([]any{name, value}, pairs...)
	}
	return object(",", ":", pairs...)
}
