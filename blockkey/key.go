package blockkey

import "encoding/binary"

// rootTag separates our roots from any other use of XXH64 and names the
// scheme version; changing it changes every key, so it moves with Version.
const rootTag = "kvroute.blockkey.v1\x00"

// Root returns the chain seed for a model, a LoRA adapter name ("" for the
// base model) and a cache_salt ("" for none). Each one changes every key of
// the chain, as vLLM's extra keys do.
func Root(model, lora, salt string) Key {
	var a [128]byte
	b := append(a[:0], rootTag...)
	for _, s := range [...]string{model, lora, salt} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return Key(xxh64(b, 0))
}

// ModelRoot is the chain root of the blocks that an engine serving base
// computes for a request or event naming model. It is the one rule both
// sides key by (docs/design.md D1): the base model, or no name, roots at base;
// any other name is a LoRA adapter of it. A cache_salt is not in the root:
// vLLM hashes it into block 0 alone, which Salted and RequestMM mirror.
func ModelRoot(base, model string) Key {
	lora := ""
	if model != "" && model != base {
		lora = model
	}
	return Root(base, lora, "")
}

// Next returns the key of block given the key of the block before it (or
// the Root for the first block). Any block length is accepted; callers pass
// full blocks.
func Next(parent Key, block []uint32) Key {
	return Key(xxh64Tokens(block, uint64(parent)))
}

// Chain returns the keys of every full block of tokens, chained from root.
// A trailing partial block has no key, as in vLLM. A blockSize below 1
// yields no keys.
func Chain(root Key, tokens []uint32, blockSize int) []Key {
	if blockSize < 1 || len(tokens) < blockSize {
		return nil
	}
	keys := make([]Key, len(tokens)/blockSize)
	k := root
	for i := range keys {
		k = Next(k, tokens[i*blockSize:(i+1)*blockSize])
		keys[i] = k
	}
	return keys
}
