package gossip

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/bloom"
)

// WireVersion is the version of the mesh's protocol this build speaks:
// the user messages below, the node meta and the hop header's format, as
// one number. v0.1.0 spoke 1 and did not say so; from 2 on a sidecar says
// it in its node meta's first byte (Meta.Wire) and at the end of every load
// report, so a peer's version is known from its meta before any message
// of its arrives. A message or format newer than 1 is sent only to a peer
// whose meta names a version that reads it (docs/compat.md); everything
// else is written as MinWireVersion reads it.
//
// MinWireVersion is the oldest version this build reads and writes for:
// its own and the one before, so a mesh upgrades one release at a time.
const (
	WireVersion    uint8 = 2
	MinWireVersion uint8 = 1
)

// Message kinds: the first byte of every user message the mesh sends. Each
// is listed once more in kinds, which is what decodes and counts it. The
// bytes kindFirst to kindLast are kvroute's: a kind in that range that this
// build does not know came from a newer version (ErrNewer), any other byte
// is malformed.
const (
	kindDigest   byte = 0xD1 // full digest (digest.go)
	kindDelta    byte = 0xD2 // delta (digest.go)
	kindNeedFull byte = 0xD3 // "send me your full digest" (needfull.go)
	kindLoad     byte = 0xD4 // the sender's load and engine state (loadreport.go)
	// A learned text prefix (textprefix.go).
	kindTextPrefix byte = 0xD5
	kindResponses  byte = 0xD6 // which node holds which stored responses (responses.go)

	kindFirst byte = 0xD1
	kindLast  byte = 0xEF
)

// payload is one decoded message. Each kind's file holds its type, its
// encoder, its decoder and its apply.
type payload interface {
	// encode returns the whole message, kind byte first; decoding it gives
	// the payload back.
	encode() ([]byte, error)
	// apply makes a received message take effect at now. It runs on the mesh
	// loop, one message at a time, and must not block: it may take the
	// mesh's locks (in the order Mesh documents), never wait on the network.
	apply(m *Mesh, now time.Time)
}

// kindSpec is one message kind.
type kindSpec struct {
	kind byte
	name string // its key in ByKind.All; unique
	// decode parses the bytes after the kind byte. The result must not
	// alias them: memberlist reuses its buffers.
	decode func(b []byte) (payload, error)
}

// kinds lists every message the mesh accepts, and names it in Stats
// (ByKind.All); a byte not listed is a decode error.
var kinds = [...]kindSpec{
	{kindDigest, "digest", decodeDigestMsg},
	{kindDelta, "delta", decodeDeltaMsg},
	{kindNeedFull, "need_full", decodeNeedFullMsg},
	{kindLoad, "load", decodeLoadMsg},
	{kindTextPrefix, "text_prefix", decodeTextPrefixMsg},
	{kindResponses, "responses", decodeResponsesMsg},
}

// slotOf returns k's index in kinds, or -1 for a kind not listed.
func slotOf(k byte) int {
	for i := range kinds {
		if kinds[i].kind == k {
			return i
		}
	}
	return -1
}

// ErrMsg is wrapped by every decodeMsg error caused by malformed input.
var ErrMsg = errors.New("malformed gossip message")

// ErrNewer is wrapped by a decodeMsg error for a message a newer version
// wrote that this build cannot read: a kind in kvroute's range it does not
// know, or a version or format byte past those it reads (a digest's
// bloom.ErrUnsupported, a responses message of a later version). It does
// not wrap ErrMsg: during a rolling upgrade such messages are expected,
// and the receive loop counts them apart (Stats.NewerDropped).
var ErrNewer = errors.New("gossip message of a newer version")

// message is one decoded user message.
type message struct {
	kind byte
	body payload
}

// decodeMsg parses a user message. The result does not alias b.
func decodeMsg(b []byte) (message, error) {
	if len(b) == 0 {
		return message{}, fmt.Errorf("empty: %w", ErrMsg)
	}
	i := slotOf(b[0])
	switch {
	case i < 0 && b[0] >= kindFirst && b[0] <= kindLast:
		return message{}, fmt.Errorf("kind %#x: %w", b[0], ErrNewer)
	case i < 0:
		return message{}, fmt.Errorf("kind %#x: %w", b[0], ErrMsg)
	}
	p, err := kinds[i].decode(b[1:])
	if errors.Is(err, ErrNewer) || errors.Is(err, bloom.ErrUnsupported) {
		return message{}, fmt.Errorf("decode kind %#x: %w: %w", b[0], ErrNewer, err)
	}
	if err != nil {
		return message{}, fmt.Errorf("decode kind %#x: %w: %w", b[0], ErrMsg, err)
	}
	return message{kind: b[0], body: p}, nil
}
