package blockkey

import "encoding/binary"

// extraTag separates extra-key mixing from roots and token steps.
const extraTag = "kvroute.blockkey.extra\x00"

// Extend returns the chain key that a block's extra hash inputs make of
// its parent's key: a block with extras is keyed Next(Extend(parent,
// extras), tokens). vLLM hashes each block with a tuple of extra keys
// besides its tokens (vllm-interface.md §4.2): the LoRA name on every
// block (kvroute's roots carry it instead), the identifier of every image
// the block overlaps (its placeholder tokens are the same for every
// image), and the cache salt on the block at token 0. With no extras it
// returns parent, so the keys of plain blocks are those of before extras
// were keyed, and digests of either version agree on them.
func Extend(parent Key, extras []string) Key {
	if len(extras) == 0 {
		return parent
	}
	n := len(extraTag) + 8
	for _, s := range extras {
		n += binary.MaxVarintLen64 + len(s)
	}
	var a [256]byte
	b := a[:0]
	if n > len(a) {
		b = make([]byte, 0, n)
	}
	b = append(b, extraTag...)
	b = binary.LittleEndian.AppendUint64(b, uint64(parent))
	for _, s := range extras {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return Key(xxh64(b, uint64(parent)))
}

// Salted is the root a request with a cache_salt is keyed from: vLLM puts
// the salt in block 0's extra keys only, which changes every key after it.
// A request whose block 0 also overlaps an image keys that block with
// RequestMM instead (the image's identifier comes first, then the salt).
func Salted(root Key, salt string) Key {
	if salt == "" {
		return root
	}
	return Extend(root, []string{salt})
}

// MM is one multimodal item's place in a prompt: the identifier vLLM
// hashes it by (render's mm_hashes entry, or the caller's uuid) and its
// placeholder tokens, [Offset, Offset+Length).
type MM struct {
	ID             string
	Offset, Length int
}

// BlockExtras returns the extra keys of block pos (0-based) of a prompt
// with items mm and cache salt salt, in vLLM's order: the identifiers of
// the items overlapping the block, then the salt on block 0. nil when
// there are none.
func BlockExtras(pos, blockSize int, mm []MM, salt string) []string {
	var out []string
	start, end := pos*blockSize, (pos+1)*blockSize
	for _, m := range mm {
		if m.Length > 0 && m.Offset < end && m.Offset+m.Length > start {
			out = append(out, m.ID)
		}
	}
	if pos == 0 && salt != "" {
		out = append(out, salt)
	}
	return out
}

// RequestMM is Request for a prompt with multimodal items and a cache
// salt: each block is keyed with its extras (BlockExtras), as the index
// keys the blocks vLLM stores for it, so a different image (or salt)
// never matches past the first block it touches. With neither it returns
// what Request returns.
func (s Scheme) RequestMM(root Key, tokens []uint32, mm []MM, salt string) []Key {
	if len(mm) == 0 {
		return s.Request(Salted(root, salt), tokens)
	}
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
		k = Next(Extend(k, BlockExtras(pos, s.BlockSize, mm, salt)), tokens[pos*s.BlockSize:(pos+1)*s.BlockSize])
		if (pos+1)%st == 0 {
			keys = append(keys, k)
		}
	}
	return keys
}
