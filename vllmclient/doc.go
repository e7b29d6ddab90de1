// Package vllmclient is the sidecar's edge to its local vLLM: the KV-event
// subscriber (ZMQ SUB plus the replay DEALER) and an HTTP Client for
// /tokenize, /metrics and /health. Decoding lives in kvevent; the index
// that applies batches lives elsewhere: this package only delivers them.
//
// # Events
//
// Subscribe returns a Subscriber whose Items channel carries, per Stream
// (topic and DP rank), batches in sequence order with no seq delivered
// twice, interleaved with notices. The consumer's loop:
//
//	for it := range sub.Items() {
//		switch it.Kind {
//		case vllmclient.KindBatch:
//			change := index.Apply(it.Batch)
//		case vllmclient.KindRestart:
//			// vLLM restarted: its cache is gone; new epoch.
//		case vllmclient.KindGap, vllmclient.KindDecodeError:
//			// events were lost: the index is uncertain from here.
//		}
//	}
//
// # Loss semantics
//
// ZMQ drops silently (high-water mark, slow joiner, reconnect), so every
// loss is turned into a value the consumer sees:
//   - A seq jump becomes a replay request when Config.ReplayEndpoint is set:
//     live batches are held, the missing ones are delivered from replay
//     (Item.Replayed), then the held ones. What replay cannot provide
//     (vLLM keeps 10,000 batches) becomes a Gap item. Without replay, the
//     jump is a Gap item before the batch.
//   - A seq that goes backwards is a Restart item: vLLM restarted and
//     numbers from 0 again without sending AllBlocksCleared. With data
//     parallelism it is reported once per vLLM, by the first rank to show
//     it: the ranks restart together.
//   - With replay on, the subscriber replays from seq 0 at start-up, so the
//     index starts complete; without it, a stream starts at the first
//     batch received and anything published before is unknown.
//   - An undecodable payload is a DecodeError item in its seq's place.
//   - When the consumer falls HandoffDepth items behind, items are dropped
//     and counted, never blocking the socket, and the stream's next
//     delivered batch is preceded by a Gap covering them.
//
// Stats exposes the counters for metrics. Restarts that keep the seq
// contiguous (a new vLLM whose first seq equals the old next one) cannot
// be seen in the sequence; the events of both runs then look like one.
package vllmclient
