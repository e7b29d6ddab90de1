// Package blockkey owns kvroute's block-key scheme (docs/design.md D1): chained
// 64-bit keys computed from token ids, independent of vLLM's own hash
// settings. No other package hashes tokens.
//
// The scheme (Version 1), identical on every process and machine:
//
//	Root(model, lora, salt) = XXH64(tag ‖ uvarint(len(model)) ‖ model ‖
//	                                 uvarint(len(lora)) ‖ lora ‖
//	                                 uvarint(len(salt)) ‖ salt, seed 0)
//	Next(parent, block)     = XXH64(little-endian uint32 bytes of block, seed parent)
//	key_i                   = Next(key_{i-1}, tokens[i*bs:(i+1)*bs]), key_{-1} = Root
//
// where tag is the ASCII string "kvroute.blockkey.v1" followed by a zero
// byte, and XXH64 is Yann Collet's xxHash64 (the published algorithm, so
// any language's xxhash library can reproduce a key). Length prefixes keep
// ("ab","c") and ("a","bc") apart. Because the parent enters as the seed,
// a key depends on every token before it, as vLLM's block hash does.
//
// The sidecar's index (kvindex) keys blocks from BlockStored token ids with
// Root(model, lora, ""), and the request side keys prompts with
// Scheme.Request; both must use the same Scheme to compare.
package blockkey

// Key is our chained hash of one block and every token before it.
type Key uint64

// Version is the key scheme's version. Peers advertising another version
// are not compared.
const Version = 1
