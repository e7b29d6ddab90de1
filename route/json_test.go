package route

import (
	"encoding/json"
	"regexp"
	"testing"
)

// TestDecisionJSONNames: /debug/route and /debug/peers print these types
// as they are, so every field needs a snake_case name, like the rest of
// the admin surface.
func TestDecisionJSONNames(t *testing.T) {
	d := Decision{Target: "pod2", Reason: ReasonAffinity, Bound: 4, Mean: 1, Eligible: 2, Note: "n",
		Candidates: []Candidate{{ID: "pod2", Eligible: true, MatchedKeys: 3, Excluded: "x", Note: "recent"}}}
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	for _, v := range []any{d, Load{Running: 1, Fronted: true}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var walk func(any)
		walk = func(x any) {
			switch x := x.(type) {
			case map[string]any:
				for k, e := range x {
					if !snake.MatchString(k) {
						t.Errorf("%s: key %q is not snake_case", b, k)
					}
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			}
		}
		var m any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		walk(m)
	}
	b, _ := json.Marshal(d)
	var back Decision
	if err := json.Unmarshal(b, &back); err != nil || back.Candidates[0].MatchedKeys != 3 || back.Target != "pod2" {
		t.Errorf("round trip of %s = %+v, %v", b, back, err)
	}
}
