package prompt

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// prose is ~160 KB of plain text split over turns by the bodies below.
func prose(n int) string {
	return strings.Repeat("the quick brown fox jumps over the lazy dog ", n/44+1)[:n]
}

// claudeCodeBody is a ~160 KB Claude Code session: a long system prompt
// with the billing header, tools, and tool_use/tool_result turns.
func claudeCodeBody(size int) []byte {
	tools := make([]map[string]any, 0, 16)
	for i := range 16 {
		tools = append(tools, map[string]any{"name": fmt.Sprintf("Tool%d", i), "description": prose(600),
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{
				"command": map[string]any{"type": "string", "description": prose(120)}}, "required": []string{"command"}}})
	}
	msgs := []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "fix the failing test"}}}}
	total := 40 << 10
	for i := 0; total < size*3/4; i++ {
		id := fmt.Sprintf("toolu_%04d", i)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []map[string]any{
				{"type": "thinking", "thinking": prose(400), "signature": "sig"},
				{"type": "text", "text": prose(200)},
				{"type": "tool_use", "id": id, "name": "Tool1", "input": map[string]any{"command": "go test ./..."}}}},
			map[string]any{"role": "user", "content": []map[string]any{
				{"type": "tool_result", "tool_use_id": id, "content": prose(1800)}}})
		total += 2600
	}
	b, _ := json.Marshal(map[string]any{"model": "claude", "max_tokens": 32000, "stream": true,
		"system": []map[string]any{
			{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli;"},
			{"type": "text", "text": prose(40 << 10), "cache_control": map[string]string{"type": "ephemeral"}}},
		"tools": tools, "messages": msgs})
	return b
}

// agentsBody is a ~160 KB OpenAI Agents SDK Responses request: long
// instructions, function tools, and function_call/function_call_output
// turns.
func agentsBody(size int) []byte {
	tools := make([]map[string]any, 0, 16)
	for i := range 16 {
		tools = append(tools, map[string]any{"type": "function", "name": fmt.Sprintf("tool_%d", i), "description": prose(600),
			"parameters": map[string]any{"type": "object", "properties": map[string]any{
				"query": map[string]any{"type": "string", "title": "Query"}}, "required": []string{"query"}, "additionalProperties": false},
			"strict": true})
	}
	input := []map[string]any{{"role": "user", "content": "research the topic"}}
	total := 40 << 10
	for i := 0; total < size*3/4; i++ {
		id := fmt.Sprintf("call_%04d", i)
		input = append(input,
			map[string]any{"type": "reasoning", "id": "rs", "summary": []any{}, "content": []map[string]any{{"type": "reasoning_text", "text": prose(400)}}},
			map[string]any{"type": "function_call", "call_id": id, "name": "tool_1", "arguments": `{"query":"fox"}`, "id": "fc", "status": "completed"},
			map[string]any{"type": "function_call_output", "call_id": id, "output": prose(2000)})
		total += 2600
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "instructions": prose(40 << 10), "input": input, "tools": tools,
		"stream": true, "store": true, "max_output_tokens": 4096})
	return b
}

func benchParse(b *testing.B, body []byte, api API) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseAPI(body, api); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseChat160KB is a 32k-token text chat (the front's
// forward.BenchmarkParseChat160KB without the message split), the cost
// the Messages and Responses conversions are measured against.
func BenchmarkParseChat160KB(b *testing.B) {
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": prose(160 << 10)}, {"role": "user", "content": "What is it about?"}}})
	benchParse(b, body, APIChat)
}

// BenchmarkParseMessages160KB converts a 160 KB Claude Code session.
func BenchmarkParseMessages160KB(b *testing.B) { benchParse(b, claudeCodeBody(160<<10), APIMessages) }

// BenchmarkParseResponses160KB converts a 160 KB Agents SDK request.
func BenchmarkParseResponses160KB(b *testing.B) { benchParse(b, agentsBody(160<<10), APIResponses) }
