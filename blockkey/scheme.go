package blockkey

// Scheme is the routing granularity: which chained keys a digest carries
// and a request looks up. Peers compare keys only when their Schemes are
// equal (and Version matches).
type Scheme struct {
	// BlockSize is tokens per vLLM block; it must equal vLLM's block_size
	// (default 16) or no key will match what the index holds.
	BlockSize int
	// Stride is the number of vLLM blocks per routing key: only every
	// Stride-th block position carries a key. Default 4 (DefaultScheme).
	// A larger Stride shrinks digests Stride times at the cost of routing
	// resolution: BlockSize 16, Stride 4 gives one key per 64 tokens.
	// Values below 1 are read as 1.
	Stride int
}

// DefaultScheme is vLLM's default block size with one routing key per 4
// blocks (64 tokens, as llm-d's precise configuration routes): a quarter of
// the digest bytes and of the choice's cost per peer, for at most 63 tokens
// of prefix left unpredicted per request.
func DefaultScheme() Scheme { return Scheme{BlockSize: 16, Stride: 4} }

func (s Scheme) stride() int { return max(s.Stride, 1) }

// TokensPerKey is the number of prompt tokens one routing key covers.
func (s Scheme) TokensPerKey() int { return s.BlockSize * s.stride() }

// Routed reports whether block position pos (0-based) carries a routing
// key: the last block of every run of Stride blocks, so that a routing key
// at pos stands for blocks 0..pos.
func (s Scheme) Routed(pos int) bool {
	return pos >= 0 && (pos+1)%s.stride() == 0
}

// Request returns the routing keys a pod holding this prompt's prefix
// would have, in prefix order: the chain over the prompt's full blocks,
// capped at (n-1)/BlockSize blocks because vLLM recomputes the last prompt
// token and so reuses at most that many (docs/reference/vllm-interface.md §4.4), keeping
// only Routed positions. It allocates only the result.
func (s Scheme) Request(root Key, tokens []uint32) []Key {
	if s.BlockSize < 1 || len(tokens) < 2 {
		return nil
	}
	blocks := (len(tokens) - 1) / s.BlockSize
	st := s.stride()
	n := blocks / st
	if n == 0 {
		return nil
	}
	keys := make([]Key, 0, n)
	k := root
	for pos := 0; len(keys) < n; pos++ {
		k = Next(k, tokens[pos*s.BlockSize:(pos+1)*s.BlockSize])
		if (pos+1)%st == 0 {
			keys = append(keys, k)
		}
	}
	return keys
}
