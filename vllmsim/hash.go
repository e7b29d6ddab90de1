package vllmsim

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sort"
)

// Hash algorithms accepted in Config.HashAlgo.
const (
	// HashSHA256CBOR is vLLM's --prefix-caching-hash-algo sha256_cbor:
	// reproducible outside Python and verified against real captures.
	HashSHA256CBOR = "sha256_cbor"
	// HashFast chains the same inputs through 64-bit FNV-1a: not vLLM's
	// bytes, but the same structure at a fraction of the cost.
	HashFast = "fast"
)

// digest is a block hash as vLLM keeps it internally (32 bytes for
// sha256_cbor). The fast algorithm fills only the last 8 bytes, so wire()
// works the same for both.
type digest [32]byte

// wire is the form events carry: the last 8 bytes read big-endian
// (docs/reference/vllm-interface.md §2.5, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
func (d digest) wire() uint64 { return binary.BigEndian.Uint64(d[24:]) }

// hasher computes chained block hashes exactly as vLLM's hash_block_tokens
// (docs/reference/vllm-interface.md §4.1). It is immutable once built; Restart builds a new
// one when the seed is random.
type hasher struct {
	fast bool
	none digest // NONE_HASH: the parent of block 0
}

// newHasher builds the hasher for algo. With seedSet it derives NONE_HASH
// from seed as vLLM does from PYTHONHASHSEED; otherwise it draws 32 random
// bytes (os.urandom(32) in vLLM), so hashes differ per engine process.
func newHasher(algo, seed string, seedSet bool) (hasher, error) {
	h := hasher{}
	switch algo {
	case HashSHA256CBOR, "":
	case HashFast:
		h.fast = true
	default:
		return h, fmt.Errorf("hash algo %q: want %q or %q", algo, HashSHA256CBOR, HashFast)
	}
	if !seedSet {
		if _, err := rand.Read(h.none[:]); err != nil {
			return h, fmt.Errorf("draw hash seed: %w", err)
		}
		return h, nil
	}
	if h.fast {
		f := fnv.New64a()
		f.Write([]byte(seed))
		binary.BigEndian.PutUint64(h.none[24:], f.Sum64())
		return h, nil
	}
	h.none = sha256.Sum256(appendText(nil, seed))
	return h, nil
}

// blockKeys are a request's inputs to its blocks' extra hash keys.
type blockKeys struct {
	lora, salt string
	// mm are the image placements, sorted by offset and disjoint
	// (Engine.Submit checks), so the images a block overlaps are found by
	// binary search.
	mm []MMPlacement
}

// extraKeys is vLLM's generate_block_hash_extra_keys for the inputs the
// simulator supports, for block number block of bs tokens: the LoRA name
// on every block, then the identifier of each image whose placeholder
// range overlaps the block (bare, as vLLM v0.18+ sends them), then
// cache_salt on the block that starts at token 0 only; nil when empty
// (CBOR null, and a None entry in BlockStored's extra_keys).
func extraKeys(k blockKeys, block, bs int) []string {
	var x []string
	if k.lora != "" {
		x = append(x, k.lora)
	}
	if len(k.mm) > 0 {
		start, end := block*bs, (block+1)*bs
		i := sort.Search(len(k.mm), func(i int) bool { return k.mm[i].Offset+k.mm[i].Length > start })
		for ; i < len(k.mm) && k.mm[i].Offset < end; i++ {
			x = append(x, k.mm[i].ID)
		}
	}
	if k.salt != "" && block == 0 {
		x = append(x, k.salt)
	}
	return x
}

// block hashes one full block given its parent (nil parent means block 0).
// buf is scratch space reused across calls to avoid allocation.
func (h hasher) block(parent *digest, tokens []uint32, extra []string, buf []byte) (digest, []byte) {
	p := h.none
	if parent != nil {
		p = *parent
	}
	if h.fast {
		return h.fastBlock(p, tokens, extra), buf
	}
	buf = encodeBlock(buf[:0], p, tokens, extra)
	return sha256.Sum256(buf), buf
}

// fastBlock chains parent, tokens and extras through FNV-1a-style steps a
// word at a time (not byte-wise: an 8k prompt is hashed per request), then
// a murmur3 finalizer so that nearby inputs spread over all 64 bits.
func (h hasher) fastBlock(parent digest, tokens []uint32, extra []string) digest {
	const prime = 1099511628211
	x := uint64(14695981039346656037)
	x = (x ^ binary.BigEndian.Uint64(parent[24:])) * prime
	for _, t := range tokens {
		x = (x ^ uint64(t)) * prime
	}
	for _, s := range extra {
		x = (x ^ 0xff00000000) * prime // separator: extras cannot alias tokens
		for i := 0; i < len(s); i++ {
			x = (x ^ uint64(s[i])) * prime
		}
	}
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	var d digest
	binary.BigEndian.PutUint64(d[24:], x)
	return d
}

// chain appends the hashes of every full block of tokens not yet in have
// (have holds the hashes of the first len(have) blocks).
func (h hasher) chain(have []digest, tokens []uint32, bs int, k blockKeys) []digest {
	var buf []byte
	for i := len(have); (i+1)*bs <= len(tokens); i++ {
		var parent *digest
		if i > 0 {
			parent = &have[i-1]
		}
		var d digest
		d, buf = h.block(parent, tokens[i*bs:(i+1)*bs], extraKeys(k, i, bs), buf)
		have = append(have, d)
	}
	return have
}

// encodeBlock writes canonical CBOR of [parent_bytes32, [tokens...], extra]
// as cbor2.dumps(..., canonical=True) does for this shape: definite lengths
// and shortest integer heads (map key order, the other canonical rule, does
// not arise).
func encodeBlock(b []byte, parent digest, tokens []uint32, extra []string) []byte {
	b = appendHead(b, 4, 3)
	b = appendHead(b, 2, 32)
	b = append(b, parent[:]...)
	b = appendHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		b = appendHead(b, 0, uint64(t))
	}
	if extra == nil {
		return append(b, 0xf6) // null
	}
	b = appendHead(b, 4, uint64(len(extra)))
	for _, s := range extra {
		b = appendText(b, s)
	}
	return b
}

func appendText(b []byte, s string) []byte {
	b = appendHead(b, 3, uint64(len(s)))
	return append(b, s...)
}

// appendHead writes a CBOR initial byte for major type major with argument
// n in its shortest form (RFC 8949 §4.2.1).
func appendHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return append(b, m|25, byte(n>>8), byte(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(n))
	default:
		return binary.BigEndian.AppendUint64(append(b, m|27), n)
	}
}
