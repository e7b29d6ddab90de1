package simhttp

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestValidationErrors: a field of the wrong type gets vLLM's
// pydantic-style 400 (message, param), never a Go type name.
func TestValidationErrors(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	for _, tc := range []struct {
		name, path, body string
		message, param   string
	}{
		{"messages a string", "/v1/chat/completions", `{"messages":"hi"}`,
			"1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages'), 'msg': 'Input should be a valid list', 'input': 'hi'}",
			"body.messages"},
		{"message not an object", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"},"hi"]}`,
			"1 validation error:\n  {'type': 'dict_type', 'loc': ('body', 'messages', 1), 'msg': 'Input should be a valid dictionary', 'input': 'hi'}",
			"body.messages.1"},
		{"role a number", "/v1/chat/completions", `{"messages":[{"role":7,"content":"x"}]}`,
			"1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 0, 'role'), 'msg': 'Input should be a valid string', 'input': 7}",
			"body.messages.0.role"},
		{"stream a string", "/v1/completions", `{"prompt":"a","stream":"yes"}`,
			"1 validation error:\n  {'type': 'bool_type', 'loc': ('body', 'stream'), 'msg': 'Input should be a valid boolean', 'input': 'yes'}",
			"body.stream"},
		{"max_tokens fractional", "/v1/completions", `{"prompt":"a","max_tokens":1.5}`,
			"1 validation error:\n  {'type': 'int_from_float', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be a valid integer, got a number with a fractional part', 'input': 1.5}",
			"body.max_tokens"},
		{"model a list", "/tokenize", `{"model":["it's"],"prompt":"x"}`,
			`1 validation error:` + "\n  " + `{'type': 'string_type', 'loc': ('body', 'model'), 'msg': 'Input should be a valid string', 'input': ["it's"]}`,
			"body.model"},
		// chat and completions share these members (openAIRequest, embedded
		// in each request type): their paths name no Go struct.
		{"chat stream a string", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`,
			"1 validation error:\n  {'type': 'bool_type', 'loc': ('body', 'stream'), 'msg': 'Input should be a valid boolean', 'input': 'yes'}",
			"body.stream"},
		{"chat n a string", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":"two"}`,
			"1 validation error:\n  {'type': 'int_type', 'loc': ('body', 'n'), 'msg': 'Input should be a valid integer', 'input': 'two'}",
			"body.n"},
		{"completions cache_salt a number", "/v1/completions", `{"prompt":"a","cache_salt":7}`,
			"1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'cache_salt'), 'msg': 'Input should be a valid string', 'input': 7}",
			"body.cache_salt"},
		{"completions include_usage a string", "/v1/completions", `{"prompt":"a","stream_options":{"include_usage":"yes"}}`,
			"1 validation error:\n  {'type': 'bool_type', 'loc': ('body', 'stream_options', 'include_usage'), 'msg': 'Input should be a valid boolean', 'input': 'yes'}",
			"body.stream_options.include_usage"},
		{"stream_options a list", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream_options":[true,null]}`,
			"1 validation error:\n  {'type': 'dict_type', 'loc': ('body', 'stream_options'), 'msg': 'Input should be a valid dictionary', 'input': [True, None]}",
			"body.stream_options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := env.do(t, "POST", tc.path, tc.body)
			if code != 400 {
				t.Fatalf("status %d (%s); want 400", code, b)
			}
			var v struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("body %s: %v", b, err)
			}
			e := v.Error
			if e.Message != tc.message || e.Type != "Bad Request" || e.Code != 400 || e.Param == nil || *e.Param != tc.param {
				t.Errorf("error = %s\nwant message %q, type Bad Request, param %q", b, tc.message, tc.param)
			}
			if strings.Contains(e.Message, "main.") || strings.Contains(e.Message, "Go ") || strings.Contains(e.Message, "[]") {
				t.Errorf("message %q names Go types", e.Message)
			}
		})
	}
}

func TestPyRepr(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{
		{"hi", `'hi'`},
		{"it's", `"it's"`},
		{`say "it's"`, `'say "it\'s"'`},
		{"a\nb\\", `'a\nb\\'`},
		{map[string]any{"b": json.Number("2"), "a": []any{false, nil}}, `{'a': [False, None], 'b': 2}`},
		{strings.Repeat("x", 300), "'" + strings.Repeat("x", maxReprBytes-1) + "..."},
	} {
		if got := pyRepr(tc.in, 0); got != tc.want {
			t.Errorf("pyRepr(%v) = %s; want %s", tc.in, got, tc.want)
		}
	}
}
