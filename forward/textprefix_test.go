package forward

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
)

func TestSplitMessages(t *testing.T) {
	for _, tc := range []struct {
		in        string
		raws      []string
		assistant []bool
		bad       bool
	}{
		{in: `[]`},
		{in: ` [ {"role":"system","content":"s"} , {"content":"a","role":"assistant"},{"role":"user","content":[{"type":"text","text":"u"}]} ] `,
			raws:      []string{`{"role":"system","content":"s"}`, `{"content":"a","role":"assistant"}`, `{"role":"user","content":[{"type":"text","text":"u"}]}`},
			assistant: []bool{false, true, false}},
		{in: `[{"role": "assistant"}]`, raws: []string{`{"role": "assistant"}`}, assistant: []bool{true}},
		{in: `["not an object", 3]`, raws: []string{`"not an object"`, `3`}, assistant: []bool{false, false}},
		{in: `[{"role":"assistant_x"}]`, raws: []string{`{"role":"assistant_x"}`}, assistant: []bool{false}},
		{in: `{"role":"user"}`, bad: true},
		{in: `[{"role":"user"}`, bad: true},
		{in: `[{"role":"user"}] x`, bad: true},
		{in: `[{"role":"user","content":"unterminated}]`, bad: true},
		{in: `[{"role":"a\"ssistant","content":"\\"},true , 1.5e3,null]`,
			raws:      []string{`{"role":"a\"ssistant","content":"\\"}`, `true`, `1.5e3`, `null`},
			assistant: []bool{false, false, false, false}},
		{in: `[{"content":{"role":"assistant"},"role":"user"}]`, raws: []string{`{"content":{"role":"assistant"},"role":"user"}`}, assistant: []bool{false}},
		{in: ``, bad: true},
	} {
		got, err := splitMessages([]byte(tc.in))
		if (err != nil) != tc.bad {
			t.Errorf("%q: err %v, want bad %v", tc.in, err, tc.bad)
			continue
		}
		if len(got) != len(tc.raws) {
			t.Errorf("%q: %d messages, want %d", tc.in, len(got), len(tc.raws))
			continue
		}
		for i, m := range got {
			if string(m.Raw) != tc.raws[i] || m.Assistant() != tc.assistant[i] {
				t.Errorf("%q: message %d = %q assistant %v", tc.in, i, m.Raw, m.Assistant())
			}
		}
	}
}

// FuzzSplitMessages: on valid JSON, splitMessages agrees with
// encoding/json on whether it is an array and on its elements; on any
// bytes it does not panic.
func FuzzSplitMessages(f *testing.F) {
	for _, s := range []string{`[]`, `[{"role":"user","content":"hi"}]`, `[1,"2",[3],{"a":{}}]`, `[{"role":"assistant"},null]`, `[`, `[,]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := splitMessages(b)
		if !json.Valid(b) || string(bytes.TrimSpace(b)) == "null" { // ParsePrompt drops a null
			return
		}
		var std []json.RawMessage
		stdErr := json.Unmarshal(b, &std)
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("%q: splitMessages err %v, encoding/json err %v", b, err, stdErr)
		}
		if err != nil {
			return
		}
		if len(got) != len(std) {
			t.Fatalf("%q: %d elements, encoding/json %d", b, len(got), len(std))
		}
		for i := range got {
			if string(got[i].Raw) != string(std[i]) {
				t.Fatalf("%q: element %d %q, encoding/json %q", b, i, got[i].Raw, std[i])
			}
		}
	})
}

// fakeText routes every chat on fixed keys and records the calls.
type fakeText struct {
	keys   []blockkey.Key
	msgs   int
	ids    []uint32
	afters chan struct{}
}

func (f *fakeText) Keys(_ context.Context, p prompt.Prompt, msgs []textprefix.Message, _ blockkey.Key) ([]blockkey.Key, int, func([]uint32)) {
	f.msgs = len(msgs)
	return f.keys, 200, func(ids []uint32) { f.ids = ids; f.afters <- struct{}{} }
}

// A chat goes through the text prefixes, whose keys route it, and after
// runs once it was served; completions keep their own path.
func TestTextPrefixesRouteChats(t *testing.T) {
	a, b := holderPair(t)
	ft := &fakeText{keys: promptKeys(), afters: make(chan struct{}, 4)}
	a.h.SetTextPrefixes(ft, false)
	resp := post(t, a.srv.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`, nil)
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get(ServedByHeader) != "b" || ft.msgs != 2 {
		t.Fatalf("status %d served by %q, %d messages seen; want 200 from b (the keys' holder), 2", resp.StatusCode, resp.Header.Get(ServedByHeader), ft.msgs)
	}
	select {
	case <-ft.afters:
	default:
		t.Fatal("after was not called once the request was served")
	}
	_ = b
	resp = post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"x"}`, nil)
	io.Copy(io.Discard, resp.Body)
	if len(ft.afters) != 0 {
		t.Fatal("a completions request went through the text prefixes")
	}
}

// BenchmarkSplitMessages: the front's extra pass over a chat's messages
// (a 32k-token conversation is ~160 KB of JSON).
func BenchmarkSplitMessages(b *testing.B) {
	for _, kb := range []int{5, 40, 160} {
		content := make([]byte, kb<<10)
		for i := range content {
			content[i] = "abcd efg"[i%8]
		}
		raw, _ := json.Marshal([]map[string]string{{"role": "system", "content": string(content)}, {"role": "user", "content": "q"}})
		b.Run(fmt.Sprintf("%dKB", kb), func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, err := splitMessages(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
