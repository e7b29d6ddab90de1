package blockkey

import (
	"encoding/binary"
	"math/bits"
)

// XXH64 constants (xxHash specification, xxhash_spec.md).
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

func round(acc, lane uint64) uint64 {
	acc += lane * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func mergeRound(acc, v uint64) uint64 {
	acc ^= round(0, v)
	return acc*prime1 + prime4
}

func avalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

func converge(v1, v2, v3, v4 uint64) uint64 {
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) +
		bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = mergeRound(h, v1)
	h = mergeRound(h, v2)
	h = mergeRound(h, v3)
	return mergeRound(h, v4)
}

// xxh64 is the reference XXH64 of b; it is kept so that the token variant
// can be checked against the published vectors.
func xxh64(b []byte, seed uint64) uint64 {
	n := len(b)
	var h uint64
	if n >= 32 {
		v1, v2, v3, v4 := seed+prime1+prime2, seed+prime2, seed, seed-prime1
		for ; len(b) >= 32; b = b[32:] {
			v1 = round(v1, binary.LittleEndian.Uint64(b[0:8]))
			v2 = round(v2, binary.LittleEndian.Uint64(b[8:16]))
			v3 = round(v3, binary.LittleEndian.Uint64(b[16:24]))
			v4 = round(v4, binary.LittleEndian.Uint64(b[24:32]))
		}
		h = converge(v1, v2, v3, v4)
	} else {
		h = seed + prime5
	}
	h += uint64(n)
	for ; len(b) >= 8; b = b[8:] {
		h ^= round(0, binary.LittleEndian.Uint64(b))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b)) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	return avalanche(h)
}

// xxh64Tokens is XXH64 of the tokens' little-endian bytes, read straight
// from the uint32s: no byte copy, so a key costs no allocation. A uint32
// stream never leaves a 1–3 byte tail, so that branch of XXH64 is absent.
func xxh64Tokens(t []uint32, seed uint64) uint64 {
	n := len(t) * 4
	var h uint64
	if len(t) >= 8 {
		v1, v2, v3, v4 := seed+prime1+prime2, seed+prime2, seed, seed-prime1
		for ; len(t) >= 8; t = t[8:] {
			v1 = round(v1, uint64(t[0])|uint64(t[1])<<32)
			v2 = round(v2, uint64(t[2])|uint64(t[3])<<32)
			v3 = round(v3, uint64(t[4])|uint64(t[5])<<32)
			v4 = round(v4, uint64(t[6])|uint64(t[7])<<32)
		}
		h = converge(v1, v2, v3, v4)
	} else {
		h = seed + prime5
	}
	h += uint64(n)
	for ; len(t) >= 2; t = t[2:] {
		h ^= round(0, uint64(t[0])|uint64(t[1])<<32)
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(t) == 1 {
		h ^= uint64(t[0]) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
	}
	return avalanche(h)
}
