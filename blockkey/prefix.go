package blockkey

// Prefix is a prompt prefix's place in the key chain: its routing keys and
// what it takes to key a prompt that continues it without its tokens. A
// conversation's next turn is its previous turns plus new messages, so
// the keys of the whole can be had by hashing only the new tokens.
type Prefix struct {
	// Keys are Request's keys of the prefix alone.
	Keys []Key
	// Tokens is the prefix's length.
	Tokens int
	// Last is the key of the last full block (the root when there is none);
	// Tail the tokens after it, fewer than BlockSize.
	Last Key
	Tail []uint32
}

// Prefix returns the place of tokens in the chain from root.
func (s Scheme) Prefix(root Key, tokens []uint32) Prefix {
	return s.Continue(Prefix{Last: root}, tokens)
}

// Continue returns the place of p's tokens followed by tokens: its Keys
// are those Request returns for the whole (they start with p.Keys), so
// that a prompt keyed in two steps routes exactly as one keyed at once.
// p is not modified; the result shares no memory with it or tokens.
func (s Scheme) Continue(p Prefix, tokens []uint32) Prefix {
	bs := s.BlockSize
	if bs < 1 {
		return Prefix{Tokens: p.Tokens + len(tokens)}
	}
	n := p.Tokens + len(tokens)
	full := p.Tokens / bs // blocks already hashed: p.Last is block full-1
	all := tokens
	if len(p.Tail) > 0 {
		all = append(append(make([]uint32, 0, len(p.Tail)+len(tokens)), p.Tail...), tokens...)
	}
	// Request keys the first (n-1)/bs blocks (vLLM recomputes the last
	// token); p.Keys stop at (p.Tokens-1)/bs, which is one block short
	// of full when p ends on a block boundary.
	limit, from := reqBlocks(n, bs), reqBlocks(p.Tokens, bs)
	keys := make([]Key, len(p.Keys), len(p.Keys)+max(limit-from, 0)/s.stride()+1)
	copy(keys, p.Keys)
	if from < full && from < limit && s.Routed(from) {
		keys = append(keys, p.Last)
	}
	k := p.Last
	i := 0
	for ; (i+1)*bs <= len(all); i++ {
		k = Next(k, all[i*bs:(i+1)*bs])
		if pos := full + i; pos < limit && s.Routed(pos) {
			keys = append(keys, k)
		}
	}
	var tail []uint32
	if r := all[i*bs:]; len(r) > 0 {
		tail = append([]uint32(nil), r...)
	}
	return Prefix{Keys: keys, Tokens: n, Last: k, Tail: tail}
}

// reqBlocks is how many blocks of an n-token prompt Request keys.
func reqBlocks(n, bs int) int {
	if n < 2 {
		return 0
	}
	return (n - 1) / bs
}
