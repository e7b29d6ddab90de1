package route

import (
	"slices"
	"testing"
)

func TestAttempts(t *testing.T) {
	cands := func(localEligible bool, chosen string) []Candidate {
		cs := []Candidate{
			{ID: "a", Local: true, Eligible: localEligible, Load: 0},
			{ID: "p", Eligible: true, Load: 1},
			{ID: "q", Eligible: true, Over: true, Load: 9},
			{ID: "r", Eligible: true, Load: 3},
			{ID: "s", Eligible: false, Excluded: "engine down"},
			{ID: "t", Eligible: true, Load: 3},
		}
		for i := range cs {
			cs[i].Chosen = cs[i].ID == chosen
		}
		return cs
	}
	tests := []struct {
		name string
		d    Decision
		max  int
		want []string
	}{
		{"peer chosen, local serves: best peers, local last", Decision{Target: "p", Candidates: cands(true, "p")}, 3, []string{"p", "r", "a"}},
		{"ties by ID", Decision{Target: "p", Candidates: cands(true, "p")}, 4, []string{"p", "r", "t", "a"}},
		{"a full peer only when local cannot serve", Decision{Target: "p", Candidates: cands(true, "p")}, 9, []string{"p", "r", "t", "a"}},
		{"local down: peers take its place, full ones last", Decision{Target: "p", Candidates: cands(false, "p")}, 4, []string{"p", "r", "t", "q"}},
		{"local chosen: peers after it", Decision{Target: "a", Local: true, Candidates: cands(true, "a")}, 3, []string{"a", "p", "r"}},
		{"one attempt", Decision{Target: "p", Candidates: cands(true, "p")}, 1, []string{"p"}},
		{"nobody eligible: local answers", Decision{Reason: ReasonNone, Candidates: []Candidate{{ID: "a", Local: true}, {ID: "s"}}}, 3, []string{"a"}},
		{"no candidates", Decision{Reason: ReasonNone}, 3, nil},
	}
	for _, tt := range tests {
		if got := Attempts(tt.d, tt.max); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Attempts = %v; want %v", tt.name, got, tt.want)
		}
	}
}
