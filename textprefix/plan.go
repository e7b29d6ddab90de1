package textprefix

// Plan is how to route one chat request.
type Plan struct {
	// Use is true when the request can be routed on Entry, which covers
	// its first K messages, without tokenizing it now. Otherwise the caller
	// tokenizes the whole prompt as before.
	Use   bool
	K     int
	Hash  Hash
	Entry Entry
	// Tokens estimates the prompt's length when Use: the entry's tokens
	// plus the rest of the messages at the entry's bytes per token.
	Tokens int
	// Learn lists the prefix lengths (message counts) to tokenize once
	// the request is on its way, so that later requests find them: the
	// whole conversation (its next turn starts with it), and all but the
	// last message unless that ends in an assistant turn (a shared system
	// prompt or document asked another question).
	Learn []int
}

// Plan decides how to route a chat whose messages are msgs and whose
// prefix hashes are hs (Chain). It routes on an entry only when what the
// entry does not cover is the newest message, possibly after the
// assistant turn that answered the entry's last message: such a tail is
// cached nowhere, or (the assistant's tokens) on the pod that holds the
// entry's prefix. Anything longer unknown might be cached on some other
// pod, and a guess would lose that hit; then the caller tokenizes. open
// says the last message is left open (continue_final_message): entries
// are learned with every message closed, so none covering it applies.
func (s *Store) Plan(hs []Hash, msgs []Message, open bool) Plan {
	n := len(msgs)
	var p Plan
	if n == 0 || len(hs) != n {
		return p
	}
	total := 0
	for _, m := range msgs {
		total += len(m.Raw)
	}
	if s.Trusted() {
		top := n
		if open {
			top = n - 1
		}
		for k := top; k >= max(1, n-2); k-- {
			if k == n-2 && !msgs[n-2].Assistant() {
				break
			}
			if e, ok := s.Get(hs[k-1]); ok {
				p = Plan{Use: true, K: k, Hash: hs[k-1], Entry: e, Tokens: estimate(e, total)}
				break
			}
		}
	}
	if n >= 2 && !msgs[n-2].Assistant() && !s.Has(hs[n-2]) {
		p.Learn = append(p.Learn, n-1)
	}
	if !s.Has(hs[n-1]) {
		p.Learn = append(p.Learn, n)
	}
	return p
}

// estimate is e's tokens plus the bytes beyond e's at e's bytes per token.
func estimate(e Entry, totalBytes int) int {
	rest := totalBytes - e.Bytes
	if rest <= 0 || e.Bytes <= 0 || e.Tokens <= 0 {
		return e.Tokens
	}
	return e.Tokens + (rest*e.Tokens+e.Bytes-1)/e.Bytes
}
