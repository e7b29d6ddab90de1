// Package kvevent holds vLLM's KV-cache event values and their wire codec:
// bytes in, values out. It has no sockets, so the core packages and the
// simulator's encoder never link libzmq (see docs/reference/vllm-interface.md §1–§2).
//
// # Messages
//
// vLLM publishes one ZMQ message per engine step that produced events:
// [topic, seq, payload]. DecodeFrames checks the framing and reads seq as
// the first 8 bytes big-endian; Decode reads the payload alone (replay
// replies carry the same payload in other framing, which the socket layer
// unwraps).
//
// # Wire variants accepted by Decode
//
// The payload is msgspec msgpack, and its shape has changed over vLLM
// releases. Decode accepts all of them in any mix:
//
//   - Batch: an array [ts, events, data_parallel_rank], with the rank absent
//     (before vLLM PR #18925) and extra trailing elements ignored; or a map
//     with keys "ts", "events" and "data_parallel_rank".
//   - Event: a positional array [tag, field1, field2, ...] in declaration
//     order (before PR #42892), or a map with a "type" key holding the tag
//     (v0.26+). Missing trailing fields read as nil; unknown keys and
//     extra elements are skipped. An unknown tag gives Kind Unknown with
//     Tag kept; it is not an error.
//   - Integers: any msgpack width, signed or unsigned, and floats holding an
//     integral value. ts may be a float32, float64 or integer.
//   - Token ids must lie in [0, 2^32-1]; anything else fails the batch.
//   - medium and the other strings are kept as sent (compare medium
//     case-insensitively).
//   - Empty arrays decode as nil slices, the same as absent ones.
//
// # Hash fold rule
//
// vLLM hashes blocks with 32-byte sha256 (or 16-byte xxh3-128) digests and by
// default sends the low 64 bits as an int. Decode gives every hash one
// uint64 name whatever its wire form:
//
//   - unsigned int: as sent;
//   - negative int (Python hash() in vLLM ≤ 0.9): its two's-complement uint64;
//   - bin or str: the last 8 bytes read big-endian, which equals the int
//     form of the same digest; a string shorter than 8 bytes is read as if
//     left-padded with zeros.
//
// A parent hash that is absent, nil or folds to 0 gives a nil Parent.
//
// # Encoding
//
// Encode writes what vLLM's msgspec encoder would (smallest integer forms,
// ts as float64, omit_defaults), in either the positional or the map
// generation, so the simulator and the sidecar share one wire definition.
// For any Batch b returned by Decode, Decode(Encode(b, enc)) equals b.
//
// # How to add a KV-event field
//
// Two places: the field itself in Event (event.go), and one row — wire
// name and accessor — in its kind's entry of the kinds table (fields.go),
// at the field's position in vLLM's declaration order (vLLM appends new
// fields with a default, so the row goes last). The decoder (both
// encodings), the encoder and Event.Fields, which `sidecar events`
// prints, all read that table. The field's Go type picks its wire form
// from the types listed on fieldSpec; a field needing a new form adds one
// case to each switch beside it. TestTableRoundTrip fails until the
// field has a row that round-trips.
//
// # Safety
//
// Decode never panics, and allocates at most a small multiple of the
// payload size: every length header is checked against the bytes left
// before a slice is sized by it, and nesting is bounded.
package kvevent
