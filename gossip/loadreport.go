package gossip

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// loadReport is a node's load, pushed straight to every member whenever it
// changes (at most once per Config.LoadPushInterval). Seq orders reports
// from one node: UDP may deliver them reversed. Wire form:
//
//	kind | name len u8 | name | seq uvarint | running uvarint |
//	waiting uvarint | kv usage milli uvarint | serving uvarint |
//	queued prefill uvarint | claim count uvarint |
//	(peer len u8 | peer | key u64 LE | keys uvarint)* |
//	engine u8 | digest epoch uvarint | wire version u8 |
//	prefill share milli uvarint | digest version uvarint |
//	prefilling uvarint |
//	claim group count uvarint |
//	(peer len u8 | peer | claims uvarint | (key u64 LE | keys uvarint)*)*
//
// Decoders ignore bytes after the last field they know, so a later version
// may append fields: v0.1.0 reads up to the digest epoch and ignores the
// wire version after it, which v0.2.0 appended. A report without the
// claims part has none; one that ends at the epoch is v0.1.0's (Wire 1);
// one that ends at the wire version has no prefill share, one that ends
// at the share no digest version, and one that ends at the version no
// prefilling count (earlier v0.2.0 development builds: 0).
//
// Claims go in one of two places. Where every member reads wire 2
// (GroupClaims), they go at the end, grouped by the peer they claim, and
// the count in the middle is 0: a request's claims (up to ten) all name
// one pod, whose name was most of each claim's bytes (37 bytes a claim
// with a Deployment pod's name, 9 grouped), and every member receives
// every front's claims. Otherwise (a v0.1.0 member, whose decoder stops
// at the epoch) they go in the middle, each with its peer, as v0.1.0
// reads them.
// A pushed load is Fronted: only sidecars push, and they count every
// request their pod serves.
type loadReport struct {
	Node   string
	Seq    uint64
	Load   route.Load
	Claims []peerClaim // what the sender just placed where (route.Claim)
	// Engine and Epoch are the sender's engine and the epoch of the digest
	// it advertises (0: none, withdrawn). A report only as far as the claims
	// (an earlier version) has HasState false: it says nothing of either,
	// and encodeLoad writes such a report without them.
	Engine   route.Engine
	Epoch    uint64
	HasState bool
	// Version is the version of the digest of Epoch, when HasVersion:
	// a peer whose copy stays behind it lost the last delta. v0.1.0 read it
	// from the node meta, which then changed with every delta.
	Version    uint64
	HasVersion bool
	// Wire is the sender's WireVersion, carried after the state: 1 for a
	// report without it (v0.1.0's, or one without state). encodeLoad
	// writes 0 as this build's WireVersion and 1 as nothing, as v0.1.0
	// wrote it.
	Wire uint8
	// GroupClaims puts the claims at the end, grouped by peer: set when
	// every member reads wire 2, and by decodeLoad when they came so.
	// encodeLoad writes them in the middle when the report ends before
	// the end (Wire 1, no state or no version).
	GroupClaims bool
}

// peerClaim is a route.Claim about Peer, as it travels (no time).
type peerClaim struct {
	Peer string
	Key  blockkey.Key
	Keys int
}

// maxClaims bounds the claims one report carries, so it stays one UDP
// packet: 24 claims of 64-byte names is under 2.1 KB, of pod names under 1 KB.
const maxClaims = 24

func encodeLoad(r loadReport) ([]byte, error) {
	if len(r.Node) == 0 || len(r.Node) > 255 {
		return nil, fmt.Errorf("encode load: node name of %d bytes", len(r.Node))
	}
	l := r.Load
	b := make([]byte, 0, 2+len(r.Node)+6*binary.MaxVarintLen64)
	b = append(b, kindLoad, byte(len(r.Node)))
	b = append(b, r.Node...)
	b = binary.AppendUvarint(b, r.Seq)
	for _, v := range []int{l.Running, l.Waiting, kvMilli(l.KVUsage), l.Serving, l.QueuedPrefillTokens} {
		b = binary.AppendUvarint(b, uint64(max(v, 0)))
	}
	if len(r.Claims) > maxClaims {
		return nil, fmt.Errorf("encode load: %d claims, at most %d", len(r.Claims), maxClaims)
	}
	for _, c := range r.Claims {
		if len(c.Peer) == 0 || len(c.Peer) > 255 || c.Keys < 1 {
			return nil, fmt.Errorf("encode load: claim on %q of %d keys", c.Peer, c.Keys)
		}
	}
	grouped := r.GroupClaims && r.HasState && r.HasVersion && r.Wire != 1
	if grouped {
		b = append(b, 0) // no claims here: at the end
	} else {
		b = binary.AppendUvarint(b, uint64(len(r.Claims)))
		for _, c := range r.Claims {
			b = append(b, byte(len(c.Peer)))
			b = append(b, c.Peer...)
			b = appendClaim(b, c)
		}
	}
	if !r.HasState {
		return b, nil // as an earlier version sent it: engine and epoch unknown
	}
	b = append(b, byte(r.Engine))
	b = binary.AppendUvarint(b, r.Epoch)
	switch r.Wire {
	case 0:
		b = append(b, WireVersion)
	case 1:
		return b, nil // v0.1.0's ends at the epoch
	default:
		b = append(b, r.Wire)
	}
	b = binary.AppendUvarint(b, uint64(min(kvMilli(l.PrefillShare), 1000)))
	if !r.HasVersion {
		return b, nil
	}
	b = binary.AppendUvarint(b, r.Version)
	b = binary.AppendUvarint(b, uint64(max(l.Prefilling, 0)))
	if !grouped {
		return b, nil
	}
	return appendClaimGroups(b, r.Claims), nil
}

// appendClaimGroups appends claims grouped by peer: each run of claims on
// one peer is a group, so the order stays theirs. A grouped claim is its
// key's tag (route.ClaimTag) and its depth: 5 or 6 bytes where one in the
// middle takes 9 or 10 and its peer's name.
func appendClaimGroups(b []byte, cs []peerClaim) []byte {
	groups := 0
	for i := range cs {
		if i == 0 || cs[i].Peer != cs[i-1].Peer {
			groups++
		}
	}
	b = binary.AppendUvarint(b, uint64(groups))
	for i := 0; i < len(cs); {
		j := i + 1
		for j < len(cs) && cs[j].Peer == cs[i].Peer {
			j++
		}
		b = append(b, byte(len(cs[i].Peer)))
		b = append(b, cs[i].Peer...)
		b = binary.AppendUvarint(b, uint64(j-i))
		for _, c := range cs[i:j] {
			b = binary.LittleEndian.AppendUint32(b, route.ClaimTag(c.Key))
			b = binary.AppendUvarint(b, uint64(c.Keys))
		}
		i = j
	}
	return b
}

// appendClaim appends a claim's whole key and depth, its peer written
// before: the middle of a report, where v0.1.0 reads it.
func appendClaim(b []byte, c peerClaim) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Key))
	return binary.AppendUvarint(b, uint64(c.Keys))
}

// claimOf reads a claim's key and depth from b (peer set by the caller),
// and how many bytes they took, 0 when b does not hold them: a key of
// size bytes, 8 in the middle of a report, 4 (its tag) in a group.
func claimOf(b []byte, size int) (key blockkey.Key, keys, n int) {
	if len(b) < size {
		return 0, 0, 0
	}
	v, k := binary.Uvarint(b[size:])
	if k <= 0 || v < 1 || v > math.MaxInt32 {
		return 0, 0, 0
	}
	if size == 4 {
		return blockkey.Key(binary.LittleEndian.Uint32(b)), int(v), size + k
	}
	return blockkey.Key(binary.LittleEndian.Uint64(b)), int(v), size + k
}

// decodeClaimGroups reads the claims at the end of a report into r.
func decodeClaimGroups(b []byte, r *loadReport) error {
	groups, k := binary.Uvarint(b)
	if k <= 0 || groups > maxClaims {
		return fmt.Errorf("claim groups: truncated or over %d", maxClaims)
	}
	b, r.GroupClaims = b[k:], true
	for g := range int(groups) {
		if len(b) < 1 || b[0] == 0 || len(b) < 1+int(b[0]) {
			return fmt.Errorf("claim group %d: truncated or empty peer", g)
		}
		peer := string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
		n, k := binary.Uvarint(b)
		if k <= 0 || n < 1 || n > maxClaims || len(r.Claims)+int(n) > maxClaims {
			return fmt.Errorf("claim group %d: none, truncated or over %d claims in all", g, maxClaims)
		}
		b = b[k:]
		for i := range int(n) {
			key, keys, k := claimOf(b, 4)
			if k == 0 {
				return fmt.Errorf("claim group %d, claim %d: truncated or bad prefix length", g, i)
			}
			r.Claims, b = append(r.Claims, peerClaim{Peer: peer, Key: key, Keys: keys}), b[k:]
		}
	}
	return nil // bytes after it are a newer version's fields
}

func decodeLoad(b []byte) (loadReport, error) {
	if len(b) < 1 || int(b[0]) == 0 || len(b) < 1+int(b[0]) {
		return loadReport{}, fmt.Errorf("truncated or empty node name")
	}
	r := loadReport{Node: string(b[1 : 1+int(b[0])]), Wire: 1}
	b = b[1+int(b[0]):]
	var f [6]uint64
	for i := range f {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return loadReport{}, fmt.Errorf("load field %d: truncated or over 64 bits", i)
		}
		f[i], b = v, b[n:]
	}
	for i, v := range f[1:] {
		if v > math.MaxInt32 {
			return loadReport{}, fmt.Errorf("load field %d: %d out of range", i+1, v)
		}
	}
	r.Seq = f[0]
	r.Load = route.Load{Running: int(f[1]), Waiting: int(f[2]), KVUsage: float64(f[3]) / 1000,
		Serving: int(f[4]), Fronted: true, QueuedPrefillTokens: int(f[5])}
	if len(b) == 0 {
		return r, nil // an earlier version: no claims
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxClaims {
		return loadReport{}, fmt.Errorf("claim count: truncated or over %d", maxClaims)
	}
	b = b[k:]
	for i := range int(n) {
		if len(b) < 1 || b[0] == 0 || len(b) < 1+int(b[0])+8 {
			return loadReport{}, fmt.Errorf("claim %d: truncated or empty peer", i)
		}
		peer := string(b[1 : 1+int(b[0])])
		key, keys, k := claimOf(b[1+int(b[0]):], 8)
		if k == 0 {
			return loadReport{}, fmt.Errorf("claim %d: bad prefix length", i)
		}
		r.Claims = append(r.Claims, peerClaim{Peer: peer, Key: key, Keys: keys})
		b = b[1+int(b[0])+k:]
	}
	if len(b) == 0 {
		return r, nil // an earlier version: no engine state
	}
	if route.Engine(b[0]) > route.EngineDown {
		return loadReport{}, fmt.Errorf("engine state %d", b[0])
	}
	r.Engine, b = route.Engine(b[0]), b[1:]
	v, k := binary.Uvarint(b)
	if k <= 0 {
		return loadReport{}, fmt.Errorf("digest epoch: truncated or over 64 bits")
	}
	r.Epoch, r.HasState, b = v, true, b[k:]
	if len(b) == 0 {
		return r, nil // v0.1.0's: no wire version
	}
	if b[0] < 2 {
		return loadReport{}, fmt.Errorf("wire version %d after the state", b[0])
	}
	r.Wire, b = b[0], b[1:]
	if len(b) == 0 {
		return r, nil // no prefill share
	}
	v, k = binary.Uvarint(b)
	if k <= 0 || v > 1000 {
		return loadReport{}, fmt.Errorf("prefill share: truncated or over 1000 thousandths")
	}
	r.Load.PrefillShare, b = float64(v)/1000, b[k:]
	if len(b) == 0 {
		return r, nil // no digest version
	}
	v, k = binary.Uvarint(b)
	if k <= 0 {
		return loadReport{}, fmt.Errorf("digest version: truncated or over 64 bits")
	}
	r.Version, r.HasVersion, b = v, true, b[k:]
	if len(b) == 0 {
		return r, nil // no prefilling count
	}
	v, k = binary.Uvarint(b)
	if k <= 0 || v > math.MaxInt32 {
		return loadReport{}, fmt.Errorf("prefilling: truncated or out of range")
	}
	r.Load.Prefilling, b = int(v), b[k:]
	if len(b) == 0 {
		return r, nil // no claims at the end
	}
	if err := decodeClaimGroups(b, &r); err != nil {
		return loadReport{}, err
	}
	return r, nil
}

// kvMilli is KV usage in thousandths, clamped to what the wire carries.
func kvMilli(kv float64) int {
	if !(kv > 0) { // also NaN
		return 0
	}
	return int(math.Min(kv, math.MaxInt32/1000)*1000 + 0.5)
}

func decodeLoadMsg(b []byte) (payload, error) {
	r, err := decodeLoad(b)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (r loadReport) encode() ([]byte, error) { return encodeLoad(r) }

// apply records the sender's load and state, then the claims it carries.
// Claims hold whatever the report's order: each is a fact of its own. A
// report of a newer wire version was read as far as this build knows it,
// and is counted (Stats.NewerRead).
func (r loadReport) apply(m *Mesh, now time.Time) {
	if r.Wire > WireVersion {
		m.stats.newerRead.Add(1)
	}
	m.tableMu.Lock()
	o := m.table.applyLoad(r, now)
	m.tableMu.Unlock()
	if o == unknown {
		m.stats.unknownOrigin.Add(1)
	}
	if len(r.Claims) == 0 {
		return
	}
	m.load.mu.Lock()
	defer m.load.mu.Unlock()
	for _, c := range r.Claims {
		m.claimLocked(c.Peer, now, route.Claim{Key: c.Key, Keys: c.Keys})
	}
}
