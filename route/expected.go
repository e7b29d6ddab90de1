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
