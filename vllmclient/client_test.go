package vllmclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

func TestTokenizeBody(t *testing.T) {
	tests := []struct {
		name string
		req  TokenizeRequest
		want string
	}{
		{
			name: "prompt only: vLLM defaults apply",
			req:  TokenizeRequest{Prompt: "Hello \"world\"\n"},
			want: `{"prompt":"Hello \"world\"\n"}`,
		},
		{
			name: "prompt with model and special tokens",
			req:  TokenizeRequest{Model: "qwen", Prompt: "x", AddSpecialTokens: ptr(false)},
			want: `{"model":"qwen","prompt":"x","add_special_tokens":false}`,
		},
		{
			name: "chat passes raw json unchanged",
			req: TokenizeRequest{
				Model:                "m",
				Messages:             json.RawMessage(`[ {"role": "user", "content": [{"type":"text","text":"hi"}], "x-extra": 1.50} ]`),
				Tools:                json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{}}}]`),
				ChatTemplateKwargs:   json.RawMessage(`{"enable_thinking": false}`),
				AddGenerationPrompt:  ptr(true),
				ContinueFinalMessage: ptr(false),
				AddSpecialTokens:     ptr(false),
			},
			want: `{"model":"m","messages":[ {"role": "user", "content": [{"type":"text","text":"hi"}], "x-extra": 1.50} ],` +
				`"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],` +
				`"chat_template_kwargs":{"enable_thinking": false},` +
				`"add_generation_prompt":true,"continue_final_message":false,"add_special_tokens":false}`,
		},
		{
			name: "chat with only messages",
			req:  TokenizeRequest{Messages: json.RawMessage(`[]`), Prompt: "ignored"},
			want: `{"messages":[]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/tokenize" {
					t.Errorf("request %s %s; want POST /tokenize", r.Method, r.URL.Path)
				}
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type = %q", ct)
				}
				b, _ := io.ReadAll(r.Body)
				got = string(b)
				io.WriteString(w, `{"count":3,"max_model_len":32768,"tokens":[151644,872,4294967295],"token_strs":null}`)
			}))
			defer srv.Close()
			c := New(ClientConfig{BaseURL: srv.URL + "/"})
			toks, err := c.Tokenize(context.Background(), tt.req)
			if err != nil {
				t.Fatalf("Tokenize: %v", err)
			}
			if got != tt.want {
				t.Errorf("body = %s\nwant   %s", got, tt.want)
			}
			if diff := cmp.Diff([]uint32{151644, 872, 4294967295}, toks); diff != "" {
				t.Errorf("tokens (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokenizeErrors(t *testing.T) {
	tests := []struct {
		name    string
		req     TokenizeRequest
		status  int
		body    string
		wantErr func(error) bool
	}{
		{
			name: "invalid raw messages never sent", req: TokenizeRequest{Messages: json.RawMessage(`[{`)},
			wantErr: func(err error) bool { return strings.Contains(err.Error(), "messages is not valid json") },
		},
		{
			name: "http 400 is typed", status: 400, body: `{"error":{"message":"both set","code":400}}`,
			wantErr: func(err error) bool {
				var he *HTTPError
				return errors.As(err, &he) && he.Status == 400 && strings.Contains(he.Body, "both set")
			},
		},
		{name: "not json", status: 200, body: `<html>`, wantErr: func(err error) bool { return err != nil }},
		{name: "no tokens field", status: 200, body: `{"count":0}`, wantErr: func(err error) bool { return err != nil }},
		{name: "negative token", status: 200, body: `{"tokens":[-1]}`, wantErr: func(err error) bool { return err != nil }},
		{name: "token above uint32", status: 200, body: `{"tokens":[4294967296]}`, wantErr: func(err error) bool { return err != nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				called = true
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			_, err := New(ClientConfig{BaseURL: srv.URL}).Tokenize(context.Background(), tt.req)
			if err == nil || !tt.wantErr(err) {
				t.Fatalf("Tokenize err = %v; want a matching error", err)
			}
			if tt.status == 0 && called {
				t.Error("invalid request reached the server")
			}
		})
	}
}

func TestClientTimeoutAndCancel(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)

	c := New(ClientConfig{BaseURL: srv.URL, Timeout: 50 * time.Millisecond})
	if err := c.Health(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Health with slow server = %v; want deadline exceeded", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(ClientConfig{BaseURL: srv.URL}).Load(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Load with cancelled ctx = %v; want canceled", err)
	}
}

func TestHealth(t *testing.T) {
	for _, status := range []int{200, 503} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/health" {
				w.WriteHeader(404)
				return
			}
			w.WriteHeader(status)
		}))
		err := New(ClientConfig{BaseURL: srv.URL}).Health(context.Background())
		srv.Close()
		var he *HTTPError
		switch {
		case status == 200 && err != nil:
			t.Errorf("Health(200) = %v; want nil", err)
		case status != 200 && (!errors.As(err, &he) || he.Status != status):
			t.Errorf("Health(%d) = %v; want *HTTPError %d", status, err, status)
		}
	}
	// Nothing listening: vLLM still loading.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	if err := New(ClientConfig{BaseURL: url}).Health(context.Background()); err == nil {
		t.Error("Health with no server = nil; want error")
	}
}

const metricsNew = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 7.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="27306",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 1.2e+06
`

const metricsOld = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 4
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.875
`

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		want    Load
		wantErr bool
	}{
		{name: "current names summed over engines", status: 200, body: metricsNew,
			want: Load{Running: 5, Waiting: 7, KVUsage: 0.375, BlockSize: 16, NumGPUBlocks: 27306, Engines: 2}},
		{name: "old usage name", status: 200, body: metricsOld,
			want: Load{Running: 1, Waiting: 4, KVUsage: 0.875}},
		{name: "restart signals, as Python's client writes them", status: 200,
			body: "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{engine=\"0\"} 700\nvllm:prompt_tokens_total{engine=\"1\"} 300\n" +
				"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e9\nvllm:num_requests_running 0\n",
			want: Load{PromptTokens: 1000, StartTime: 1.7e9}},
		{name: "untyped samples", status: 200, body: "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n",
			want: Load{Running: 2, Waiting: 1}},
		{name: "not vllm", status: 200, body: "# TYPE go_goroutines gauge\ngo_goroutines 12\n", wantErr: true},
		{name: "not prometheus text", status: 200, body: "{\"hello\": 1}\n", wantErr: true},
		{name: "server error", status: 500, body: "boom", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" {
					w.WriteHeader(404)
					return
				}
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			got, err := New(ClientConfig{BaseURL: srv.URL}).Load(context.Background())
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Load = %+v; want error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Load (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseLoad(f *testing.F) {
	f.Add(metricsNew)
	f.Add(metricsOld)
	f.Add("vllm:num_requests_running{a=\"\\\"\"} NaN\n")
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseLoad(strings.NewReader(s))
		if err != nil && l != (Load{}) {
			t.Errorf("parseLoad error %v with non-zero load %+v", err, l)
		}
	})
}

func FuzzParseTokenize(f *testing.F) {
	f.Add([]byte(`{"count":2,"tokens":[1,2]}`))
	f.Add([]byte(`{"tokens":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		toks, err := parseTokenize(b)
		if err != nil && toks != nil {
			t.Errorf("parseTokenize error %v with tokens %v", err, toks)
		}
	})
}

func TestModels(t *testing.T) {
	// The shape of vLLM's ModelCard list: a base model, an alias, an adapter.
	const list = `{"object":"list","data":[
{"id":"qwen","object":"model","created":1,"owned_by":"vllm","root":"/m","parent":null,"max_model_len":4096,"permission":[]},
{"id":"alias","object":"model","created":1,"owned_by":"vllm","root":"/m","parent":null,"max_model_len":4096,"permission":[]},
{"id":"alice","object":"model","created":1,"owned_by":"vllm","root":"/loras/a","parent":"qwen","max_model_len":null,"permission":[]}]}`
	tests := []struct {
		name    string
		body    string
		want    []Model
		wantErr bool
	}{
		{"vllm list", list, []Model{{ID: "qwen"}, {ID: "alias"}, {ID: "alice", Parent: "qwen"}}, false},
		{"empty", `{"object":"list","data":[]}`, []Model{}, false},
		{"no data", `{"object":"list"}`, nil, true},
		{"entry without id", `{"data":[{"parent":null}]}`, nil, true},
		{"not json", `<html>`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/models" || r.Method != http.MethodGet {
					w.WriteHeader(404)
					return
				}
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			got, err := New(ClientConfig{BaseURL: srv.URL}).Models(context.Background())
			if (err != nil) != tt.wantErr || !cmp.Equal(got, tt.want) {
				t.Errorf("Models() = %v, %v; want %v (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func FuzzParseModels(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"m","parent":null},{"id":"a","parent":"m"}]}`))
	f.Add([]byte(`{"data":[{"id":""}]}`))
	f.Add([]byte(`{"data":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := parseModels(b)
		if err != nil && ms != nil {
			t.Errorf("parseModels error %v with models %v", err, ms)
		}
		for _, m := range ms {
			if m.ID == "" {
				t.Errorf("parseModels(%q) returned a model without an id", b)
			}
		}
	})
}
