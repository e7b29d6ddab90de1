// Package kvindex is the exact index of what the local vLLM holds in its
// GPU prefix cache (docs/design.md D2, D7). It is a pure state machine: the
// event loop in vllmclient feeds it decoded batches and passes on the
// Change it returns; it has no sockets, clocks or goroutines.
//
// The loop it expects, over vllmclient's ordered items (the subscriber owns
// the sequence numbers, gaps, restarts and replay; vllmclient.ApplyItem is
// this loop's body):
//
//	ix := kvindex.New(cfg)
//	for it := range sub.Items() {
//		switch it.Kind {
//		case vllmclient.KindBatch:
//			ch := ix.Apply(it.Batch) // ch.Added, ch.Removed: the delta
//		case vllmclient.KindRestart:
//			ix.Restart() // new epoch: rebuild the digest from ix.Keys()
//		case vllmclient.KindGap, vllmclient.KindDecodeError:
//			ix.SetUncertain(true)
//		}
//	}
//
// What it maps: vLLM's block hash → (our blockkey.Key, block position,
// physical copies). Keys are chained from the event's token ids, seeded by
// blockkey.ModelRoot(model, lora), so they match what blockkey's
// Scheme.Request computes for a prompt on any pod. A block's extra hash
// keys in the event (an image's identifier, the cache_salt on block 0;
// extras.go) are mixed into its key with blockkey.Extend, as the request
// side does (blockkey.Scheme.RequestMM), so a salted or image-bearing
// prefix matches only a request with the same salt or image.
//
// The routing set is the set of keys at Scheme.Routed positions held by at
// least one resident hash. Two vLLM hashes can share one key (vLLM seeds
// differ, LoRA ids), so each key is reference counted by resident hashes,
// and each hash by its physical copies.
//
// An Index is safe for concurrent use: Apply takes a write lock, the
// accessors a read lock, so request handlers may call PrefixLen while the
// event loop applies batches.
package kvindex
