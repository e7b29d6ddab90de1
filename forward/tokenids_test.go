package forward

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/gin-gonic/gin"
	"github.com/rs/zerolog"
)

func TestAskTokenIDs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m"}`, `{"return_token_ids":true,"model":"m"}`},
		{` { "model":"m"}`, ` {"return_token_ids":true, "model":"m"}`},
		{`{}`, `{"return_token_ids":true}`},
		{`{ }`, `{"return_token_ids":true }`},
	} {
		got := string(askTokenIDs([]byte(tc.in)))
		if got != tc.want {
			t.Errorf("askTokenIDs(%s) = %s; want %s", tc.in, got, tc.want)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(got), &v); err != nil || v["return_token_ids"] != true {
			t.Errorf("askTokenIDs(%s) = %s: not an object with return_token_ids true (%v)", tc.in, got, err)
		}
	}
}

func TestTakeTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		name, in, want, prompt string
	}{
		{"answer", `{"id":"x","choices":[{"index":0,"message":{"content":"hi"},"token_ids":[5, 6]}],"usage":{},"prompt_token_ids":[1,2,3]}`,
			`{"id":"x","choices":[{"index":0,"message":{"content":"hi"},"token_ids":null}],"usage":{},"prompt_token_ids":null}`, `[1,2,3]`},
		{"sse", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"prompt_token_ids\":[7,8]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"token_ids\":[9]}]}\n\n",
			"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"prompt_token_ids\":null}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"token_ids\":null}]}\n\n", `[7,8]`},
		// The client's own text may spell the names: inside a string every
		// quote is escaped, so it is never a member name.
		{"in a string", `{"content":"say \"prompt_token_ids\":[1] and \\\"token_ids\":[2]","prompt_token_ids":[4]}`,
			`{"content":"say \"prompt_token_ids\":[1] and \\\"token_ids\":[2]","prompt_token_ids":null}`, `[4]`},
		{"null already", `{"prompt_token_ids":null,"choices":[{"token_ids":null}]}`, `{"prompt_token_ids":null,"choices":[{"token_ids":null}]}`, ``},
		{"not ids", `{"token_ids":{"a":1},"prompt_token_ids":[[1]]}`, `{"token_ids":{"a":1},"prompt_token_ids":[[1]]}`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, prompt := takeTokenIDs([]byte(tc.in), true)
			if string(out) != tc.want || string(prompt) != tc.prompt {
				t.Errorf("got %s, prompt %q\nwant %s, prompt %q", out, prompt, tc.want, tc.prompt)
			}
			kept, prompt2 := takeTokenIDs([]byte(tc.in), false)
			if string(kept) != tc.in || string(prompt2) != tc.prompt {
				t.Errorf("without strip: got %s, prompt %q; want the input and prompt %q", kept, prompt2, tc.prompt)
			}
		})
	}
}

// The tap gives the same bytes however the stream is cut into reads.
func TestTokenIDsTapAcrossReads(t *testing.T) {
	var in strings.Builder
	in.WriteString("data: {\"choices\":[],\"prompt_token_ids\":[")
	for i := range 5000 {
		if i > 0 {
			in.WriteByte(',')
		}
		fmt.Fprint(&in, i)
	}
	in.WriteString("]}\n\n")
	for i := range 20 {
		fmt.Fprintf(&in, "data: {\"choices\":[{\"token_ids\":[%d]}]}\n\n", i)
	}
	in.WriteString("data: [DONE]\n\n")
	want, wantIDs := takeTokenIDs([]byte(in.String()), true)
	for name, r := range map[string]io.Reader{
		"one byte": iotest.OneByteReader(strings.NewReader(in.String())),
		"halves":   iotest.HalfReader(strings.NewReader(in.String())),
		"whole":    strings.NewReader(in.String()),
	} {
		var ids []byte
		tap := newTokenIDsTap(io.NopCloser(r), true, func(b []byte) { ids = b })
		got, err := io.ReadAll(tap)
		if err != nil || !bytes.Equal(got, want) || !bytes.Equal(ids, wantIDs) {
			t.Errorf("%s: err %v, %d bytes (want %d), ids %d bytes (want %d)", name, err, len(got), len(want), len(ids), len(wantIDs))
		}
	}
}

// idsStub is a vLLM that answers a chat with its prompt's token ids when
// asked (return_token_ids), as a JSON answer or an SSE stream.
func idsStub(t *testing.T) (*httptest.Server, func() []map[string]any) {
	var mu sync.Mutex
	var bodies []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		bodies = append(bodies, req)
		mu.Unlock()
		ask := req["return_token_ids"] == true
		ids := func(v string) string {
			if ask {
				return v
			}
			return "null"
		}
		if req["gzip"] == true { // stands for any encoded answer: not looked into
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "x-test")
			fmt.Fprintf(w, `{"prompt_token_ids":%s}`, ids("[10,11,12]"))
			return
		}
		if req["stream"] == true {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"prompt_token_ids\":%s}\n\n", ids("[10,11,12]"))
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"token_ids\":%s}]}\n\n", ids("[13]"))
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"message":{"content":"ok"},"token_ids":%s}],"usage":{"prompt_tokens":3},"prompt_token_ids":%s}`, ids("[13]"), ids("[10,11,12]"))
	}))
	t.Cleanup(srv.Close)
	return srv, func() []map[string]any { mu.Lock(); defer mu.Unlock(); return slices.Clone(bodies) }
}

// A chat asks its engine for the prompt's token ids, hands them to the
// text prefixes, and the client gets what vLLM sends unasked (null); a
// client that asked gets them, one that said false is not overruled.
func TestChatLearnsTokenIDsFromTheAnswer(t *testing.T) {
	vllm, bodies := idsStub(t)
	u, _ := url.Parse(vllm.URL)
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey, cfg.Scheme = "a", u, "m", []byte("k"), perBlock
	h := New(cfg, &fakePeers{}, byteTokenizer{}, nil, zerolog.Nop())
	ft := &fakeText{keys: promptKeys(), afters: make(chan struct{}, 4)}
	h.SetTextPrefixes(ft, true)
	e := gin.New()
	h.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name, extra string
		sent        any // return_token_ids as the engine got it
		client      string
		ids         []uint32
	}{
		{"json", ``, true, `null`, []uint32{10, 11, 12}},
		{"stream", `,"stream":true`, true, `null`, []uint32{10, 11, 12}},
		{"client asked", `,"return_token_ids":true`, true, `[10,11,12]`, []uint32{10, 11, 12}},
		{"client declined", `,"return_token_ids":false`, false, `null`, nil},
		{"encoded answer", `,"gzip":true`, true, `[10,11,12]`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"u"}]`+tc.extra+`}`, nil)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			<-ft.afters
			all := bodies()
			if got := all[len(all)-1]["return_token_ids"]; got != tc.sent {
				t.Errorf("the engine got return_token_ids %v; want %v", got, tc.sent)
			}
			if !reflect.DeepEqual(ft.ids, tc.ids) {
				t.Errorf("after got ids %v; want %v", ft.ids, tc.ids)
			}
			if want := `"prompt_token_ids":` + tc.client; !bytes.Contains(b, []byte(want)) {
				t.Errorf("the client got %s; want it to hold %s", b, want)
			}
			if resp.StatusCode != 200 {
				t.Errorf("status %d", resp.StatusCode)
			}
			if cl := resp.ContentLength; cl >= 0 && cl != int64(len(b)) {
				t.Errorf("Content-Length %d for %d bytes", cl, len(b))
			}
		})
	}
}

// FuzzTakeTokenIDs: never panics, and on valid JSON the output is the
// input with every prompt_token_ids and token_ids array of numbers made
// null, and nothing else changed.
func FuzzTakeTokenIDs(f *testing.F) {
	f.Add([]byte(`{"choices":[{"token_ids":[1,2]}],"prompt_token_ids":[3]}`))
	f.Add([]byte(`{"a":"\"prompt_token_ids\":[1]","token_ids":[ 1 , 2 ]}`))
	f.Add([]byte(`{"prompt_token_ids":[1e3,-2.5],"x":{"token_ids":[]}}`))
	f.Add([]byte(`[{"token_ids":[[1]]},"token_ids",{"token_ids":null}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		out, _ := takeTokenIDs(b, true)
		if !json.Valid(in) {
			return
		}
		got, err := decodeNumbers(out)
		if err != nil {
			t.Fatalf("valid %s became invalid %s: %v", in, out, err)
		}
		want, _ := decodeNumbers(in)
		want = nullIDs(want)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s became %s; want %v", in, out, want)
		}
	})
}

// nullIDs is what takeTokenIDs does, on decoded JSON.
func nullIDs(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if arr, ok := e.([]any); ok && (k == "prompt_token_ids" || k == "token_ids") && allNumbers(arr) {
				x[k] = nil
				continue
			}
			x[k] = nullIDs(e)
		}
	case []any:
		for i, e := range x {
			x[i] = nullIDs(e)
		}
	}
	return v
}

func decodeNumbers(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func allNumbers(arr []any) bool {
	for _, e := range arr {
		if _, ok := e.(json.Number); !ok {
			return false
		}
	}
	return true
}
