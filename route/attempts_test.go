package route

import (
	"cmp"
	"fmt"
	"math/rand/v2"
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

// TestAttemptsOrder checks the selection against the rule it implements,
// written as a sort of every candidate, on random decisions: ties of
// load, peers over the bound, a local pod eligible or not, chosen or not.
func TestAttemptsOrder(t *testing.T) {
	sorted := func(d Decision, max int) []string {
		var local *Candidate
		var next []Candidate
		for i := range d.Candidates {
			c := &d.Candidates[i]
			switch {
			case c.Local:
				local = c
			case c.Eligible && c.ID != d.Target:
				next = append(next, *c)
			}
		}
		localOK := local != nil && local.Eligible
		var out []string
		if d.Target != "" {
			out = append(out, d.Target)
			localOK = localOK && !d.Local
		}
		slices.SortStableFunc(next, func(a, b Candidate) int {
			if a.Over != b.Over {
				if a.Over {
					return 1
				}
				return -1
			}
			return cmp.Or(cmp.Compare(a.Load, b.Load), cmp.Compare(a.ID, b.ID))
		})
		room := max
		if localOK {
			room--
		}
		for _, c := range next {
			if len(out) >= room {
				break
			}
			if c.Over && localOK && !d.Local {
				continue
			}
			out = append(out, c.ID)
		}
		if local != nil && ((localOK && len(out) < max) || len(out) == 0) {
			out = append(out, local.ID)
		}
		return out
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for n := range 2000 {
		var d Decision
		peers := 1 + rng.IntN(12)
		for i := range peers {
			d.Candidates = append(d.Candidates, Candidate{ID: fmt.Sprintf("p%02d", rng.IntN(40)),
				Local: i == 0 && rng.IntN(4) > 0, Eligible: rng.IntN(5) > 0,
				Load: float64(rng.IntN(4)), Over: rng.IntN(4) == 0})
		}
		if k := rng.IntN(peers + 1); k < peers && d.Candidates[k].Eligible {
			d.Target, d.Local = d.Candidates[k].ID, d.Candidates[k].Local
		}
		max := rng.IntN(5)
		want := sorted(d, cmp.Or(max, 1))
		if got := Attempts(d, max); !slices.Equal(got, want) {
			t.Fatalf("case %d: Attempts(%+v, %d) = %v; want %v", n, d, max, got, want)
		}
	}
}
