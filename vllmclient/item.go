package vllmclient

import (
	"fmt"

	"github.com/kvroute/kvroute/kvevent"
)

// Stream identifies one publisher's sequence: vLLM numbers batches per
// publisher, and every DP rank has its own publisher under the same topic.
type Stream struct {
	Topic string
	// Rank is the data-parallel rank of the socket the batch arrived on.
	Rank int
}

// Kind says what an Item carries.
type Kind uint8

const (
	// KindBatch: Item.Batch is the next batch of its stream.
	KindBatch Kind = iota + 1
	// KindGap: batches Gap.Expected .. Gap.Got-1 of the stream are lost for
	// good; the consumer's view of the cache is incomplete from here on.
	KindGap
	// KindRestart: the stream's sequence went backwards to Item.Seq; the
	// publisher (vLLM) restarted and its cache is gone. Clear, then apply
	// the batches that follow.
	KindRestart
	// KindDecodeError: a message (Item.Seq, Item.Err) could not be decoded.
	// It takes its place in the sequence, so no Gap is reported for it, but
	// its events are lost.
	KindDecodeError
)

// String returns the kind's name as the events tool prints it.
func (k Kind) String() string {
	switch k {
	case KindBatch:
		return "event"
	case KindGap:
		return "gap"
	case KindRestart:
		return "restart"
	case KindDecodeError:
		return "error"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Item is one element of a Subscriber's ordered output: a batch or a
// notice about the stream. Within a Stream, items arrive in sequence order
// and no seq is delivered twice.
type Item struct {
	Kind   Kind
	Stream Stream
	// Batch is set for KindBatch (Topic and Seq filled in).
	Batch kvevent.Batch
	// Replayed reports that the batch came from the replay socket.
	Replayed bool
	// Expected and Got are set for KindGap: the seq that was due and the
	// seq that arrived (or that replay could start from).
	Expected, Got uint64
	// Seq is set for KindRestart (first seq of the new publisher) and
	// KindDecodeError (the bad message's seq, 0 if its frames had none).
	Seq uint64
	// Err is set for KindDecodeError.
	Err error
}

func batchItem(s Stream, b kvevent.Batch, replayed bool) Item {
	return Item{Kind: KindBatch, Stream: s, Batch: b, Replayed: replayed}
}

func gapItem(s Stream, expected, got uint64) Item {
	return Item{Kind: KindGap, Stream: s, Expected: expected, Got: got}
}

func restartItem(s Stream, seq uint64) Item {
	return Item{Kind: KindRestart, Stream: s, Seq: seq}
}

func errorItem(s Stream, seq uint64, err error) Item {
	return Item{Kind: KindDecodeError, Stream: s, Seq: seq, Err: err}
}
