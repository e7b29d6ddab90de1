package vllmclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRenderParsesEveryShape(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []Rendered
	}{
		{"one, no features", `{"request_id":"x","token_ids":[1,2,3],"features":null}`, []Rendered{{Tokens: []uint32{1, 2, 3}}}},
		{"batch", `[{"token_ids":[1]},{"token_ids":[2,3]}]`, []Rendered{{Tokens: []uint32{1}}, {Tokens: []uint32{2, 3}}}},
		{"lists", `{"token_ids":[9],"features":{"mm_hashes":["a","b"],"mm_placeholders":[{"offset":3,"length":4},{"offset":10,"length":4}]}}`,
			[]Rendered{{Tokens: []uint32{9}, MM: []MMItem{{"a", 3, 4}, {"b", 10, 4}}}}},
		{"by modality", `{"token_ids":[9],"features":{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":3,"length":4}]},"kwargs_data":null}}`,
			[]Rendered{{Tokens: []uint32{9}, MM: []MMItem{{"a", 3, 4}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRendered([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatal(d)
			}
		})
	}
	for _, bad := range []string{`{}`, `[{"token_ids":[1]},{}]`, `{"token_ids":[1],"features":{"mm_hashes":["a"]}}`, `nope`} {
		if _, err := parseRendered([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// The body reaches the engine byte for byte, and a missing endpoint is
// ErrNoRender, not a failure to route on.
func TestRenderRawBodyAndAbsence(t *testing.T) {
	const body = `{"model":"m","tools":[{"z":1,"a":2}],  "messages":[]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/messages/render" {
			http.NotFound(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		if string(b) != body {
			t.Errorf("engine got %q", b)
		}
		io.WriteString(w, `{"token_ids":[5,6]}`)
	}))
	defer srv.Close()
	c := New(ClientConfig{BaseURL: srv.URL})
	got, err := c.Render(context.Background(), "/v1/messages/render", []byte(body))
	if err != nil || len(got) != 1 || len(got[0].Tokens) != 2 {
		t.Fatalf("render: %v %v", got, err)
	}
	if _, err := c.Render(context.Background(), "/v1/responses/render", []byte(body)); !errors.Is(err, ErrNoRender) {
		t.Fatalf("absent endpoint: %v, want ErrNoRender", err)
	}
}

func FuzzParseRendered(f *testing.F) {
	for _, s := range []string{`{"token_ids":[1]}`, `[{"token_ids":[1]}]`, `{"token_ids":[9],"features":{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":3,"length":4}]}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := parseRendered(b)
		if err == nil {
			for _, r := range out {
				if r.Tokens == nil {
					t.Fatal("nil tokens without an error")
				}
			}
		}
	})
}
