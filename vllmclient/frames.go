package vllmclient

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/kvevent"
)

// endSeq is vLLM's replay end marker, (-1).to_bytes(8, "big", signed=True).
const endSeq = ^uint64(0)

// ErrFrames reports a message whose frames do not have vLLM's shape, so
// not even its seq is known.
var ErrFrames = errors.New("malformed frames")

// parseLive reads a live message [topic, seq(8B BE), payload]. It fails
// only when the frames carry no seq; a payload that does not decode is
// returned in msg.err so the message keeps its place in the sequence.
func parseLive(frames [][]byte) (msg, error) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return msg{}, fmt.Errorf("live message with %d frames: %w", len(frames), ErrFrames)
	}
	return decode(frames[0], frames[1], frames[2]), nil
}

// parseReply reads one replay reply as a DEALER receives it: ["", seq,
// payload] from vLLM <= v0.25 or ["", topic, seq, payload] since vllm#45177.
// end reports the end marker (seq 0xFF..FF and/or an empty payload).
func parseReply(frames [][]byte) (m msg, topicSent, end bool, err error) {
	if len(frames) < 3 || len(frames[0]) != 0 {
		return msg{}, false, false, fmt.Errorf("replay reply with %d frames: %w", len(frames), ErrFrames)
	}
	var topic, seq, payload []byte
	switch len(frames) {
	case 3:
		seq, payload = frames[1], frames[2]
	case 4:
		topic, seq, payload, topicSent = frames[1], frames[2], frames[3], true
	default:
		return msg{}, false, false, fmt.Errorf("replay reply with %d frames: %w", len(frames), ErrFrames)
	}
	if len(seq) != 8 {
		return msg{}, false, false, fmt.Errorf("replay reply seq of %d bytes: %w", len(seq), ErrFrames)
	}
	if binary.BigEndian.Uint64(seq) == endSeq || len(payload) == 0 {
		return msg{}, topicSent, true, nil
	}
	return decode(topic, seq, payload), topicSent, false, nil
}

func decode(topic, seq, payload []byte) msg {
	m := msg{topic: string(topic), seq: binary.BigEndian.Uint64(seq)}
	b, err := kvevent.DecodeFrames([][]byte{topic, seq, payload})
	if err != nil {
		m.err = fmt.Errorf("decode batch seq %d: %w", m.seq, err)
		return m
	}
	m.batch = b
	return m
}

// replayRequest is the DEALER request for every buffered batch from seq on.
func replayRequest(seq uint64) [][]byte {
	return [][]byte{{}, binary.BigEndian.AppendUint64(nil, seq)}
}
