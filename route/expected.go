package route

// Expected returns the tokens the decision predicts cached at its target.
func (d Decision) Expected() int {
	for _, c := range d.Candidates {
		if c.Chosen {
			return c.MatchedTokens
		}
	}
	return 0
}

// HeldAt returns the routing keys the decision found at candidate id (the
// local candidate for id ""), 0 when it does not list it: what a claim on
// id need not repeat (ClaimsFor).
func (d Decision) HeldAt(id string) int {
	if c := d.candidate(id); c != nil {
		return c.MatchedKeys
	}
	return 0
}

// candidate is the listed candidate id (the local one for id ""), or nil.
func (d *Decision) candidate(id string) *Candidate {
	for i := range d.Candidates {
		if c := &d.Candidates[i]; c.ID == id || (id == "" && c.Local) {
			return c
		}
	}
	return nil
}
