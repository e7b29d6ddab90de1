package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// Meta is what a node advertises in memberlist's node meta: how to reach it,
// what it serves, which digest it holds and how loaded it is. memberlist
// gossips it to every member on each UpdateNode.
type Meta struct {
	APIAddr         string       // host:port peers forward to
	Models          []string     // served model and LoRA names
	ModelsTruncated bool         // Models is incomplete: more names than fit
	KeyScheme       uint8        // blockkey scheme version
	Draining        bool         // refusing new requests
	Engine          route.Engine // the local vLLM: serving, starting or down
	HasDigest       bool         // DigestEpoch and DigestVersion are meaningful
	DigestEpoch     uint64
	DigestVersion   uint64
	Running         int // requests being decoded
	Waiting         int // requests queued in vLLM
	KVUsageMilli    int // KV cache usage × 1000
	Serving         int // requests this sidecar has at its vLLM (route.Load.Serving)
	QueuedPrefill   int // prompt tokens queued for prefill
	// Wire is the sender's gossip wire version (WireVersion), the meta's
	// first byte: 1 for v0.1.0, which wrote the byte as the meta's own
	// version. EncodeMeta writes 0 as this build's WireVersion.
	Wire uint8
	// Ranks is how many data-parallel ranks the node's engine runs
	// (route.PeerView.Ranks), appended after the models; 0: not said (a
	// sender that predates the field, or a count above bloom.MaxRanks).
	Ranks int
	// EngineAddr is the host:port where peers can reach the node's vLLM
	// itself, appended after Ranks; empty: not said. Peers use it only to
	// ask that vLLM about a stored response while its sidecar is away
	// (forward/direct.go).
	EngineAddr string
	// Stride is how many vLLM blocks each of the node's digest keys
	// stands for (blockkey.Scheme.Stride, its --routing-stride), appended
	// after EngineAddr; 0: not said (a sender that predates the field),
	// read as the reader's own. Keys are chained per block, so a node
	// whose stride is a multiple of ours holds a subset of our keys, and
	// one whose stride divides ours holds all of them (route.Strided).
	Stride int
	// StoreGone: the node's vLLM no longer listens, so the Responses
	// store in its memory is gone; set as its sidecar leaves (a flag v0.1.0
	// ignores). Peers take its stored responses as gone at once.
	StoreGone bool
}

// Wire format of the meta:
//
//	wire version u8 | flags u8 | key scheme u8 | api len u8 | api |
//	epoch uvarint | version uvarint | running uvarint | waiting uvarint |
//	kv usage milli uvarint | serving uvarint | queued prefill uvarint |
//	model count u8 | (len u8 | name)* |
//	appended: ranks uvarint | engine addr len u8 | engine addr |
//	          stride uvarint
//
// The first byte is the sender's WireVersion: v0.1.0 wrote 1 there as the
// meta's version and reads any version of 1 or more with this layout,
// ignoring bytes after the models. So the layout is fixed for as long as a
// v0.1.0 peer may read it: a later version may only append fields after
// the models (and set flags v0.1.0 ignores), and a byte of 2 or more
// tells a reader that it may look for them. A version 0 is malformed.
//
// The appended fields are written in order as far as the last one set (a
// meta with none set ends at the models, byte for byte as before them), a
// reader takes one that is missing as unset, and ignores any after those
// it knows: a newer version appends its own after them. Their room is
// kept before the models are fitted in, so a long model list cannot push
// them out.
const (
	metaVersion     = 1   // the oldest first byte decoders accept: v0.1.0's
	maxMetaBytes    = 512 // memberlist.MetaMaxSize; memberlist panics above it
	maxAPIAddrBytes = 255
	maxModelBytes   = 255
	maxModels       = 255
	maxStride       = 1 << 10 // 16k tokens a key at vLLM's block size: far above any sane stride

	flagDraining        = 1 << 0
	flagHasDigest       = 1 << 1
	flagModelsTruncated = 1 << 2
	flagEngineStarting  = 1 << 3 // neither engine flag: serving (and every earlier version)
	flagEngineDown      = 1 << 4
	flagStoreGone       = 1 << 5
)

// ErrMeta is wrapped by every DecodeMeta error.
var ErrMeta = errors.New("malformed node meta")

// EncodeMeta returns m's wire form, at most limit bytes (limit above 512 is
// treated as 512). Models that do not fit are left out, in order, and
// ModelsTruncated is set; an API address over 255 bytes is an error, since
// peers could not reach us.
func EncodeMeta(m Meta, limit int) ([]byte, error) {
	limit = min(limit, maxMetaBytes)
	if len(m.APIAddr) > maxAPIAddrBytes {
		return nil, fmt.Errorf("encode meta: api address of %d bytes", len(m.APIAddr))
	}
	if len(m.EngineAddr) > maxAPIAddrBytes {
		return nil, fmt.Errorf("encode meta: engine address of %d bytes", len(m.EngineAddr))
	}
	flags := byte(0)
	if m.Draining {
		flags |= flagDraining
	}
	if m.HasDigest {
		flags |= flagHasDigest
	}
	if m.StoreGone {
		flags |= flagStoreGone
	}
	switch m.Engine {
	case route.EngineStarting:
		flags |= flagEngineStarting
	case route.EngineDown:
		flags |= flagEngineDown
	}
	wire := m.Wire
	if wire == 0 {
		wire = WireVersion
	}
	tail := appendedFields(m, wire)
	b := make([]byte, 0, limit)
	b = append(b, wire, 0, m.KeyScheme, byte(len(m.APIAddr)))
	b = append(b, m.APIAddr...)
	for _, v := range []uint64{m.DigestEpoch, m.DigestVersion} {
		b = binary.AppendUvarint(b, v)
	}
	for _, v := range []int{m.Running, m.Waiting, m.KVUsageMilli, m.Serving, m.QueuedPrefill} {
		b = binary.AppendUvarint(b, uint64(min(max(v, 0), math.MaxInt32)))
	}
	countAt := len(b)
	b = append(b, 0)
	if len(b)+len(tail) > limit {
		return nil, fmt.Errorf("encode meta: %d bytes besides models, limit %d", len(b)+len(tail), limit)
	}
	truncated := m.ModelsTruncated
	n := 0
	for _, name := range m.Models {
		if n == maxModels || len(name) > maxModelBytes || len(b)+1+len(name)+len(tail) > limit {
			truncated = true
			continue // a shorter name later may still fit
		}
		b = append(b, byte(len(name)))
		b = append(b, name...)
		n++
	}
	b[countAt] = byte(n)
	if truncated {
		flags |= flagModelsTruncated
	}
	b[1] = flags
	return append(b, tail...), nil
}

// appendedFields returns the fields EncodeMeta writes after the models,
// as far as the last one set; none in wire 1, which v0.1.0 wrote.
func appendedFields(m Meta, wire uint8) []byte {
	if wire < 2 {
		return nil
	}
	var b []byte
	ranks := 0
	if m.Ranks > 0 && m.Ranks <= bloom.MaxRanks {
		ranks = m.Ranks
	}
	stride := 0
	if m.Stride > 0 && m.Stride <= maxStride {
		stride = m.Stride
	}
	if ranks > 0 || m.EngineAddr != "" || stride > 0 {
		b = binary.AppendUvarint(b, uint64(ranks))
	}
	if m.EngineAddr != "" || stride > 0 {
		b = append(b, byte(len(m.EngineAddr)))
		b = append(b, m.EngineAddr...)
	}
	if stride > 0 {
		b = binary.AppendUvarint(b, uint64(stride))
	}
	return b
}

// DecodeMeta parses a node meta written by EncodeMeta, by this version or
// any other: Wire is the first byte; appended fields that are missing
// (an older sender) are unset, and bytes after those this version knows
// (fields a newer version appended) are ignored. Integers that do not fit
// an int are an error; so is any truncation.
func DecodeMeta(b []byte) (Meta, error) {
	if len(b) > maxMetaBytes {
		return Meta{}, fmt.Errorf("%d bytes: %w", len(b), ErrMeta)
	}
	r := metaReader{b: b}
	version, flags, scheme, apiLen := r.byte(), r.byte(), r.byte(), r.byte()
	if r.err != nil {
		return Meta{}, r.err
	}
	if version < metaVersion {
		return Meta{}, fmt.Errorf("version %d: %w", version, ErrMeta)
	}
	m := Meta{
		Wire:            version,
		KeyScheme:       scheme,
		Draining:        flags&flagDraining != 0,
		HasDigest:       flags&flagHasDigest != 0,
		ModelsTruncated: flags&flagModelsTruncated != 0,
		StoreGone:       flags&flagStoreGone != 0,
	}
	switch {
	case flags&flagEngineDown != 0:
		m.Engine = route.EngineDown
	case flags&flagEngineStarting != 0:
		m.Engine = route.EngineStarting
	}
	m.APIAddr = string(r.bytes(int(apiLen)))
	m.DigestEpoch = r.uvarint()
	m.DigestVersion = r.uvarint()
	for _, p := range []*int{&m.Running, &m.Waiting, &m.KVUsageMilli, &m.Serving, &m.QueuedPrefill} {
		*p = r.int()
	}
	n := int(r.byte())
	for range n {
		if r.err != nil {
			break
		}
		l := int(r.byte())
		m.Models = append(m.Models, string(r.bytes(l)))
	}
	if version >= 2 && len(r.b) > 0 && r.err == nil {
		// A count this build cannot describe pins nothing (bloom.MaxRanks).
		if m.Ranks = r.int(); m.Ranks > bloom.MaxRanks {
			m.Ranks = 0
		}
		if len(r.b) > 0 && r.err == nil {
			m.EngineAddr = string(r.bytes(int(r.byte())))
		}
		// A stride this build cannot use is not said.
		if len(r.b) > 0 && r.err == nil {
			if m.Stride = r.int(); m.Stride > maxStride {
				m.Stride = 0
			}
		}
	}
	if r.err != nil {
		return Meta{}, r.err
	}
	return m, nil
}

type metaReader struct {
	b   []byte
	err error
}

func (r *metaReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("truncated %s: %w", what, ErrMeta)
	}
}

func (r *metaReader) byte() byte {
	if r.err != nil || len(r.b) < 1 {
		r.fail("byte")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *metaReader) bytes(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.fail("string")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *metaReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *metaReader) int() int {
	v := r.uvarint()
	if v > math.MaxInt32 {
		if r.err == nil {
			r.err = fmt.Errorf("integer %d out of range: %w", v, ErrMeta)
		}
		return 0
	}
	return int(v)
}

// PeerWire returns peer id's wire version as its meta says it, false for
// a peer not in the table or whose meta never decoded. A sender asks it
// before it writes a message kind or format newer than MinWireVersion
// (docs/compat.md).
func (m *Mesh) PeerWire(id string) (uint8, bool) {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	return m.table.wire(id)
}

// OldestWire returns the lowest wire version in the mesh as this node sees
// it: its own WireVersion and every peer's whose meta decoded. While it is
// 1 a v0.1.0 sidecar is a member, and everything goes in 1's forms.
func (m *Mesh) OldestWire() uint8 {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	return m.table.oldestWire()
}

func (t *table) wire(id string) (uint8, bool) {
	p := t.peers[id]
	if p == nil || !p.metaOK {
		return 0, false
	}
	return p.meta.Wire, true
}

func (t *table) oldestWire() uint8 {
	v := WireVersion
	for _, p := range t.peers {
		if p.metaOK {
			v = min(v, p.meta.Wire)
		}
	}
	return v
}
