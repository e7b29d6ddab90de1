package forward

import (
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
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
		{in: `[{"role":"user"},]`, bad: true},
		{in: `[{"role":"user"} {"role":"user"}]`, bad: true},
		{in: `[{"role":}]`, bad: true},
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
			if string(m.Raw) != tc.raws[i] || m.Assistant != tc.assistant[i] {
				t.Errorf("%q: message %d = %q assistant %v", tc.in, i, m.Raw, m.Assistant)
			}
		}
	}
}

// FuzzSplitMessages: on any bytes, splitMessages agrees with encoding/json
// on whether they are an array and on its elements.
func FuzzSplitMessages(f *testing.F) {
	for _, s := range []string{`[]`, `[{"role":"user","content":"hi"}]`, `[1,"2",[3],{"a":{}}]`, `[{"role":"assistant"},null]`, `[`, `[,]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := splitMessages(b)
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
	afters chan struct{}
}

func (f *fakeText) Keys(_ context.Context, p Prompt, msgs []textprefix.Message) ([]blockkey.Key, int, func()) {
	f.msgs = len(msgs)
	return f.keys, 200, func() { f.afters <- struct{}{} }
}

// A chat goes through the text prefixes, whose keys route it, and after
// runs once it was served; completions keep their own path.
func TestTextPrefixesRouteChats(t *testing.T) {
	a, b := holderPair(t)
	ft := &fakeText{keys: promptKeys(), afters: make(chan struct{}, 4)}
	a.h.SetTextPrefixes(ft)
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
