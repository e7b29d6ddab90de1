package baseline

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// chunked reads b in pieces of n bytes.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := min(c.n, len(p), len(c.b))
	copy(p, c.b[:k])
	c.b = c.b[k:]
	return k, nil
}

func (c *chunked) Close() error { return nil }

func TestIDTap(t *testing.T) {
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_s\",\"status\":\"in_progress\"}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
	tests := []struct {
		name string
		sse  bool
		body string
		want string
	}{
		{"json", false, `{"id":"resp_j","object":"response","output":[]}`, "resp_j"},
		{"json id after other members", false, `{"object":"response","usage":{"id":"inner"},"id":"resp_k"}`, "resp_k"},
		{"json without id", false, `{"object":"response"}`, ""},
		{"not an object", false, `["id"]`, ""},
		{"stream", true, stream, "resp_s"},
		{"stream with CRLF", true, strings.ReplaceAll(stream, "\n", "\r\n"), "resp_s"},
		{"stream of another API", true, "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\"}}\n\n", ""},
	}
	for _, tt := range tests {
		for _, n := range []int{1, 3, 1 << 20} {
			t.Run(fmt.Sprintf("%s/%d", tt.name, n), func(t *testing.T) {
				var got string
				tap := &idTap{rc: &chunked{b: []byte(tt.body), n: n}, sse: tt.sse, found: func(id string) { got = id }}
				out, err := io.ReadAll(tap)
				if err != nil || string(out) != tt.body {
					t.Fatalf("read %q, %v; want the body unchanged", out, err)
				}
				if got != tt.want {
					t.Errorf("found %q; want %q", got, tt.want)
				}
			})
		}
	}
}

// The id is reported before the reads past it: the client cannot have
// seen the whole answer, and so cannot send its follow-up, before the
// proxy knows the owner.
func TestIDTapReportsBeforeTheRest(t *testing.T) {
	body := `{"id":"resp_1","output":[` + strings.Repeat(`{"type":"message"},`, 100) + `{}]}`
	var got string
	tap := &idTap{rc: &chunked{b: []byte(body), n: 16}, found: func(id string) { got = id }}
	buf := make([]byte, 16)
	read := 0
	for got == "" {
		n, err := tap.Read(buf)
		read += n
		if err != nil {
			t.Fatalf("no id after %d bytes: %v", read, err)
		}
	}
	if got != "resp_1" || read > 32 {
		t.Errorf("found %q after %d bytes; want resp_1 within the first two reads", got, read)
	}
}

func FuzzIDTap(f *testing.F) {
	f.Add([]byte(`{"id":"resp_1","x":[1,{"id":2}]}`), false, uint8(3))
	f.Add([]byte("data: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n"), true, uint8(1))
	f.Add([]byte(`{"x":"\"id\"","id":7}`), false, uint8(2))
	f.Fuzz(func(t *testing.T, body []byte, sse bool, n uint8) {
		var got []string
		tap := &idTap{rc: &chunked{b: body, n: int(n%64) + 1}, sse: sse, found: func(id string) { got = append(got, id) }}
		out, _ := io.ReadAll(tap)
		if string(out) != string(body) {
			t.Fatalf("body changed")
		}
		if len(got) > 1 {
			t.Fatalf("found %d ids", len(got))
		}
		if sse || len(body) > maxIDPrefix {
			return
		}
		// A JSON object encoding/json reads, with a top-level string id:
		// the tap finds that id, however the body is cut.
		var v struct {
			ID *string `json:"id"`
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil || json.Unmarshal(body, &v) != nil || v.ID == nil || *v.ID == "" {
			return
		}
		if strings.Count(string(body), `"id"`) > 1 || strings.Contains(string(body), `\u`) {
			return // duplicate or escaped keys: Go keeps the last, the tap the first
		}
		if len(got) != 1 || got[0] != *v.ID {
			t.Errorf("found %q; want %q", got, *v.ID)
		}
	})
}

func TestOwnersBounded(t *testing.T) {
	o := newOwners(2)
	o.put("a", 0)
	o.put("b", 1)
	o.put("a", 2) // an update keeps its place
	o.put("c", 1) // forgets the oldest, a
	if _, ok := o.get("a"); ok {
		t.Error("a kept past the bound")
	}
	for id, want := range map[string]int{"b": 1, "c": 1} {
		if got, ok := o.get(id); !ok || got != want {
			t.Errorf("get(%s) = %d, %v; want %d", id, got, ok, want)
		}
	}
}

// responsesPod answers /v1/responses as a pod with vLLM's store: ids it
// created are known, any other previous_response_id or stored path is 404.
func responsesPod(t *testing.T, name string, stream bool) Backend {
	var n atomic.Int32
	var mu sync.Mutex
	known := map[string]bool{}
	return fakePod(t, name, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		var q struct {
			Previous string `json:"previous_response_id"`
		}
		json.NewDecoder(r.Body).Decode(&q)
		if id, ok := storedID(r.URL.Path); ok {
			q.Previous = id
		}
		if q.Previous != "" && !known[q.Previous] {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found."}}`, q.Previous)
			return
		}
		if r.URL.Path != "/v1/responses" {
			fmt.Fprintf(w, `{"id":%q,"status":"completed"}`, q.Previous)
			return
		}
		id := fmt.Sprintf("resp_%s_%d", name, n.Add(1))
		known[id] = true
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q}}\n\n", id)
			fmt.Fprint(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed"}`, id)
	})
}

// Whatever the policy, a request about a stored response goes to the pod
// that created it: previous_response_id, GET and cancel.
func TestProxyRoutesStoredResponses(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p, err := New(Config{Policy: NameRoundRobin, Model: "m", Backends: []Backend{
				responsesPod(t, "pod1", stream), responsesPod(t, "pod2", stream), responsesPod(t, "pod3", stream)}})
			if err != nil {
				t.Fatal(err)
			}
			srv := newServer(t, p)
			do := func(method, path, body string) (string, string, int) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, method, srv+path, strings.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				id := ""
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					line := strings.TrimPrefix(sc.Text(), "data: ")
					var v struct {
						ID       string `json:"id"`
						Response struct {
							ID string `json:"id"`
						} `json:"response"`
					}
					if json.Unmarshal([]byte(line), &v) == nil && id == "" {
						id = v.ID + v.Response.ID
					}
				}
				return resp.Header.Get(ServedByHeader), id, resp.StatusCode
			}
			first, id, _ := do(http.MethodPost, "/v1/responses", `{"model":"m","input":"hi","store":true}`)
			if id == "" {
				t.Fatal("no response id")
			}
			for i := range 4 { // round-robin would move every one of them
				body := fmt.Sprintf(`{"model":"m","input":"more %d","previous_response_id":%q}`, i, id)
				served, next, status := do(http.MethodPost, "/v1/responses", body)
				if served != first || status != 200 {
					t.Fatalf("follow-up %d served by %s with %d; want %s, which holds %s", i, served, status, first, id)
				}
				id = next
			}
			for _, path := range []string{"/v1/responses/" + id, "/v1/responses/" + id + "/cancel"} {
				method := http.MethodGet
				if strings.HasSuffix(path, "cancel") {
					method = http.MethodPost
				}
				if served, _, status := do(method, path, ""); served != first || status != 200 {
					t.Errorf("%s %s served by %s with %d; want %s", method, path, served, status, first)
				}
			}
			if got := p.Stats()[podIndex(first)].Stored; got != 6 {
				t.Errorf("Stored = %d at %s; want 6", got, first)
			}
			// An id nobody created goes by the policy, and its pod says 404.
			if _, _, status := do(http.MethodPost, "/v1/responses", `{"input":"x","previous_response_id":"resp_nobody"}`); status != http.StatusNotFound {
				t.Errorf("unknown id: status %d; want the pod's 404", status)
			}
		})
	}
}

func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func podIndex(name string) int {
	var i int
	fmt.Sscanf(name, "pod%d", &i)
	return i - 1
}
