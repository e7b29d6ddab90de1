package prompt

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// member is a top-level member of a body, raw.
type member struct{ key, val []byte }

func topMembers(body []byte) ([]member, bool) {
	var ms []member
	err := scanObject(body, func(k, v []byte) error {
		ms = append(ms, member{k, v})
		return nil
	})
	return ms, err == nil
}

// rebuild is a body of ms in their order; with late, the members a
// conversion reads in the scan have a name escaped, which the scan does
// not offer it (scanObjectTaking's take), so it converts them after.
func rebuild(ms []member, late bool) []byte {
	b := []byte{'{'}
	for i, m := range ms {
		if i > 0 {
			b = append(b, ',')
		}
		k := m.key
		switch string(k) {
		case "messages", "system", "input":
			if late {
				k = append([]byte(`\u00`+fmt.Sprintf("%x", k[0])), k[1:]...)
			}
		}
		b = append(append(append(append(b, '"'), k...), `":`...), m.val...)
	}
	return append(b, '}')
}

// sameConversion: converting in the scan gives what converting after it
// gives (the conversion that was there before it), in either order of a
// body's members: the system prompt or instructions before or after the
// messages, which the one made in the scan puts first afterwards.
func sameConversion(t *testing.T, body []byte, api API) {
	ms, ok := topMembers(body)
	if !ok {
		return
	}
	rev := make([]member, len(ms))
	for i, m := range ms {
		rev[len(ms)-1-i] = m
	}
	seen, dup := map[string]bool{}, false
	for _, m := range ms {
		dup = dup || seen[string(key(m.key))]
		seen[string(key(m.key))] = true
	}
	var first Prompt
	var firstErr error
	for i, order := range [][]member{ms, rev} {
		now, nowErr := ParseAPI(rebuild(order, false), api)
		after, afterErr := ParseAPI(rebuild(order, true), api)
		if fmt.Sprint(nowErr) != fmt.Sprint(afterErr) {
			t.Fatalf("ParseAPI(%s, %v) error %v; converted after the scan %v", rebuild(order, false), api, nowErr, afterErr)
		}
		now.Raw, after.Raw = nil, nil
		if diff := cmp.Diff(after, now, rawString); diff != "" {
			t.Fatalf("ParseAPI(%s, %v) converted in the scan (+) and after it (-):\n%s", rebuild(order, false), api, diff)
		}
		if i == 0 {
			first, firstErr = now, nowErr
		} else if !dup && (fmt.Sprint(nowErr) != fmt.Sprint(firstErr) || !cmp.Equal(first, now, rawString)) {
			t.Fatalf("ParseAPI(%s, %v) = %v; its members reversed: %v\n%s", body, api, firstErr, nowErr, cmp.Diff(first, now, rawString))
		}
	}
}

var rawString = cmp.Transformer("string", func(b json.RawMessage) string { return string(b) })

// conversionBodies are bodies whose conversion has an order to get right:
// inline system messages (leading, kept in place, folded without a system
// prompt), images before and after the instructions are put first, tools
// after the messages.
func conversionBodies() []string {
	img := `{"type":"image","source":{"type":"url","url":"u"}}`
	return []string{claudeCode, agentsSDK, string(claudeCodeBody(8 << 10)), string(agentsBody(8 << 10)),
		anthropic(`[{"role":"system","content":"S"},{"role":"user","content":[`+img+`,{"type":"text","text":"Q"}]}]`, `"system":"P"`),
		anthropic(`[{"role":"user","content":"Q"},{"role":"system","content":"S"},{"role":"assistant","content":"A"}]`),
		anthropic(`[{"role":"user","content":[`+img+`]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"B","input":{"x":"\"q\""}}]},{"role":"system","content":"S"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]`, `"system":[{"type":"text","text":"P"}]`),
		anthropic(`[{"role":"user","content":[`+img+`]},{"role":"bot","content":"x"}]`, `"system":"P"`, `"tools":[{"name":"T","input_schema":{"properties":{}}}]`),
		anthropic(`[{"role":"user","content":[{"type":"text","text":5}]}]`, `"system":"P"`),
		anthropic(`[{"role":"user","content":"Q"}]`, `"system":[{"type":"text","text":"x-anthropic-billing-header: h"}]`, `"tools":[{"name":"T"}]`),
		`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}],"instructions":"I","tools":[{"type":"function","name":"f"}]}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c"}],"instructions":"I","tools":5}`,
		`{"input":[],"instructions":"I","tools":[]}`,
		`{"input":[{"role":"user","content":"Q"}],"instructions":""}`,
	}
}

func TestConvertInScan(t *testing.T) {
	for _, body := range conversionBodies() {
		for _, api := range []API{APIMessages, APIResponses} {
			sameConversion(t, []byte(body), api)
		}
	}
}

// The messages cannot be appended to over the tools written after them.
func TestMessagesThenTools(t *testing.T) {
	for _, tt := range []struct {
		body string
		api  API
	}{
		{anthropic(`[{"role":"user","content":"Q"}]`, `"tools":[{"name":"T","input_schema":{}}]`), APIMessages},
		{`{"input":[{"role":"user","content":"Q"}],"tools":[{"type":"function","name":"f"}]}`, APIResponses},
	} {
		p, err := ParseAPI([]byte(tt.body), tt.api)
		if err != nil || p.Tools == nil {
			t.Fatalf("ParseAPI(%s) = %+v, %v", tt.body, p, err)
		}
		tools := string(p.Tools)
		_ = append(p.Messages, strings.Repeat("x", 64)...)
		if string(p.Tools) != tools {
			t.Errorf("ParseAPI(%s): appending to Messages changed Tools to %s", tt.body, p.Tools)
		}
	}
}

// TestConvertInScanDepth: a conversion made in the scan holds the values
// it walks to the scanner's nesting limit, which is encoding/json's.
func TestConvertInScanDepth(t *testing.T) {
	for _, n := range []int{9993, 9994, 9995, 9996, 9997, 9998} {
		nest := strings.Repeat("[", n) + strings.Repeat("]", n)
		for _, tt := range []struct {
			body string
			api  API
		}{
			{anthropic(`[{"role":"user","content":[{"type":"text","text":"x","citations":` + nest + `}]}]`), APIMessages},
			{anthropic(`[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","x":` + nest + `}]}]}]`), APIMessages},
			{`{"input":[{"role":"user","content":"x","x":` + nest + `}]}`, APIResponses},
		} {
			_, err := ParseAPI([]byte(tt.body), tt.api)
			if valid := json.Valid([]byte(tt.body)); errors.Is(err, ErrBadJSON) == valid {
				t.Errorf("depth %d, %v: ParseAPI error %v; encoding/json valid %v", n, tt.api, err, valid)
			}
		}
	}
}

// FuzzConvertInScan: a conversion made in the scan is the one made after
// it, whatever the body.
func FuzzConvertInScan(f *testing.F) {
	for _, s := range conversionBodies() {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9"}]}] ,"max_tokens":1,"model":"m"}`), true)
	f.Add([]byte(`{"input":[{"type":"reasoning","summary":[{"text":"s"}]}],"instructions":"i"}`), false)
	f.Fuzz(func(t *testing.T, body []byte, messages bool) {
		api := APIResponses
		if messages {
			api = APIMessages
		}
		sameConversion(t, body, api)
	})
}
