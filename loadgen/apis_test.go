package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// agentCall is a call with every block kind: a billing header, a system
// prompt and tools; a user message with an image first; an answer with a
// tool call; its result followed by a user message with an image.
func agentCall(kind Kind) Call {
	args := json.RawMessage(`{"path":"a/b","n":"3"}`)
	return Call{Kind: kind, MaxTokens: 32, System: "be brief", Billing: "x-anthropic-billing-header: cch=1;",
		Tools: []Tool{{Name: "grep", Description: "search", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)}},
		Messages: []Message{
			{Role: "user", Content: "fix it", Images: []Image{{URL: "data:image/png;base64,AAAA", UUID: "ref-1"}}, ImagesFirst: true},
			{Role: "assistant", Content: "looking", ToolCalls: []ToolCall{{ID: "t1", Name: "grep", Arguments: args}}},
			{Role: "tool", ToolCallID: "t1", Content: "found"},
			{Role: "user", Content: "see", Images: []Image{{URL: "https://x/y.png"}}},
		}}
}

func TestMessagesBody(t *testing.T) {
	b, err := messagesBody(agentCall(Messages), "m", true)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","max_tokens":32,"stream":true,` +
		`"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],` +
		`"tools":[{"name":"grep","description":"search","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}],` +
		`"messages":[` +
		`{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"text","text":"fix it"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"looking"},{"type":"tool_use","id":"t1","name":"grep","input":{"path":"a/b","n":"3"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"found"},{"type":"text","text":"see"},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`
	if d := cmp.Diff(want, string(b)); d != "" {
		t.Errorf("messagesBody (-want +got):\n%s", d)
	}
}

func TestResponsesBody(t *testing.T) {
	c := agentCall(Responses)
	store := true
	c.Store, c.PreviousResponseID = &store, "resp_1"
	b, err := responsesBody(c, "m", false)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","instructions":"be brief","input":[` +
		`{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"auto","uuid":"ref-1"},{"type":"input_text","text":"fix it"}]},` +
		`{"type":"message","role":"assistant","content":"looking"},` +
		`{"type":"function_call","call_id":"t1","name":"grep","arguments":"{\"path\":\"a/b\",\"n\":\"3\"}"},` +
		`{"type":"function_call_output","call_id":"t1","output":"found"},` +
		`{"type":"message","role":"user","content":[{"type":"input_text","text":"see"},{"type":"input_image","image_url":"https://x/y.png","detail":"auto"}]}],` +
		`"tools":[{"type":"function","name":"grep","description":"search","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}],` +
		`"max_output_tokens":32,"stream":false,"store":true,"previous_response_id":"resp_1"}`
	if d := cmp.Diff(want, string(b)); d != "" {
		t.Errorf("responsesBody (-want +got):\n%s", d)
	}
}

// sse writes one event as vLLM does: an event line, a data line, a blank
// line (vllm/entrypoints/anthropic/serving.py wrap_data_with_event; the
// Responses router's event stream is alike).
func sse(w io.Writer, v map[string]any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", v["type"], b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

var testSim = map[string]any{"arrival_s": 1.0, "first_token_s": 1.5, "finish_s": 2.0}

// messagesStream is a Messages SSE stream with vLLM's event order.
func messagesStream(w io.Writer, end bool) {
	sse(w, map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_1", "type": "message", "role": "assistant",
		"content": []any{}, "model": "m", "usage": map[string]any{"input_tokens": 40, "output_tokens": 0}}})
	sse(w, map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	sse(w, map[string]any{"type": "ping"})
	for _, t := range []string{"Hello", " world"} {
		sse(w, map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": t}})
	}
	sse(w, map[string]any{"type": "content_block_stop", "index": 0})
	if !end {
		return
	}
	sse(w, map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "max_tokens"},
		"usage": map[string]any{"input_tokens": 40, "output_tokens": 2, "cache_read_input_tokens": 32}, "sim": testSim})
	sse(w, map[string]any{"type": "message_stop"})
}

// responsesStream is a Responses SSE stream with vLLM's event order
// (simple_streaming_events.py), sequence numbers and all.
func responsesStream(w io.Writer, end bool) {
	seq := 0
	ev := func(v map[string]any) { v["sequence_number"] = seq; seq++; sse(w, v) }
	resp := map[string]any{"id": "resp_1", "object": "response", "status": "in_progress", "output": []any{}, "usage": nil}
	ev(map[string]any{"type": "response.created", "response": resp})
	ev(map[string]any{"type": "response.in_progress", "response": resp})
	ev(map[string]any{"type": "response.output_item.added", "output_index": 0, "item": map[string]any{"id": "msg_9", "type": "message", "role": "assistant", "content": []any{}}})
	ev(map[string]any{"type": "response.content_part.added", "item_id": "msg_9", "part": map[string]any{"type": "output_text", "text": ""}})
	for _, t := range []string{"Hello", " world"} {
		ev(map[string]any{"type": "response.output_text.delta", "item_id": "msg_9", "delta": t, "logprobs": []any{}})
	}
	if !end {
		return
	}
	ev(map[string]any{"type": "response.output_text.done", "item_id": "msg_9", "text": "Hello world"})
	done := map[string]any{"id": "resp_1", "object": "response", "status": "incomplete",
		"output": []any{map[string]any{"type": "message", "content": []any{map[string]any{"type": "output_text", "text": "Hello world"}}}},
		"usage": map[string]any{"input_tokens": 40, "input_tokens_details": map[string]any{"cached_tokens": 32}, "output_tokens": 2,
			"output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 42}, "sim": testSim}
	ev(map[string]any{"type": "response.completed", "response": done})
}

func TestReadEvents(t *testing.T) {
	for _, kind := range []Kind{Messages, Responses} {
		t.Run(kind.String(), func(t *testing.T) {
			var b strings.Builder
			if kind == Messages {
				messagesStream(&b, true)
			} else {
				responsesStream(&b, true)
			}
			var rep Reply
			if err := readEvents(strings.NewReader(b.String()), kind, &rep, time.Now()); err != nil {
				t.Fatal(err)
			}
			rep.WallTTFT = 0
			want := Reply{Text: "Hello world", PromptTokens: 40, CachedTokens: 32, OutputTokens: 2, Chunks: 2,
				Sim: &SimTiming{ArrivalS: 1, FirstTokenS: 1.5, FinishS: 2}, ResponseID: "msg_1"}
			if kind == Responses {
				want.ResponseID = "resp_1"
			}
			if d := cmp.Diff(want, rep); d != "" {
				t.Errorf("readEvents (-want +got):\n%s", d)
			}
			var cut strings.Builder
			if kind == Messages {
				messagesStream(&cut, false)
			} else {
				responsesStream(&cut, false)
			}
			if err := readEvents(strings.NewReader(cut.String()), kind, &Reply{}, time.Now()); !errors.Is(err, ErrTruncated) {
				t.Errorf("readEvents of a stream cut before its end = %v; want ErrTruncated", err)
			}
		})
	}
}

func TestReadEventsErrors(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		in   string
		want string
	}{
		{"anthropic error event", Messages, `event: error` + "\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}` + "\n\n", "busy"},
		{"responses error event", Responses, `data: {"type":"error","code":"x","message":"bad input","sequence_number":3}` + "\n\n", "bad input"},
		{"response failed", Responses, `data: {"type":"response.failed","response":{"id":"resp_2","status":"failed","error":{"code":"server_error","message":"engine dead"}}}` + "\n\n", "engine dead"},
		{"bad json", Messages, "data: {\n\n", "decode stream event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := readEvents(strings.NewReader(tt.in), tt.kind, &Reply{}, time.Now())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("readEvents = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestReadAgentBody(t *testing.T) {
	tests := []struct {
		name    string
		kind    Kind
		body    string
		want    Reply
		wantErr string
	}{
		{name: "message", kind: Messages,
			body: `{"id":"msg_7","type":"message","role":"assistant","content":[{"type":"text","text":"hi "},{"type":"tool_use","id":"t","name":"n","input":{}},{"type":"text","text":"there"}],` +
				`"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":2,"cache_read_input_tokens":8},"sim":{"arrival_s":1,"first_token_s":2,"finish_s":3}}`,
			want: Reply{Text: "hi there", PromptTokens: 10, CachedTokens: 8, OutputTokens: 2, ResponseID: "msg_7", Sim: &SimTiming{ArrivalS: 1, FirstTokenS: 2, FinishS: 3}}},
		{name: "message without a cached figure", kind: Messages,
			body: `{"id":"msg_8","type":"message","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":10,"output_tokens":1}}`,
			want: Reply{Text: "x", PromptTokens: 10, OutputTokens: 1, ResponseID: "msg_8"}},
		{name: "response", kind: Responses,
			body: `{"id":"resp_3","object":"response","status":"completed","error":null,"output":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"hmm"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[]}]}],` +
				`"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"total_tokens":13}}`,
			want: Reply{Text: "done", PromptTokens: 12, OutputTokens: 1, ResponseID: "resp_3"}},
		{name: "anthropic error", kind: Messages, body: `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: field required"}}`, wantErr: "max_tokens"},
		{name: "failed response", kind: Responses, body: `{"id":"resp_4","status":"failed","error":{"message":"no"}}`, wantErr: "no"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rep Reply
			err := readAgentBody(strings.NewReader(tt.body), tt.kind, &rep)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("readAgentBody = %v; want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, rep); d != "" {
				t.Errorf("readAgentBody (-want +got):\n%s", d)
			}
		})
	}
}

func FuzzReadEvents(f *testing.F) {
	var m, r strings.Builder
	messagesStream(&m, true)
	responsesStream(&r, true)
	f.Add([]byte(m.String()), false)
	f.Add([]byte(r.String()), true)
	f.Add([]byte("data: {\"type\":\"message_start\",\"message\":\"x\"}\n\ndata: {\"type\":\"message_stop\"}\n"), false)
	f.Add([]byte("data: {\"type\":\"response.output_text.delta\",\"delta\":{\"type\":\"text_delta\",\"text\":1}}\n"), true)
	f.Add([]byte(`{"type":"message","content":[{"type":"text","text":"a"}],"usage":{"input_tokens":"1"}}`), false)
	f.Fuzz(func(t *testing.T, b []byte, responses bool) {
		kind := Messages
		last := "message_stop"
		if responses {
			kind, last = Responses, "response.completed"
		}
		var rep Reply
		err := readEvents(strings.NewReader(string(b)), kind, &rep, time.Now())
		if err == nil && !strings.Contains(string(b), last) && !strings.Contains(string(b), "response.incomplete") {
			t.Fatalf("accepted a stream without its last event")
		}
		var rep2 Reply
		readAgentBody(strings.NewReader(string(b)), kind, &rep2) // must not panic
	})
}

// agentServer answers both APIs in their shapes, streamed or not, and
// keeps what it was sent.
type agentServer struct {
	bodies map[string][]byte // by path, the last body
}

func (s *agentServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.bodies[r.URL.Path] = b
	var q struct {
		Stream bool `json:"stream"`
	}
	json.Unmarshal(b, &q)
	w.Header().Set(ServedByHeader, "pod-a")
	switch {
	case q.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/v1/messages" {
			messagesStream(w, true)
		} else {
			responsesStream(w, true)
		}
	case r.URL.Path == "/v1/messages":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"Hello world"}],"usage":{"input_tokens":40,"output_tokens":2,"cache_read_input_tokens":32}}`)
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hello world"}]}],`+
			`"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":2}}`)
	}
}

// The client sends each API to its path and reads its answer, streamed and
// not, with the served-by header as for chat.
func TestClientAgentAPIs(t *testing.T) {
	as := &agentServer{bodies: map[string][]byte{}}
	srv := httptest.NewServer(as)
	defer srv.Close()
	c := NewClient(nil, "m")
	for _, kind := range []Kind{Messages, Responses} {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/stream=%v", kind, stream), func(t *testing.T) {
				c.Stream = stream
				rep, err := c.Do(context.Background(), Endpoint{URL: srv.URL}, agentCall(kind))
				if err != nil {
					t.Fatal(err)
				}
				id := "msg_1"
				if kind == Responses {
					id = "resp_1"
				}
				if rep.Text != "Hello world" || rep.PromptTokens != 40 || rep.CachedTokens != 32 || rep.ResponseID != id ||
					rep.Pod != "pod-a" || rep.Streamed != stream || rep.WallTTFT <= 0 {
					t.Errorf("Do = %+v; want the answer read, id %s, served by pod-a", rep, id)
				}
				path := "/v1/" + kind.String()
				var body map[string]any
				if err := json.Unmarshal(as.bodies[path], &body); err != nil || body["stream"] != stream || body["model"] != "m" {
					t.Errorf("%s got %s; want stream %v and model m", path, as.bodies[path], stream)
				}
			})
		}
	}
}
