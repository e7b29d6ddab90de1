// Package bloom is a pod's digest: a Bloom filter of the routing keys its vLLM
// holds, sent to peers so they can test a prompt's key chain without asking
// (docs/design.md D2, D3).
//
// The package is pure: values in, values out. A Digest is immutable once
// built, so one value can be tested from many goroutines while the owner
// builds its successor; publish it with an atomic.Pointer and replace it
// wholesale.
//
// The local side rebuilds from its exact index and sends changes as a chain of
// deltas:
//
//	d := bloom.Build(bloom.Header{Node: pod, Epoch: ix.Epoch(), Version: ix.Version(),
//		Params: bloom.ParamsFor(capacityKeys, 0.01)}, ix.Keys())
//	full, err := d.MarshalBinary()     // periodically, and when a peer reports a gap
//	delta, err := bloom.MarshalDelta(bloom.Delta{Node: pod, Epoch: e, From: v, To: v + 1, Keys: added})
//
// A peer keeps the newest digest per node and applies deltas in order:
//
//	next, err := cur.Apply(x)
//	switch {
//	case errors.Is(err, bloom.ErrStale): // old or duplicate: drop it
//	case errors.Is(err, bloom.ErrGap):   // missed one, or another epoch: ask for a full digest
//	default:                             // publish next
//	}
//
// A Bloom filter cannot delete, so a delta only adds keys; removed keys stay
// (as false positives) until the next full digest. FillRatio tells the owner
// when the filter has drifted far enough from its index to rebuild.
//
// Hashing: block keys are already uniform 64-bit hashes, so the bit positions
// come from remixing the key itself rather than from the library's murmur
// pass. The default, HashScheme 2, is a blocked filter: a key's K bits lie in
// one 64-byte cache line, so testing a digest that is not in cache costs one
// miss rather than K (hash2.go); ParamsFor sizes for it. Scheme 1, double
// hashing over the whole filter (hash1.go), is still read. Both ends must
// know the scheme; it travels in every digest and a digest with an unknown
// scheme is refused.
package bloom
