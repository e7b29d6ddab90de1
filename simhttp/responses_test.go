package simhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// responseAnswer is the part of a response object the tests read.
type responseAnswer struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	Status             string          `json:"status"`
	Model              string          `json:"model"`
	Background         bool            `json:"background"`
	MaxOutputTokens    int             `json:"max_output_tokens"`
	PreviousResponseID *string         `json:"previous_response_id"`
	IncompleteDetails  *incomplete     `json:"incomplete_details"`
	Output             []outputMessage `json:"output"`
	Usage              *responseUsage  `json:"usage"`
	Sim                *simTiming      `json:"sim"`
}

func (a responseAnswer) text() string {
	var b strings.Builder
	for _, o := range a.Output {
		for _, c := range o.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func postResponse(t *testing.T, env *testEnv, body string) responseAnswer {
	t.Helper()
	code, b := env.do(t, "POST", "/v1/responses", body)
	if code != 200 {
		t.Fatalf("POST /v1/responses %s: %d %s", body, code, b)
	}
	var a responseAnswer
	mustJSON(t, b, &a)
	return a
}

// storeOn runs the simulator as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1.
func storeOn(c *Config) { c.ResponsesStore = true }

// A response answers in vLLM's ResponsesResponse shape: every member,
// one assistant message of output_text, usage with the engine's cached
// tokens, "incomplete" when max_output_tokens ended it.
func TestResponsesShape(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	want := tokenized(t, env, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`)
	code, b := env.do(t, "POST", "/v1/responses", `{"model":"sim-model","instructions":"be brief","input":"hello there","max_output_tokens":4}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	var raw map[string]json.RawMessage
	mustJSON(t, b, &raw)
	for _, k := range []string{"id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object", "output",
		"parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p", "background", "max_output_tokens", "max_tool_calls",
		"previous_response_id", "prompt", "reasoning", "service_tier", "status", "text", "top_logprobs", "truncation", "usage",
		"user", "input_messages", "output_messages", "sim"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("response lacks %q", k)
		}
	}
	var a responseAnswer
	mustJSON(t, b, &a)
	if !strings.HasPrefix(a.ID, "resp_") || a.Object != "response" || a.Model != testModel || a.Status != "incomplete" ||
		a.IncompleteDetails == nil || a.IncompleteDetails.Reason != "max_output_tokens" || a.MaxOutputTokens != 4 || a.Sim == nil {
		t.Errorf("response = %s", b)
	}
	if len(a.Output) != 1 || a.Output[0].Type != "message" || a.Output[0].Role != "assistant" || a.Output[0].Status != "completed" ||
		!strings.HasPrefix(a.Output[0].ID, "msg_") || len(a.Output[0].Content) != 1 || a.Output[0].Content[0].Type != "output_text" || a.text() == "" {
		t.Errorf("output = %+v", a.Output)
	}
	if got := string(raw["tools"]) + string(raw["tool_choice"]) + string(raw["truncation"]); got != `[]"auto""disabled"` {
		t.Errorf("tools, tool_choice, truncation = %s; want vLLM's defaults", got)
	}
	u := a.Usage
	if u == nil || u.InputTokens != len(want) || u.OutputTokens != 4 || u.TotalTokens != len(want)+4 || u.InputTokensDetails.CachedTokens != 0 ||
		u.OutputTokensDetails.ReasoningTokens != 0 || u.InputTokensDetails.InputTokensPerTurn == nil {
		t.Errorf("usage = %s; want %d input tokens (the converted chat's)", raw["usage"], len(want))
	}
	again := postResponse(t, env, `{"instructions":"be brief","input":"hello there","max_output_tokens":4}`)
	if got, want := again.Usage.InputTokensDetails.CachedTokens, (len(want)-1)/16*16; got != want {
		t.Errorf("repeat cached_tokens = %d; want %d", got, want)
	}
}

// Without VLLM_ENABLE_RESPONSES_API_STORE vLLM ignores "store", refuses
// background mode and knows no id.
func TestResponsesStoreOff(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	a := postResponse(t, env, `{"input":"hello","max_output_tokens":2}`)
	notFound := func(id string) string {
		return fmt.Sprintf(`{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id)
	}
	for _, tt := range []struct{ method, path, body string }{
		{"GET", "/v1/responses/" + a.ID, ""},
		{"POST", "/v1/responses/" + a.ID + "/cancel", ""},
		{"POST", "/v1/responses", `{"input":"more","previous_response_id":"` + a.ID + `"}`},
	} {
		if code, b := env.do(t, tt.method, tt.path, tt.body); code != 404 || string(b) != notFound(a.ID) {
			t.Errorf("%s %s = %d %s; want vLLM's 404", tt.method, tt.path, code, b)
		}
	}
	code, b := env.do(t, "POST", "/v1/responses", `{"input":"x","background":true}`)
	if e := errorOf2(t, b); code != 400 || e.Type != "invalid_request_error" || !strings.Contains(e.Message, "VLLM_ENABLE_RESPONSES_API_STORE=1") {
		t.Errorf("background without the store = %d %s", code, b)
	}
	code, b = env.do(t, "POST", "/v1/responses", `{"input":"x","background":true,"store":false}`)
	if code != 400 || !strings.Contains(errorOf2(t, b).Message, "background can only be used when `store` is true") {
		t.Errorf("background with store false = %d %s", code, b)
	}
}

// errorOf2 reads an OpenAI error body, whatever its param.
func errorOf2(t *testing.T, b []byte) errorInfo {
	t.Helper()
	var e errorBody
	mustJSON(t, b, &e)
	return e.Error
}

// With the store, a response is kept: GET returns it, and
// previous_response_id continues its conversation as vLLM builds it
// (this request's instructions, the stored messages without their system
// ones, the stored output as an assistant message, this input).
func TestResponsesStoreContinues(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), storeOn)
	first := postResponse(t, env, fmt.Sprintf(`{"instructions":"be brief","input":%q,"max_output_tokens":5}`, longPrompt))
	code, b := env.do(t, "GET", "/v1/responses/"+first.ID, "")
	var got responseAnswer
	mustJSON(t, b, &got)
	if code != 200 || !cmp.Equal(got, first) {
		t.Fatalf("GET = %d %s; want the stored response %+v", code, b, first)
	}
	if code, b := env.do(t, "POST", "/v1/responses/"+first.ID+"/cancel", ""); code != 400 || errorOf2(t, b).Message != "Cannot cancel a synchronous response." {
		t.Errorf("cancel of a finished response = %d %s", code, b)
	}
	second := postResponse(t, env, fmt.Sprintf(`{"instructions":"be brief","input":"and then?","previous_response_id":%q,"max_output_tokens":3}`, first.ID))
	msgs, _ := json.Marshal([]map[string]string{
		{"role": "system", "content": "be brief"},
		{"role": "user", "content": longPrompt},
		{"role": "assistant", "content": first.text()},
		{"role": "user", "content": "and then?"},
	})
	want := tokenized(t, env, `{"messages":`+string(msgs)+`}`)
	if second.Usage.InputTokens != len(want) || second.PreviousResponseID == nil || *second.PreviousResponseID != first.ID {
		t.Errorf("continuation: %d input tokens, previous %v; want %d (/tokenize of vLLM's messages)", second.Usage.InputTokens, second.PreviousResponseID, len(want))
	}
	// The shared history is a prefix hit.
	if second.Usage.InputTokensDetails.CachedTokens < first.Usage.InputTokens/16*16 {
		t.Errorf("continuation cached %d tokens; want at least the first prompt's %d", second.Usage.InputTokensDetails.CachedTokens, first.Usage.InputTokens/16*16)
	}
	// A third turn carries the second's messages (and so the first's).
	third := postResponse(t, env, fmt.Sprintf(`{"input":"last","previous_response_id":%q,"max_output_tokens":1}`, second.ID))
	msgs, _ = json.Marshal([]map[string]string{
		{"role": "user", "content": longPrompt},
		{"role": "assistant", "content": first.text()},
		{"role": "user", "content": "and then?"},
		{"role": "assistant", "content": second.text()},
		{"role": "user", "content": "last"},
	})
	if want := tokenized(t, env, `{"messages":`+string(msgs)+`}`); third.Usage.InputTokens != len(want) {
		t.Errorf("third turn: %d input tokens; want %d", third.Usage.InputTokens, len(want))
	}
	// store false keeps nothing; a restart forgets everything.
	unstored := postResponse(t, env, `{"input":"x","store":false,"max_output_tokens":1}`)
	if code, _ := env.do(t, "GET", "/v1/responses/"+unstored.ID, ""); code != 404 {
		t.Errorf("GET of a store:false response = %d; want 404", code)
	}
	if code, b := env.do(t, "POST", "/sim/restart", ""); code != 200 {
		t.Fatalf("restart: %d %s", code, b)
	}
	if code, _ := env.do(t, "GET", "/v1/responses/"+first.ID, ""); code != 404 {
		t.Errorf("GET after a restart = %d; want 404 (a new process has no store)", code)
	}
}

// The store is bounded: past StoreLimit the oldest response goes.
func TestResponsesStoreLimit(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ResponsesStore, c.StoreLimit = true, 2 })
	var ids []string
	for i := range 3 {
		ids = append(ids, postResponse(t, env, fmt.Sprintf(`{"input":"x%d","max_output_tokens":1}`, i)).ID)
	}
	for i, id := range ids {
		code, _ := env.do(t, "GET", "/v1/responses/"+id, "")
		if want := map[bool]int{true: 404, false: 200}[i == 0]; code != want {
			t.Errorf("GET response %d = %d; want %d", i, code, want)
		}
	}
}

// waitStatus polls GET /v1/responses/{id} until it shows status.
func waitStatus(t *testing.T, env *testEnv, id, status string) responseAnswer {
	t.Helper()
	var a responseAnswer
	waitUntil(t, func() bool {
		code, b := env.do(t, "GET", "/v1/responses/"+id, "")
		if code != 200 {
			t.Fatalf("GET %s = %d %s", id, code, b)
		}
		mustJSON(t, b, &a)
		return a.Status == status
	})
	return a
}

// A background response is stored queued and answered at once; it
// completes on its own, and cancel aborts one still running.
func TestResponsesBackground(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), storeOn)
	a := postResponse(t, env, `{"input":"hello","background":true,"max_output_tokens":3}`)
	if a.Status != "queued" || !a.Background || len(a.Output) != 0 || a.Usage != nil {
		t.Errorf("background answer = %+v; want queued, no output, no usage", a)
	}
	done := waitStatus(t, env, a.ID, "incomplete")
	if done.Usage == nil || done.Usage.OutputTokens != 3 || done.text() == "" {
		t.Errorf("finished background response = %+v", done)
	}

	cfg := testEngineConfig()
	cfg.TimeScale = 1 // slow enough to cancel
	slow := newTestEnv(t, cfg, storeOn)
	b := postResponse(t, slow, `{"input":"hello","background":true,"max_output_tokens":1000}`)
	code, body := slow.do(t, "POST", "/v1/responses/"+b.ID+"/cancel", "")
	var c responseAnswer
	mustJSON(t, body, &c)
	if code != 200 || c.Status != "cancelled" {
		t.Fatalf("cancel = %d %s", code, body)
	}
	waitUntil(t, func() bool { st := slow.eng.Stats(); return st.Running+st.Waiting == 0 })
	if got := waitStatus(t, slow, b.ID, "cancelled"); got.Usage != nil {
		t.Errorf("cancelled response = %+v; want it left cancelled", got)
	}
	if code, body := slow.do(t, "POST", "/v1/responses/"+b.ID+"/cancel", ""); code != 400 {
		t.Errorf("second cancel = %d %s; want 400", code, body)
	}
}

// A Responses stream is vLLM's simple path: created, in_progress, the
// message item and its part added, text deltas, the text, part and item
// done, completed; sequence_number counts from 0.
func TestResponsesStream(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), storeOn)
	evs := postStream(t, env, "/v1/responses", `{"input":"hello there","max_output_tokens":5,"stream":true}`)
	checkResponseEvents(t, evs, 5)
	var completed struct{ Response responseAnswer }
	mustJSON(t, evs[len(evs)-1].data, &completed)
	// The completed response is the stored one.
	code, b := env.do(t, "GET", "/v1/responses/"+completed.Response.ID, "")
	var got responseAnswer
	mustJSON(t, b, &got)
	if code != 200 || !cmp.Equal(got, completed.Response) {
		t.Errorf("GET after the stream = %d %s; want %+v", code, b, completed.Response)
	}
}

// checkResponseEvents checks a stream's events, order and content, for
// maxTokens output tokens.
func checkResponseEvents(t *testing.T, evs []namedEvent, maxTokens int) {
	t.Helper()
	var names []string
	for i, e := range evs {
		var seq struct {
			SequenceNumber *int `json:"sequence_number"`
		}
		mustJSON(t, e.data, &seq)
		if seq.SequenceNumber == nil || *seq.SequenceNumber != i {
			t.Errorf("event %d (%s) sequence_number %v", i, e.name, seq.SequenceNumber)
		}
		if len(names) == 0 || names[len(names)-1] != e.name || e.name != "response.output_text.delta" {
			names = append(names, e.name)
		}
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("event order (-want +got):\n%s", diff)
	}
	var created struct{ Response responseAnswer }
	mustJSON(t, evs[0].data, &created)
	if created.Response.Status != "in_progress" || len(created.Response.Output) != 0 || created.Response.Usage != nil {
		t.Errorf("response.created = %s", evs[0].data)
	}
	var added struct {
		Item        outputMessage `json:"item"`
		OutputIndex int           `json:"output_index"`
	}
	mustJSON(t, evs[2].data, &added)
	if added.Item.Status != "in_progress" || added.Item.Role != "assistant" || len(added.Item.Content) != 0 || !strings.HasPrefix(added.Item.ID, "msg_") {
		t.Errorf("output_item.added = %s", evs[2].data)
	}
	var text strings.Builder
	for _, e := range evs[4 : len(evs)-4] {
		var d struct {
			Delta  string `json:"delta"`
			ItemID string `json:"item_id"`
		}
		mustJSON(t, e.data, &d)
		if d.ItemID != added.Item.ID {
			t.Errorf("delta %s names another item", e.data)
		}
		text.WriteString(d.Delta)
	}
	var done struct{ Text string }
	mustJSON(t, evs[len(evs)-4].data, &done)
	var completed struct{ Response responseAnswer }
	mustJSON(t, evs[len(evs)-1].data, &completed)
	r := completed.Response
	if done.Text != text.String() || r.text() != text.String() || text.Len() == 0 {
		t.Errorf("deltas %q, output_text.done %q, completed output %q; want the same text", text.String(), done.Text, r.text())
	}
	if r.Usage == nil || r.Usage.OutputTokens != maxTokens || r.Sim == nil || r.Output[0].ID != added.Item.ID {
		t.Errorf("response.completed = %s", evs[len(evs)-1].data)
	}
}

// A background stream's events are kept: the POST streams them, and
// GET ?stream=true replays them after starting_after.
func TestResponsesBackgroundStream(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), storeOn)
	evs := postStream(t, env, "/v1/responses", `{"input":"hello there","max_output_tokens":4,"stream":true,"background":true}`)
	checkResponseEvents(t, evs, 4)
	var created struct{ Response responseAnswer }
	mustJSON(t, evs[0].data, &created)
	resp, err := http.Get(env.url + "/v1/responses/" + created.Response.ID + "?stream=true&starting_after=2")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	replayed := namedEvents(t, resp.Body)
	if len(replayed) != len(evs)-3 || string(replayed[0].data) != string(evs[3].data) {
		t.Errorf("replay after 2 = %d events from %s; want %d from event 3", len(replayed), replayed[0].data, len(evs)-3)
	}
}

// Responses errors are vLLM's.
func TestResponsesErrors(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), storeOn)
	for _, tt := range []struct {
		name, body string
		status     int
		typ, msg   string
	}{
		{"no input", `{"model":"sim-model"}`, 400, "Bad Request", "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'input')"},
		{"unknown model", `{"model":"gpt-9","input":"x"}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"unknown previous", `{"input":"x","previous_response_id":"resp_nope"}`, 404, "invalid_request_error", "Response with id 'resp_nope' not found."},
		{"empty salt", `{"input":"x","cache_salt":""}`, 400, "Bad Request", "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': \"Value error, Parameter 'cache_salt'"},
		{"prompt template", `{"input":"x","prompt":{"id":"p"}}`, 400, "Bad Request", "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, prompt template is not supported'"},
		{"context full", fmt.Sprintf(`{"input":%q}`, strings.Repeat("word ", 2100)), 400, "invalid_request_error", "The engine prompt length"},
		{"zero max_output_tokens", `{"input":"x","max_output_tokens":0}`, 400, "BadRequestError", "max_tokens must be at least 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, b := env.do(t, "POST", "/v1/responses", tt.body)
			if e := errorOf2(t, b); code != tt.status || e.Type != tt.typ || !strings.HasPrefix(e.Message, tt.msg) {
				t.Errorf("%d %s; want %d %s %q", code, b, tt.status, tt.typ, tt.msg)
			}
		})
	}
	// A prompt within the context gets max_output_tokens capped, as vLLM's
	// get_max_tokens does, instead of a 400.
	a := postResponse(t, env, fmt.Sprintf(`{"input":%q,"max_output_tokens":5000}`, strings.Repeat("word ", 1000)))
	if a.MaxOutputTokens+a.Usage.InputTokens != 2048 {
		t.Errorf("max_output_tokens %d with %d input tokens; want the rest of the 2048 context", a.MaxOutputTokens, a.Usage.InputTokens)
	}
}

// /v1/responses/render renders what /v1/responses runs, and refuses
// previous_response_id as vLLM's stateless render does.
func TestResponsesRender(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ScaleOut, c.ResponsesStore = true, true })
	want := tokenized(t, env, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`)
	code, b := env.do(t, "POST", "/v1/responses/render", `{"instructions":"be brief","input":"hello there","max_output_tokens":7,"request_id":"resp_mine","cache_salt":"s"}`)
	var g generateRequest
	mustJSON(t, b, &g)
	if code != 200 || !cmp.Equal(g.TokenIDs, want) || g.RequestID != "resp_mine" || g.SamplingParams.MaxTokens != 7 || g.CacheSalt == nil || *g.CacheSalt != "s" {
		t.Errorf("render = %d %s; want /tokenize's %v", code, b, want)
	}
	a := postResponse(t, env, `{"input":"hello","max_output_tokens":1}`)
	code, b = env.do(t, "POST", "/v1/responses/render", `{"input":"more","previous_response_id":"`+a.ID+`"}`)
	if want := `{"error":{"message":"previous_response_id is not supported by the stateless render endpoint.","type":"invalid_request_error","param":"previous_response_id","code":400}}`; code != 400 || string(b) != want {
		t.Errorf("render with previous_response_id = %d %s; want %s", code, b, want)
	}
}

// FuzzResponsesRequest: the Responses validation never panics; what it
// accepts has an input that is a string or a list.
func FuzzResponsesRequest(f *testing.F) {
	for _, s := range []string{`{"input":"hi"}`, `{"input":[{"role":"user","content":"hi"}],"store":false}`, `{"input":5}`, `{}`,
		`{"input":"x","background":true,"store":false}`, `{"input":"x","cache_salt":""}`, `{"input":"x","cache_salt":7}`,
		`{"input":"x","prompt":{}}`, `{"input":"x","previous_response_id":"a","previous_response":{}}`, `{"input":"x","max_output_tokens":"5"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, aerr := decodeResponses(b)
		if aerr != nil {
			if aerr.Status != 400 {
				t.Fatalf("status %d; want 400", aerr.Status)
			}
			return
		}
		in := strings.TrimSpace(string(r.Input))
		if in == "" || in[0] != '"' && in[0] != '[' {
			t.Fatalf("decodeResponses(%q) accepted input %s", b, r.Input)
		}
		if r.background() && r.Store != nil && !*r.Store {
			t.Fatalf("decodeResponses(%q) accepted background without store", b)
		}
	})
}

// FuzzContinuation: building a continuation never panics and gives a JSON
// array holding the converted input's messages.
func FuzzContinuation(f *testing.F) {
	for _, s := range [][2]string{
		{`[{"role":"system","content":"a"},{"role":"user","content":"b"}]`, `[{"role":"user","content":"c"}]`},
		{`[{"role":"user","content":"b"}]`, `[{"role":"system","content":"s"},{"role":"assistant","content":"d"}]`},
		{`[]`, `[1,"x",null]`}, {`{}`, `[]`}, {`[`, ``},
	} {
		f.Add([]byte(s[0]), []byte(s[1]), true, "out")
	}
	f.Fuzz(func(t *testing.T, cur, old []byte, instructions bool, text string) {
		prev := &stored{messages: old, resp: responseObject{Output: []outputMessage{{Content: []outputText{{Text: text}}}}}}
		out, err := continuation(instructions, cur, prev)
		if err != nil {
			return
		}
		var got, in []json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("continuation = %s: not a JSON array: %v", out, err)
		}
		if err := json.Unmarshal(cur, &in); err != nil {
			t.Fatalf("accepted converted messages %s that are not an array", cur)
		}
		if len(got) < len(in)+1 {
			t.Fatalf("continuation %s lost messages of %s", out, cur)
		}
	})
}

// A response that outlives its client is not tied to it: the background
// request keeps running after the POST's connection is gone.
func TestResponsesBackgroundOutlivesClient(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), storeOn)
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(env.url+"/v1/responses", "application/json", strings.NewReader(`{"input":"hi","background":true,"max_output_tokens":20}`))
	if err != nil {
		t.Fatal(err)
	}
	var a responseAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	client.CloseIdleConnections()
	if got := waitStatus(t, env, a.ID, "incomplete"); got.Usage.OutputTokens != 20 {
		t.Errorf("background response after its client left = %+v; want 20 output tokens", got)
	}
}
