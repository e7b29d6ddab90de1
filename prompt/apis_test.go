package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// claudeCode is a request as Claude Code sends it to /v1/messages: system
// blocks led by the per-request billing header, tools with input schemas,
// a thinking turn with a tool call, tool results (one with a screenshot),
// an image, an inline system message, and a redacted thinking block
// echoed back.
const claudeCode = `{
  "model": "claude-sonnet-4-5-20250929",
  "max_tokens": 32000,
  "stream": true,
  "metadata": {"user_id": "user_abc_account__session_1"},
  "system": [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli; cch=d1d48;"},
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "\nYou are an interactive CLI tool that helps users with software engineering tasks.", "cache_control": {"type": "ephemeral"}}
  ],
  "tools": [
    {"name": "Bash", "description": "Executes a bash command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string", "description": "The command to execute"}, "timeout": {"type": "number"}}, "required": ["command"], "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}},
    {"name": "Read", "description": "Reads a file.", "input_schema": {"properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
  ],
  "messages": [
    {"role": "user", "content": [
      {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use the following context.\n</system-reminder>"},
      {"type": "text", "text": "The test in parse_test.go fails \u2014 fix it", "cache_control": {"type": "ephemeral"}}
    ]},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "I should run the tests first.", "signature": "EqQBCkYIBxgCKkDa"},
      {"type": "text", "text": "Let me run the tests."},
      {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "go test ./...", "timeout": 120000}}
    ]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "--- FAIL: TestParse (0.00s)", "is_error": true}
    ]},
    {"role": "system", "content": "<total_tokens>1234</total_tokens>"},
    {"role": "assistant", "content": [
      {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
      {"type": "tool_use", "id": "toolu_01B", "name": "Read", "input": {"file_path": "/src/parse_test.go"}},
      {"type": "tool_use", "id": "toolu_01C", "name": "Bash", "input": {}}
    ]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_01B", "content": [{"type": "text", "text": "package prompt"}, {"type": "text", "text": "func TestParse(t *testing.T) {}"}]},
      {"type": "tool_result", "tool_use_id": "toolu_01C", "content": [{"type": "text", "text": "screenshot:"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
      {"type": "text", "text": "And this diagram:"},
      {"type": "image", "source": {"type": "url", "url": "https://example.com/diagram.png"}}
    ]}
  ]
}`

// agentsSDK is a request as the OpenAI Agents SDK sends it to
// /v1/responses: instructions, function tools (with a hosted tool vLLM
// does not render), and a turn with reasoning, a function call and its
// output, the assistant's answer, and a user message with an image.
const agentsSDK = `{
  "model": "Qwen/Qwen3-8B",
  "instructions": "You are a weather agent. Use the tools.",
  "input": [
    {"content": "What's the weather in Paris?", "role": "user"},
    {"id": "rs_1", "summary": [], "type": "reasoning", "content": [{"type": "reasoning_text", "text": "I need the forecast."}]},
    {"arguments": "{\"city\":\"Paris\"}", "call_id": "call_k1", "name": "get_weather", "type": "function_call", "id": "fc_1", "status": "completed"},
    {"call_id": "call_k1", "output": "{\"forecast\":\"sunny\",\"temp_c\":21}", "type": "function_call_output"},
    {"id": "msg_1", "content": [{"annotations": [], "text": "It is sunny in Paris, 21\u00b0C.", "type": "output_text", "logprobs": []}], "role": "assistant", "status": "completed", "type": "message"},
    {"role": "user", "content": [{"type": "input_text", "text": "And what is in this photo?"}, {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "auto"}]}
  ],
  "tools": [
    {"name": "get_weather", "parameters": {"properties": {"city": {"title": "City", "type": "string"}}, "required": ["city"], "title": "get_weather_args", "type": "object", "additionalProperties": false}, "strict": true, "type": "function", "description": "Get the weather for a city."},
    {"type": "web_search_preview"}
  ],
  "include": [],
  "max_output_tokens": 1024,
  "parallel_tool_calls": true,
  "reasoning": {"effort": "low"},
  "store": true,
  "stream": true,
  "tool_choice": "auto",
  "truncation": "disabled"
}`

// The converted chats of claudeCode and agentsSDK, checked against vLLM's
// conversion by hand (see messages.go and responses.go for the rules):
// Claude Code's billing header is gone and its system blocks are joined;
// the inline system message after a tool result stays in place (the
// request has a system prompt); thinking is the assistant's reasoning and
// redacted thinking is dropped; tool_use input is the arguments' text as
// sent; a user's tool results come before its own text, their text
// blocks joined by "\n" and a screenshot in a user message of its own;
// the Read tool's schema gains "type":"object" at the end.
const (
	claudeCodeChat = `[{"role":"system","content":"You are Claude Code, Anthropic's official CLI for Claude.\nYou are an interactive CLI tool that helps users with software engineering tasks."},` +
		`{"role":"user","content":[{"type":"text","text":"<system-reminder>\nAs you answer the user's questions, you can use the following context.\n</system-reminder>"},{"type":"text","text":"The test in parse_test.go fails \u2014 fix it"}]},` +
		`{"role":"assistant","content":"Let me run the tests.","reasoning":"I should run the tests first.","tool_calls":[{"id":"toolu_01A","type":"function","function":{"name":"Bash","arguments":"{\"command\": \"go test ./...\", \"timeout\": 120000}"}}]},` +
		`{"role":"tool","content":"--- FAIL: TestParse (0.00s)","tool_call_id":"toolu_01A"},` +
		`{"role":"system","content":"<total_tokens>1234</total_tokens>"},` +
		`{"role":"assistant","tool_calls":[{"id":"toolu_01B","type":"function","function":{"name":"Read","arguments":"{\"file_path\": \"/src/parse_test.go\"}"}},{"id":"toolu_01C","type":"function","function":{"name":"Bash","arguments":"{}"}}]},` +
		`{"role":"tool","content":"package prompt\nfunc TestParse(t *testing.T) {}","tool_call_id":"toolu_01B"},` +
		`{"role":"tool","content":"screenshot:","tool_call_id":"toolu_01C"},` +
		`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]},` +
		`{"role":"user","content":[{"type":"text","text":"And this diagram:"},{"type":"image_url","image_url":{"url":"https://example.com/diagram.png"}}]}]`
	claudeCodeTools = `[{"type":"function","function":{"name":"Bash","description":"Executes a bash command.","parameters":{"type": "object", "properties": {"command": {"type": "string", "description": "The command to execute"}, "timeout": {"type": "number"}}, "required": ["command"], "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}}},` +
		`{"type":"function","function":{"name":"Read","description":"Reads a file.","parameters":{"properties": {"file_path": {"type": "string"}}, "required": ["file_path"],"type":"object"}}}]`

	// The reasoning item opens an assistant message that the function call
	// joins; the answer after the tool output is a message of its own; the
	// Responses parts become chat parts; only the function tool renders,
	// flattened into a chat tool with its members in order.
	agentsSDKChat = `[{"role":"system","content":"You are a weather agent. Use the tools."},` +
		`{"role":"user","content":"What's the weather in Paris?"},` +
		`{"role":"assistant","reasoning":"I need the forecast.","tool_calls":[{"id":"call_k1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","content":"{\"forecast\":\"sunny\",\"temp_c\":21}","tool_call_id":"call_k1"},` +
		`{"role":"assistant","content":"It is sunny in Paris, 21\u00b0C."},` +
		`{"role":"user","content":[{"type":"text","text":"And what is in this photo?"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/4AAQ"}}]}]`
	agentsSDKTools = `[{"type":"function","function":{"name":"get_weather","parameters":{"properties": {"city": {"title": "City", "type": "string"}}, "required": ["city"], "title": "get_weather_args", "type": "object", "additionalProperties": false},"strict":true,"description":"Get the weather for a city."}}]`
)

func TestParseAPIClaudeCode(t *testing.T) {
	p, err := ParseAPI([]byte(claudeCode), APIMessages)
	if err != nil {
		t.Fatalf("ParseAPI(claudeCode) error %v", err)
	}
	want := Prompt{Model: "claude-sonnet-4-5-20250929", Stream: true, Chat: true, API: APIMessages,
		Messages: []byte(claudeCodeChat), Tools: []byte(claudeCodeTools), MaxTokens: 32000,
		Images: []Image{{Message: 8}, {Message: 9}}}
	want.Raw = []byte(claudeCode)
	if diff := cmp.Diff(want, p, cmp.Transformer("string", func(b json.RawMessage) string { return string(b) })); diff != "" {
		t.Errorf("ParseAPI(claudeCode) mismatch (-want +got):\n%s", diff)
	}
	body := []byte(claudeCode)
	if p, _ := ParseAPI(body, APIMessages); &p.Raw[0] != &body[0] || len(p.Raw) != len(body) {
		t.Errorf("ParseAPI: Raw does not alias the body")
	}
}

func TestParseAPIAgentsSDK(t *testing.T) {
	p, err := ParseAPI([]byte(agentsSDK), APIResponses)
	if err != nil {
		t.Fatalf("ParseAPI(agentsSDK) error %v", err)
	}
	tru, fls := true, false
	want := Prompt{Model: "Qwen/Qwen3-8B", Stream: true, Chat: true, API: APIResponses,
		Messages: []byte(agentsSDKChat), Tools: []byte(agentsSDKTools), MaxTokens: 1024,
		ChatTemplateKwargs:  []byte(`{"reasoning_effort":"low"}`),
		AddGenerationPrompt: &tru, ContinueFinalMessage: &fls, Store: &tru,
		Images: []Image{{Message: 5}}, Raw: []byte(agentsSDK)}
	if diff := cmp.Diff(want, p, cmp.Transformer("string", func(b json.RawMessage) string { return string(b) })); diff != "" {
		t.Errorf("ParseAPI(agentsSDK) mismatch (-want +got):\n%s", diff)
	}
}

// anthropic is a Messages body with the given messages and extra members.
func anthropic(messages string, extra ...string) string {
	b := `{"model":"m","max_tokens":128,"messages":` + messages
	for _, e := range extra {
		b += "," + e
	}
	return b + "}"
}

// TestParseAPIMessages follows vLLM's own tests of the conversion
// (tests/entrypoints/anthropic/test_anthropic_messages_conversion.py):
// the same requests give the same chat messages.
func TestParseAPIMessages(t *testing.T) {
	toolUse := func(id string) string {
		return `{"type":"tool_use","id":"` + id + `","name":"Bash","input":{"command":"ls"}}`
	}
	toolResult := func(id, content string) string {
		return `{"type":"tool_result","tool_use_id":"` + id + `","content":` + content + `}`
	}
	call := func(id string) string {
		return `{"id":"` + id + `","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\"}"}}`
	}
	tests := []struct {
		name, body, want string
		err              error
	}{
		{"string content", anthropic(`[{"role":"user","content":"Hello"}]`),
			`[{"role":"user","content":"Hello"}]`, nil},
		{"string system", anthropic(`[{"role":"user","content":"Hello"}]`, `"system":"You are a helpful assistant."`),
			`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello"}]`, nil},
		{"system blocks joined", anthropic(`[{"role":"user","content":"Hello"}]`, `"system":[{"type":"text","text":"You are a helpful assistant."},{"type":"text","text":" Be concise."}]`),
			`[{"role":"system","content":"You are a helpful assistant. Be concise."},{"role":"user","content":"Hello"}]`, nil},
		{"billing header only", anthropic(`[{"role":"user","content":"Hello"}]`, `"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1;"}]`),
			`[{"role":"user","content":"Hello"}]`, nil},
		{"billing header escaped", anthropic(`[{"role":"user","content":"Hello"}]`, `"system":[{"type":"text","text":"\u0078-anthropic-billing-header: cc_version=1;"},{"type":"text","text":"S"}]`),
			`[{"role":"system","content":"S"},{"role":"user","content":"Hello"}]`, nil},
		{"base64 image", anthropic(`[{"role":"user","content":[{"type":"text","text":"Describe this image"},{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"iVBORw0KGgo="}}]}]`),
			`[{"role":"user","content":[{"type":"text","text":"Describe this image"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,iVBORw0KGgo="}}]}]`, nil},
		{"image defaults", anthropic(`[{"role":"user","content":[{"type":"image","source":{"data":"abc123"}},{"type":"image","source":{"type":"url"}}]}]`),
			`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,abc123"}},{"type":"image_url","image_url":{"url":""}}]}]`, nil},
		{"image without source", anthropic(`[{"role":"user","content":[{"type":"image","source":{}},{"type":"text","text":"x"}]}]`),
			`[{"role":"user","content":"x"}]`, nil},
		{"empty text dropped", anthropic(`[{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"x"}]}]`),
			`[{"role":"user","content":"x"}]`, nil},
		{"thinking only", anthropic(`[{"role":"user","content":"Hello"},{"role":"assistant","content":[{"type":"thinking","thinking":"Just thinking...","signature":"sig_xyz"}]},{"role":"user","content":"Go on."}]`),
			`[{"role":"user","content":"Hello"},{"role":"assistant","reasoning":"Just thinking..."},{"role":"user","content":"Go on."}]`, nil},
		{"thinking joined", anthropic(`[{"role":"assistant","content":[{"type":"thinking","thinking":"First thought. ","signature":"s1"},{"type":"thinking","thinking":"Second thought.","signature":"s2"},{"type":"text","text":"Done."}]}]`),
			`[{"role":"assistant","content":"Done.","reasoning":"First thought. Second thought."}]`, nil},
		{"empty assistant kept", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":[]}]`),
			`[{"role":"user","content":"Q"},{"role":"assistant"}]`, nil},
		{"tool result none", anthropic(`[{"role":"assistant","content":[` + toolUse("call_001") + `]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_001"}]}]`),
			`[{"role":"assistant","tool_calls":[` + call("call_001") + `]},{"role":"tool","content":"","tool_call_id":"call_001"}]`, nil},
		{"tool result images", anthropic(`[{"role":"user","content":[` + toolResult("call_001", `[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"IMG1"}},{"type":"image","source":{"type":"url","url":"https://example.com/img2.jpg"}}]`) + `]}]`),
			`[{"role":"tool","content":"","tool_call_id":"call_001"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,IMG1"}},{"type":"image_url","image_url":{"url":"https://example.com/img2.jpg"}}]}]`, nil},
		{"tool reference", anthropic(`[{"role":"user","content":[` + toolResult("t2", `[{"type":"tool_reference","tool_name":"Read"}]`) + `]}]`),
			`[{"role":"tool","content":"","tool_call_id":"t2"},{"role":"tool","content":[{"type":"tool_reference","name":"Read"}],"tool_call_id":"t2"}]`, nil},
		{"assistant tool result", anthropic(`[{"role":"assistant","content":[` + toolResult("t1", `"4"`) + `]}]`),
			`[{"role":"assistant","content":"Tool result: 4"}]`, nil},
		{"tool input as sent", anthropic(`[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"Edit","input":{"old": "a\"b", "n": [1, 2.50]}}]}]`),
			`[{"role":"assistant","tool_calls":[{"id":"t","type":"function","function":{"name":"Edit","arguments":"{\"old\": \"a\\\"b\", \"n\": [1, 2.50]}"}}]}]`, nil},
		{"claude code roles", anthropic(`[{"role":"ctx","content":"c"},{"role":"msg","content":"m"}]`),
			`[{"role":"user","content":"c"},{"role":"user","content":"m"}]`, nil},

		// Inline system messages, placed as inline_system.py's "preserve"
		// (TestInlineSystemMessageInMessagesArray, TestNormalizeInlineSystem).
		{"inline kept in place", anthropic(`[{"role":"user","content":"Hello"},{"role":"system","content":"Inline hint."}]`, `"system":"Top-level prompt."`),
			`[{"role":"system","content":"Top-level prompt."},{"role":"user","content":"Hello"},{"role":"system","content":"Inline hint."}]`, nil},
		{"inline blocks", anthropic(`[{"role":"user","content":"Hi"},{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"Part one. "},{"type":"text","text":"Part two."}]}]`, `"system":"Top."`),
			`[{"role":"system","content":"Top."},{"role":"user","content":"Hi"},{"role":"system","content":"Part one. Part two."}]`, nil},
		{"leading inline joins the prompt", anthropic(`[{"role":"system","content":"Lead."},{"role":"user","content":"Q"}]`, `"system":"Top."`),
			`[{"role":"system","content":"Top.\n\nLead."},{"role":"user","content":"Q"}]`, nil},
		{"leading inline is the prompt", anthropic(`[{"role":"system","content":"First system."},{"role":"user","content":"Hello"},{"role":"system","content":"Second system."}]`),
			`[{"role":"system","content":"First system."},{"role":"user","content":"Hello"},{"role":"system","content":"Second system."}]`, nil},
		{"inline moves past tool results", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":[`+toolUse("t1")+`]},{"role":"system","content":"S"},{"role":"user","content":[`+toolResult("t1", `"out"`)+`]}]`, `"system":"Top."`),
			`[{"role":"system","content":"Top."},{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[` + call("t1") + `]},{"role":"tool","content":"out","tool_call_id":"t1"},{"role":"system","content":"S"}]`, nil},
		{"folded without a prompt", anthropic(`[{"role":"user","content":"Hello"},{"role":"system","content":"Be concise."}]`),
			`[{"role":"user","content":"Hello\n\nBe concise."}]`, nil},
		{"folded under a billing header", anthropic(`[{"role":"user","content":"Q"},{"role":"system","content":"S"}]`, `"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1;"}]`),
			`[{"role":"user","content":"Q\n\nS"}]`, nil},
		{"billing-only inline dropped", anthropic(`[{"role":"user","content":"Hello"},{"role":"system","content":"x-anthropic-billing-header: cc_version=2.1.160"},{"role":"assistant","content":"Hi there"}]`),
			`[{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi there"}]`, nil},
		{"folded into the last tool result", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":[` + toolUse("t1") + `]},{"role":"system","content":"S"},{"role":"user","content":[` + toolResult("t1", `"out"`) + `]}]`),
			`[{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[` + call("t1") + `]},{"role":"tool","content":"out\n\nS","tool_call_id":"t1"}]`, nil},
		{"folded past images and references", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":[` + toolUse("t1") + `,` + toolUse("t2") + `]},{"role":"user","content":[` +
			toolResult("t1", `[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"x"}}]`) + `,` +
			toolResult("t2", `[{"type":"tool_reference","tool_name":"Read"}]`) + `]},{"role":"system","content":"S1"},{"role":"system","content":"S2"}]`),
			`[{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[` + call("t1") + `,` + call("t2") + `]},{"role":"tool","content":"a","tool_call_id":"t1"},` +
				`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,x"}}]},{"role":"tool","content":"S1\n\nS2","tool_call_id":"t2"},` +
				`{"role":"tool","content":[{"type":"tool_reference","name":"Read"}],"tool_call_id":"t2"}]`, nil},
		{"folded into the user's own text", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":[` + toolUse("t1") + `]},{"role":"user","content":[` + toolResult("t1", `"out"`) + `,{"type":"text","text":"<system-reminder>r</system-reminder>"}]},{"role":"system","content":"S"}]`),
			`[{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[` + call("t1") + `]},{"role":"tool","content":"out","tool_call_id":"t1"},{"role":"user","content":"<system-reminder>r</system-reminder>\n\nS"}]`, nil},
		{"folded into list content", anthropic(`[{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]},{"role":"system","content":"S"}]`),
			`[{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B\n\nS"}]}]`, nil},
		{"folded before the next user", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"user","content":"Q2"}]`),
			`[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"user","content":"S\n\nQ2"}]`, nil},
		{"folded into a new user turn", anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"assistant","content":"A2"}]`),
			`[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"user","content":"S"},{"role":"assistant","content":"A2"}]`, nil},
		{"folded into empty content", anthropic(`[{"role":"user","content":[]},{"role":"system","content":"S"}]`),
			`[{"role":"user","content":"S"}]`, nil},

		// Shapes vLLM does not reproduce or does not know: converted, but
		// not routed on.
		{"tool use without id", anthropic(`[{"role":"assistant","content":[{"type":"tool_use","name":"Bash","input":{}}]}]`),
			`[{"role":"assistant","tool_calls":[{"id":"call_0","type":"function","function":{"name":"Bash","arguments":"{}"}}]}]`, ErrNoPrompt},
		{"unknown block", anthropic(`[{"role":"user","content":[{"type":"document","source":{}},{"type":"text","text":"x"}]}]`),
			`[{"role":"user","content":"x"}]`, ErrNoPrompt},
		{"unknown role", anthropic(`[{"role":"tool","content":"x"},{"role":"user","content":"y"}]`),
			`[{"role":"user","content":"y"}]`, ErrNoPrompt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseAPI([]byte(tt.body), APIMessages)
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("ParseAPI(%s) error %v; want %v", tt.body, err, tt.err)
			}
			if string(p.Messages) != tt.want {
				t.Errorf("ParseAPI(%s) messages\n%s\nwant\n%s", tt.body, p.Messages, tt.want)
			}
			if !json.Valid(p.Messages) {
				t.Errorf("ParseAPI(%s) messages are not valid JSON", tt.body)
			}
		})
	}
}

// TestParseAPIMessagesFields: the request's other members, as vLLM's
// AnthropicMessagesRequest reads them.
func TestParseAPIMessagesFields(t *testing.T) {
	msgs := `[{"role":"user","content":"Hi"}]`
	tests := []struct {
		name, body string
		check      func(p Prompt) bool
	}{
		{"max tokens", anthropic(msgs), func(p Prompt) bool { return p.MaxTokens == 128 }},
		{"max tokens as float", `{"model":"m","max_tokens":64.0,"messages":[]}`, func(p Prompt) bool { return p.MaxTokens == 64 }},
		{"max tokens as string", `{"model":"m","max_tokens":"64","messages":[]}`, func(p Prompt) bool { return p.MaxTokens == 64 }},
		{"cache salt", anthropic(msgs, `"cache_salt":"tenant-abc"`), func(p Prompt) bool { return p.CacheSalt == "tenant-abc" }},
		{"chat template kwargs", anthropic(msgs, `"chat_template_kwargs":{"enable_thinking":false}`),
			func(p Prompt) bool { return string(p.ChatTemplateKwargs) == `{"enable_thinking":false}` }},
		{"effort", anthropic(msgs, `"output_config":{"effort":"high"}`),
			func(p Prompt) bool { return string(p.ChatTemplateKwargs) == `{"reasoning_effort":"high"}` }},
		{"effort over kwargs", anthropic(msgs, `"chat_template_kwargs":{"a":1}`, `"output_config":{"effort":"low"}`),
			func(p Prompt) bool { return string(p.ChatTemplateKwargs) == `{"a":1,"reasoning_effort":"low"}` }},
		{"defer loading", anthropic(msgs, `"tools":[{"name":"T","input_schema":{},"defer_loading":true}]`),
			func(p Prompt) bool {
				return string(p.Tools) == `[{"type":"function","function":{"name":"T","parameters":{"type":"object"},"defer_loading":true}}]`
			}},
		{"no tools", anthropic(msgs, `"tools":[]`), func(p Prompt) bool { return string(p.Tools) == `[]` }},
		{"tool choice", anthropic(msgs, `"tool_choice":{"type":"tool","name":"T"}`), func(p Prompt) bool { return p.Tools == nil }},
	}
	for _, tt := range tests {
		p, err := ParseAPI([]byte(tt.body), APIMessages)
		if err != nil || !tt.check(p) {
			t.Errorf("%s: ParseAPI(%s) = %+v, %v", tt.name, tt.body, p, err)
		}
	}
}

// TestParseAPIBadJSON: bodies vLLM refuses with 400 are ErrBadJSON, with
// a message that names what is wrong.
func TestParseAPIBadJSON(t *testing.T) {
	msgs := `[{"role":"user","content":"Hi"}]`
	tests := []struct {
		name, body string
		api        API
		says       string
	}{
		{"not json", `{"model":`, APIMessages, "unexpected end"},
		{"no max_tokens", `{"model":"m","messages":[]}`, APIMessages, "max_tokens"},
		{"zero max_tokens", `{"model":"m","max_tokens":0,"messages":[]}`, APIMessages, "max_tokens"},
		{"no model", `{"max_tokens":1,"messages":[]}`, APIMessages, "model"},
		{"messages not a list", `{"model":"m","max_tokens":1,"messages":{}}`, APIMessages, "messages"},
		{"no content", anthropic(`[{"role":"user"}]`), APIMessages, "messages[0].content"},
		{"no role", anthropic(`[{"content":"x"}]`), APIMessages, "messages[0].role"},
		{"message not an object", anthropic(`["x"]`), APIMessages, "messages[0]"},
		{"block type", anthropic(`[{"role":"user","content":[{"text":"x"}]}]`), APIMessages, "messages[0].content[0].type"},
		{"block text", anthropic(`[{"role":"user","content":[{"type":"text","text":5}]}]`), APIMessages, "messages[0].content[0].text: want a string"},
		{"tool input", anthropic(`[{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t","input":[]}]}]`), APIMessages, "messages[0].content[1].input: want an object"},
		{"tool result content", anthropic(`[{"role":"user","content":[{"type":"tool_result","content":5}]}]`), APIMessages, "content"},
		{"system", anthropic(msgs, `"system":5`), APIMessages, "system"},
		{"system block", anthropic(msgs, `"system":[{"type":"text","text":[]}]`), APIMessages, "system[0].text"},
		{"tool without schema", anthropic(msgs, `"tools":[{"name":"T"}]`), APIMessages, "input_schema"},
		{"tool without name", anthropic(msgs, `"tools":[{"input_schema":{}}]`), APIMessages, "tools[0].name"},
		{"named tool choice", anthropic(msgs, `"tool_choice":{"type":"tool"}`), APIMessages, "tool_choice.name"},
		{"empty cache salt", anthropic(msgs, `"cache_salt":""`), APIMessages, "cache_salt"},
		{"kwargs", anthropic(msgs, `"chat_template_kwargs":[]`), APIMessages, "chat_template_kwargs: want an object"},
		{"effort", anthropic(msgs, `"output_config":{"effort":1}`), APIMessages, "output_config.effort: want a string"},
		{"output config", anthropic(msgs, `"output_config":"high"`), APIMessages, "output_config: want an object"},
		{"tools not a list", anthropic(msgs, `"tools":{}`), APIMessages, "tools: want a list of tools"},
		{"tool not an object", anthropic(msgs, `"tools":[{"name":"T","input_schema":{}},"T"]`), APIMessages, "tools[1]: want an object"},

		{"no input", `{"model":"m"}`, APIResponses, "input"},
		{"input object", `{"input":{}}`, APIResponses, "input"},
		{"background without store", `{"input":"x","background":true,"store":false}`, APIResponses, "background"},
		{"prompt template", `{"input":"x","prompt":{"id":"pmpt_1"}}`, APIResponses, "prompt"},
		{"function call", `{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, APIResponses, "input[0]"},
		{"function call output", `{"input":[{"type":"function_call_output","output":"x"}]}`, APIResponses, "input[0]"},
		{"item not an object", `{"input":[1]}`, APIResponses, "input[0]"},
		{"empty salt", `{"input":"x","cache_salt":""}`, APIResponses, "cache_salt"},
		{"both previous", `{"input":"x","previous_response_id":"resp_1","previous_response":{}}`, APIResponses, "previous_response"},
		{"instructions", `{"input":"x","instructions":5}`, APIResponses, "instructions: want a string"},
		{"reasoning", `{"input":"x","reasoning":"high"}`, APIResponses, "reasoning: want an object"},
		{"reasoning effort", `{"input":"x","reasoning":{"effort":true}}`, APIResponses, "reasoning.effort: want a string"},
		{"responses tools not a list", `{"input":"x","tools":"f"}`, APIResponses, "tools: want a list of tools"},
		{"responses tool not an object", `{"input":"x","tools":[{"type":"web_search_preview"},1]}`, APIResponses, "tools[1]: want an object"},
		{"store", `{"input":"x","store":"yes"}`, APIResponses, "store"},
		{"tool name", `{"input":"x","tools":[{"type":"function"}]}`, APIResponses, "tools[0].name"},
		{"max output tokens", `{"input":"x","max_output_tokens":"five"}`, APIResponses, "max_output_tokens"},

		{"mixed batch", `{"prompt":["a",[1,2]]}`, APICompletions, "prompt"},
		{"empty text in batch", `{"prompt":["a",""]}`, APICompletions, "prompt[1]"},
		{"empty ids in batch", `{"prompt":[[1],[]]}`, APICompletions, "prompt[1]"},
		{"strings in ids", `{"prompt":[[1],["a"]]}`, APICompletions, "prompt[1]"},
		{"fraction", `{"prompt":[1.5,2]}`, APICompletions, "prompt"},
		{"unknown API", `{}`, API(9), "API"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseAPI([]byte(tt.body), tt.api)
			if !errors.Is(err, ErrBadJSON) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("ParseAPI(%s, %v) = %v; want ErrBadJSON about %q", tt.body, tt.api, err, tt.says)
			}
			if diff := cmp.Diff(Prompt{}, p); diff != "" {
				t.Errorf("ParseAPI(%s) returned a prompt with ErrBadJSON:\n%s", tt.body, diff)
			}
		})
	}
}

// TestParseAPIResponses follows construct_chat_messages_with_tool_call's
// merging and the request's other members.
func TestParseAPIResponses(t *testing.T) {
	tests := []struct {
		name, body, want string
		err              error
		check            func(p Prompt) bool
	}{
		{"string input", `{"model":"m","input":"Hello","instructions":"Be brief."}`,
			`[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]`, nil,
			func(p Prompt) bool { return *p.AddGenerationPrompt && !*p.ContinueFinalMessage && p.Store == nil }},
		{"empty instructions", `{"input":"Hello","instructions":""}`, `[{"role":"user","content":"Hello"}]`, nil, nil},
		{"one assistant message", `{"input":[{"role":"user","content":"Q"},` +
			`{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"sum"}]},` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me check."},{"type":"output_text","text":"dropped"}]},` +
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},` +
			`{"type":"function_call","call_id":"c2","name":"g","arguments":"{\"x\":1}"},` +
			`{"type":"function_call_output","call_id":"c1","output":"1"},{"type":"function_call_output","call_id":"c2","output":"2"}]}`,
			`[{"role":"user","content":"Q"},{"role":"assistant","content":"Let me check.","reasoning":"sum","tool_calls":[` +
				`{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{\"x\":1}"}}]},` +
				`{"role":"tool","content":"1","tool_call_id":"c1"},{"role":"tool","content":"2","tool_call_id":"c2"}]`, nil, nil},
		{"second reasoning opens a message", `{"input":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"a"}]},{"type":"reasoning","summary":[]}]}`,
			`[{"role":"assistant","reasoning":"a"},{"role":"assistant","reasoning":""}]`, nil, nil},
		{"easy assistant message", `{"input":[{"role":"assistant","content":"A"},{"role":"assistant","content":"B"}]}`,
			`[{"role":"assistant","content":"A"},{"role":"assistant","content":"B"}]`, nil, nil},
		{"developer and parts", `{"input":[{"role":"developer","content":[{"type":"input_text","text":"rules"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"Q"},{"type":"input_image","image_url":"https://x/y.png","uuid":"img-1"}]}]}`,
			`[{"role":"developer","content":[{"type":"text","text":"rules"}]},{"role":"user","content":[{"type":"text","text":"Q"},{"type":"image_url","image_url":{"url":"https://x/y.png"},"uuid":"img-1"}]}]`, nil,
			func(p Prompt) bool { return cmp.Equal(p.Images, []Image{{Message: 1, UUID: "img-1"}}) }},
		{"tool output parts", `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`,
			`[{"role":"tool","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"tool_call_id":"c"}]`, nil, nil},
		{"partial answer continued", `{"input":[{"role":"user","content":"Q"},{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"The answer is"}]}]}`,
			`[{"role":"user","content":"Q"},{"role":"assistant","content":"The answer is"}]`, nil,
			func(p Prompt) bool { return !*p.AddGenerationPrompt && *p.ContinueFinalMessage }},
		{"fields", `{"input":"x","store":true,"background":true,"cache_salt":"s","max_output_tokens":77,"stream":true,"model":"m"}`,
			`[{"role":"user","content":"x"}]`, nil,
			func(p Prompt) bool {
				return p.Store != nil && *p.Store && p.Background && p.CacheSalt == "s" && p.MaxTokens == 77 && p.Stream && p.Model == "m"
			}},
		{"tools of other types only", `{"input":"x","tools":[{"type":"web_search_preview"}]}`, `[{"role":"user","content":"x"}]`, nil,
			func(p Prompt) bool { return string(p.Tools) == `[]` }},
		{"tools of other types between functions", `{"input":"x","tools":[{"type":"web_search_preview"},{"type":"function","name":"f"},{"type":"file_search"},{"name":"g","type":"function","strict":true}]}`,
			`[{"role":"user","content":"x"}]`, nil,
			func(p Prompt) bool {
				return string(p.Tools) == `[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g","strict":true}}]`
			}},
		{"stored conversation", `{"input":[{"role":"user","content":"and then?"}],"previous_response_id":"resp_123","model":"m"}`,
			`[{"role":"user","content":"and then?"}]`, ErrNoPrompt,
			func(p Prompt) bool {
				return p.PreviousResponseID == "resp_123" && p.Model == "m" && p.API == APIResponses
			}},
		{"previous response", `{"input":"x","previous_response":{"id":"resp_1","output":[]}}`, `[{"role":"user","content":"x"}]`, ErrNoPrompt, nil},
		{"item reference", `{"input":[{"type":"item_reference","id":"msg_1"},{"role":"user","content":"x"}]}`,
			`[{"role":"user","content":"x"}]`, ErrNoPrompt, nil},
		{"image by file id", `{"input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}`,
			`[{"role":"user","content":[{"type":"image_url","image_url":{"url":""}}]}]`, ErrNoPrompt, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseAPI([]byte(tt.body), APIResponses)
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("ParseAPI(%s) error %v; want %v", tt.body, err, tt.err)
			}
			if string(p.Messages) != tt.want {
				t.Errorf("ParseAPI(%s) messages\n%s\nwant\n%s", tt.body, p.Messages, tt.want)
			}
			if tt.check != nil && !tt.check(p) {
				t.Errorf("ParseAPI(%s) = %+v", tt.body, p)
			}
		})
	}
}

func TestParseAPICompletionsBatch(t *testing.T) {
	tests := []struct {
		body string
		want Prompt
		err  error
	}{
		{`{"model":"m","prompt":["a","b c"],"max_tokens":16}`, Prompt{Model: "m", Batch: [][]uint32{nil, nil}, Texts: []string{"a", "b c"}, MaxTokens: 16}, nil},
		{`{"prompt":[[1,2],[3]]}`, Prompt{Batch: [][]uint32{{1, 2}, {3}}}, nil},
		{`{"prompt":["one"]}`, Prompt{Text: "one"}, nil},
		{`{"prompt":[[7,8]]}`, Prompt{Tokens: []uint32{7, 8}}, nil},
		{`{"prompt":[1,2]}`, Prompt{Tokens: []uint32{1, 2}}, nil},
		{`{"prompt":[]}`, Prompt{}, ErrNoPrompt},
		{`{"prompt":[-1]}`, Prompt{}, ErrNoPrompt},
		{`{"prompt":[[1],[4294967296]]}`, Prompt{}, ErrNoPrompt},
	}
	for _, tt := range tests {
		p, err := ParseAPI([]byte(tt.body), APICompletions)
		if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("ParseAPI(%s) error %v; want %v", tt.body, err, tt.err)
			continue
		}
		tt.want.Raw = []byte(tt.body)
		if diff := cmp.Diff(tt.want, p); diff != "" {
			t.Errorf("ParseAPI(%s) mismatch (-want +got):\n%s", tt.body, diff)
		}
		// Parse keeps its old answer: several prompts are no single prompt.
		if lp, lerr := Parse([]byte(tt.body), false); len(tt.want.Batch) > 0 && (!errors.Is(lerr, ErrNoPrompt) || lp.Batch != nil) {
			t.Errorf("Parse(%s) = %+v, %v; want ErrNoPrompt", tt.body, lp, lerr)
		}
	}
}

func TestParseAPIChatImages(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"s"},` +
		`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x/1.png"},"uuid":"sku-1"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]},` +
		`{"role":"assistant","content":"image_url"},` +
		`{"role":"user","content":[{"image_url":"https://x/2.png"},{"type":"input_image","image_url":"https://x/3.png"},{"type":"image_url","image_url":{"url":"u"},"uuid":null},{"type":"text","text":"image"}]}],` +
		`"max_completion_tokens":9,"max_tokens":5}`
	p, err := ParseAPI([]byte(body), APIChat)
	if err != nil {
		t.Fatal(err)
	}
	want := []Image{{Message: 1, UUID: "sku-1"}, {Message: 1}, {Message: 3}, {Message: 3}, {Message: 3}}
	if diff := cmp.Diff(want, p.Images); diff != "" || p.MaxTokens != 9 {
		t.Errorf("ParseAPI(chat) images (-want +got):\n%s\nmax tokens %d", diff, p.MaxTokens)
	}
	if p, _ := ParseAPI([]byte(`{"messages":[{"role":"user","content":"no pictures"}]}`), APIChat); p.Images != nil {
		t.Errorf("ParseAPI(text chat) images %v", p.Images)
	}
}

func TestChatBody(t *testing.T) {
	tru, fls := true, false
	p := Prompt{Model: `m"1`, Messages: []byte(`[{"role":"user","content":"hi"}]`), Tools: []byte(`[{"type":"function","function":{"name":"f"}}]`),
		ChatTemplateKwargs: []byte(`{"reasoning_effort":"low"}`), AddGenerationPrompt: &tru, ContinueFinalMessage: &fls, CacheSalt: "salt<1>"}
	want := `{"model":"m\"1","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"chat_template_kwargs":{"reasoning_effort":"low"},"add_generation_prompt":true,"continue_final_message":false,"cache_salt":"salt\u003c1\u003e","max_tokens":32}`
	if got := string(ChatBody(p, 32)); got != want {
		t.Errorf("ChatBody =\n%s\nwant\n%s", got, want)
	}
	if got := string(ChatBody(Prompt{}, 0)); got != `{"model":"","messages":[]}` {
		t.Errorf("ChatBody(Prompt{}) = %s", got)
	}
	// A converted body renders as the chat request it stands for.
	for _, c := range []struct {
		body string
		api  API
	}{{claudeCode, APIMessages}, {agentsSDK, APIResponses}} {
		p, _ := ParseAPI([]byte(c.body), c.api)
		q, err := ParseAPI(ChatBody(p, p.MaxTokens), APIChat)
		if err != nil || string(q.Messages) != string(p.Messages) || string(q.Tools) != string(p.Tools) || q.MaxTokens != p.MaxTokens ||
			!cmp.Equal(q.Images, p.Images) || string(q.ChatTemplateKwargs) != string(p.ChatTemplateKwargs) {
			t.Errorf("%v: ParseAPI(ChatBody(p)) = %+v, %v; want p's chat", c.api, q, err)
		}
	}
}

func TestAPIString(t *testing.T) {
	for a, want := range map[API]string{APICompletions: "completions", APIChat: "chat", APIMessages: "messages", APIResponses: "responses", API(7): "API(7)"} {
		if a.String() != want {
			t.Errorf("API(%d).String() = %q; want %q", a, a.String(), want)
		}
	}
}

// FuzzParseAPI: no body makes ParseAPI panic; a body encoding/json
// rejects, or one that is not an object, is ErrBadJSON; whatever else
// ParseAPI returns is well-formed: the converted messages and tools are
// valid JSON, ChatBody is a chat request that reads back as the same
// chat, and every image names a message there.
func FuzzParseAPI(f *testing.F) {
	for _, s := range []string{claudeCode, agentsSDK,
		anthropic(`[{"role":"user","content":"Q"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"B","input":{"a":"\u00e9"}}]},{"role":"system","content":"S"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"x"}}]}]}]`),
		anthropic(`[{"role":"user","content":[]},{"role":"system","content":[{"type":"text","text":"S"}]},{"role":"assistant","content":"A"},{"role":"system","content":"T"}]`, `"system":[{"type":"text","text":"x-anthropic-billing-header: a"}]`),
		anthropic(`[{"role":"assistant","content":[{"type":"tool_result","content":[{"type":"text"}]}]}]`, `"tools":[{"name":"T","input_schema":{ }}]`, `"output_config":{"effort":"max"}`),
		`{"input":[{"type":"reasoning","summary":[{"text":"s"}]},{"type":"function_call","call_id":"c","name":"f","arguments":""},{"role":"assistant","content":[{"text":"t"}]},{"role":"user","content":[{"type":"input_image","image_url":"u","uuid":"i"},"bare"]}],"tools":[{"type":"function","name":"f","parameters":{}}],"reasoning":{"effort":"high"}}`,
		`{"input":"x","previous_response_id":"resp_1","store":false}`,
		`{"model":"m","prompt":["a","b"]}`, `{"prompt":[[1,2],[3]]}`, `{"prompt":[1,"a"]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"},"uuid":"x"}]}]}`,
		`{"mess\u0061ges":[],"model":"m","max_tokens":1}`, ` {} `, `[]`, `{"a":1}x`,
	} {
		for api := range 4 {
			f.Add([]byte(s), uint8(api))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, a uint8) {
		api := API(a % 4)
		p, err := ParseAPI(body, api)
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		if !json.Valid(body) || len(trimmed) == 0 || trimmed[0] != '{' {
			if !errors.Is(err, ErrBadJSON) {
				t.Fatalf("ParseAPI(%q, %v) = %v; want ErrBadJSON", body, api, err)
			}
			return
		}
		if errors.Is(err, ErrBadJSON) {
			if diff := cmp.Diff(Prompt{}, p); diff != "" {
				t.Fatalf("ParseAPI(%q, %v) returned a prompt with %v", body, api, err)
			}
			return
		}
		if err != nil && !errors.Is(err, ErrNoPrompt) {
			t.Fatalf("ParseAPI(%q, %v) error %v", body, api, err)
		}
		if p.API != api || &p.Raw[0] != &body[0] {
			t.Fatalf("ParseAPI(%q, %v): API %v, Raw not the body", body, api, p.API)
		}
		for name, v := range map[string][]byte{"messages": p.Messages, "tools": p.Tools, "chat_template_kwargs": p.ChatTemplateKwargs} {
			if v != nil && !json.Valid(v) {
				t.Fatalf("ParseAPI(%q, %v): %s %q is not valid JSON", body, api, name, v)
			}
		}
		if api == APICompletions {
			if err == nil && p.Text == "" && len(p.Tokens) == 0 && len(p.Batch) == 0 {
				t.Fatalf("ParseAPI(%q) succeeded without a prompt", body)
			}
			if p.Texts != nil && len(p.Texts) != len(p.Batch) {
				t.Fatalf("ParseAPI(%q): %d texts for %d prompts", body, len(p.Texts), len(p.Batch))
			}
			return
		}
		var msgs []json.RawMessage
		if p.Messages != nil && json.Unmarshal(p.Messages, &msgs) != nil {
			if api != APIChat {
				t.Fatalf("ParseAPI(%q, %v): messages %s are not an array", body, api, p.Messages)
			}
			return
		}
		for _, im := range p.Images {
			if im.Message < 0 || im.Message >= len(msgs) {
				t.Fatalf("ParseAPI(%q, %v): image of message %d of %d", body, api, im.Message, len(msgs))
			}
		}
		if api == APIChat {
			return
		}
		chat := ChatBody(p, p.MaxTokens)
		q, qerr := ParseAPI(chat, APIChat)
		if qerr != nil || !bytes.Equal(q.Messages, p.Messages) || !bytes.Equal(q.Tools, p.Tools) || q.MaxTokens != p.MaxTokens {
			t.Fatalf("ParseAPI(%q, %v): ChatBody %s reads back as %+v, %v", body, api, chat, q, qerr)
		}
	})
}
