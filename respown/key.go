package respown

import "encoding/hex"

// MaxIDBytes is the longest response id the table records. vLLM's own ids
// are "resp_" and 32 hex digits (37 bytes), but a client may choose its own
// (ResponsesRequest.request_id); an id this long is not one a sane client
// sends, and refusing it bounds what a request can make every node store.
const MaxIDBytes = 128

// Valid reports whether the table records id: 1 to MaxIDBytes bytes.
func Valid(id string) bool { return id != "" && len(id) <= MaxIDBytes }

// Key is a vLLM response id packed into the 16 bytes of its uuid4, which is
// how the table holds, and gossip sends, the ids vLLM makes up: half the
// bytes, and no pointer for the garbage collector to follow.
type Key [16]byte

const keyPrefix = "resp_"

// KeyOf packs id when it is exactly as vLLM makes one ("resp_" and 32
// lower-case hex digits: vllm/utils random_uuid is uuid4().hex); ok is false
// for any other id, which must be kept as it is.
func KeyOf(id string) (k Key, ok bool) {
	if len(id) != len(keyPrefix)+2*len(k) || id[:len(keyPrefix)] != keyPrefix {
		return Key{}, false
	}
	h := id[len(keyPrefix):]
	for i := range k {
		hi, ok1 := nibble(h[2*i])
		lo, ok2 := nibble(h[2*i+1])
		if !ok1 || !ok2 {
			return Key{}, false
		}
		k[i] = hi<<4 | lo
	}
	return k, true
}

// nibble is one lower-case hex digit's value. Upper case is refused: it
// would not unpack to the same id.
func nibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// String returns the id k was packed from.
func (k Key) String() string {
	var b [len(keyPrefix) + 2*len(Key{})]byte
	copy(b[:], keyPrefix)
	hex.Encode(b[len(keyPrefix):], k[:])
	return string(b[:])
}
