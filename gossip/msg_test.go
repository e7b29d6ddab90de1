package gossip

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/respown"
	"github.com/kvroute/kvroute/route"
)

func testDigest(node string, epoch, version uint64, keys ...blockkey.Key) *bloom.Digest {
	return bloom.Build(bloom.Header{Node: node, Epoch: epoch, Version: version, Params: bloom.ParamsFor(1000, 0.01)}, keys)
}

// The payload of a decoded message, by kind; zero for another kind.
func digestOf(m message) *bloom.Digest { d, _ := m.body.(digestMsg); return d.Digest }
func deltaOf(m message) bloom.Delta    { x, _ := m.body.(deltaMsg); return x.Delta }
func needFullOf(m message) needFull    { n, _ := m.body.(needFull); return n }
func reportOf(m message) loadReport    { r, _ := m.body.(loadReport); return r }

// tagged is r with each claim's key cut to its tag (route.ClaimTag), all a
// claim is compared by and all a grouped claim carries.
func tagged(r loadReport) loadReport {
	r.Claims = slices.Clone(r.Claims)
	for i := range r.Claims {
		r.Claims[i].Key = blockkey.Key(route.ClaimTag(r.Claims[i].Key))
	}
	return r
}

func TestMsgRoundTrip(t *testing.T) {
	d := testDigest("a", 1, 5, 10, 11, 12)
	db, err := encodeDigest(d)
	if err != nil {
		t.Fatal(err)
	}
	x := bloom.Delta{Node: "a", Epoch: 1, From: 5, To: 6, Keys: []blockkey.Key{13, 14}}
	xb, err := encodeDelta(x)
	if err != nil {
		t.Fatal(err)
	}
	nf := needFull{Requester: "b", Origin: "a"}
	nb, err := encodeNeedFull(nf)
	if err != nil {
		t.Fatal(err)
	}

	got, err := decodeMsg(db)
	if err != nil || got.kind != kindDigest || digestOf(got).Header() != d.Header() || digestOf(got).PrefixLen([]blockkey.Key{10, 11, 12}) != 3 {
		t.Errorf("decodeMsg(digest) = %+v, %v; want digest %+v", got, err, d.Header())
	}
	got, err = decodeMsg(xb)
	if err != nil || got.kind != kindDelta {
		t.Fatalf("decodeMsg(delta) = %+v, %v", got, err)
	}
	if diff := cmp.Diff(x, deltaOf(got)); diff != "" {
		t.Errorf("decodeMsg(delta) mismatch (-want +got):\n%s", diff)
	}
	got, err = decodeMsg(nb)
	if err != nil || got.kind != kindNeedFull || needFullOf(got) != nf {
		t.Errorf("decodeMsg(need-full) = %+v, %v; want %+v", got, err, nf)
	}
	lr := loadReport{Node: "a", Seq: 1 << 62, Load: route.Load{Running: 3, Waiting: 2, KVUsage: 0.875, Serving: 7, Fronted: true, QueuedPrefillTokens: 9000},
		Claims: []peerClaim{{Peer: "b", Key: 1<<64 - 1, Keys: 512}, {Peer: "a", Key: 7, Keys: 1}},
		Engine: route.EngineDown, Epoch: 1 << 60, HasState: true, Version: 1<<64 - 1, HasVersion: true, Wire: WireVersion}
	lb, err := encodeLoad(lr)
	if err != nil {
		t.Fatal(err)
	}
	got, err = decodeMsg(lb)
	if err != nil || got.kind != kindLoad {
		t.Fatalf("decodeMsg(load) = %+v, %v", got, err)
	}
	if diff := cmp.Diff(lr, reportOf(got)); diff != "" {
		t.Errorf("decodeMsg(load) mismatch (-want +got):\n%s", diff)
	}
	// A report of the version before the engine state says nothing of it.
	stateless, _ := encodeLoad(loadReport{Node: "a", Seq: 3, Claims: lr.Claims}) // HasState false: no engine, no epoch
	if got, err := decodeMsg(stateless); err != nil || reportOf(got).HasState || len(reportOf(got).Claims) != 2 {
		t.Errorf("decodeMsg(load without state) = %+v, %v; want claims and HasState false", reportOf(got), err)
	}
	// A report of the version before claims decodes with none.
	noClaims := lr
	noClaims.Claims, noClaims.HasState = nil, false
	old, _ := encodeLoad(noClaims)
	old = old[:len(old)-1] // the claim count
	if got, err := decodeMsg(old); err != nil || len(reportOf(got).Claims) != 0 || reportOf(got).Load != lr.Load {
		t.Errorf("decodeMsg(load without claims) = %+v, %v; want the load and no claims", reportOf(got), err)
	}
	for _, bad := range []loadReport{{}, {Node: "a", Claims: []peerClaim{{Peer: "", Keys: 1}}}, {Node: "a", Claims: []peerClaim{{Peer: "b"}}},
		{Node: "a", Claims: make([]peerClaim, maxClaims+1)}} {
		if _, err := encodeLoad(bad); err == nil {
			t.Errorf("encodeLoad(%+v): no error", bad)
		}
	}
}

// TestLoadClaimGroups: where every member reads wire 2 a report's claims
// go at the end, grouped by peer in their order, and decode to the same
// claims, each key as its tag (route.ClaimTag); a report that ends before
// the end (v0.1.0's form, no state, no digest version) keeps them in the
// middle with their whole keys. A Deployment pod's name is most of a
// claim in the middle: a request's nine claims on one pod take under a
// quarter of the bytes grouped.
func TestLoadClaimGroups(t *testing.T) {
	pod := "vllm-llama-7b9f6c5d48-x2k4q"
	nine := make([]peerClaim, 9)
	for i := range nine {
		nine[i] = peerClaim{Peer: pod, Key: blockkey.Key(1000 + i), Keys: 28 + 10*i}
	}
	full := loadReport{Node: "a", Seq: 7, Load: route.Load{Running: 1, Fronted: true}, Engine: route.EngineServing,
		Epoch: 2, HasState: true, Version: 9, HasVersion: true, Wire: WireVersion}
	for _, tt := range []struct {
		name   string
		claims []peerClaim
	}{
		{"none", nil},
		{"one request's", nine},
		{"runs", []peerClaim{{Peer: "b", Key: 1, Keys: 1}, {Peer: "b", Key: 2, Keys: 2}, {Peer: "c", Key: 3, Keys: 300},
			{Peer: "b", Key: 4, Keys: 4}}},
		{"wide keys", []peerClaim{{Peer: "b", Key: 1<<64 - 1, Keys: 512}, {Peer: "b", Key: 0xdead_beef_0000_0007, Keys: 600}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := full
			r.Claims, r.GroupClaims = tt.claims, true
			b, err := encodeLoad(r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeLoad(b[1:])
			want := r
			want.Claims = nil
			for _, c := range tt.claims {
				c.Key = blockkey.Key(route.ClaimTag(c.Key))
				want.Claims = append(want.Claims, c)
			}
			if err != nil || !cmp.Equal(want, got, cmpopts.EquateEmpty()) {
				t.Errorf("decodeLoad(grouped) = %+v, %v; want %+v", got, err, want)
			}
		})
	}
	grouped, middle := full, full
	grouped.Claims, grouped.GroupClaims, middle.Claims = nine, true, nine
	gb, _ := encodeLoad(grouped)
	mb, _ := encodeLoad(middle)
	if got, want := len(gb)-len(mb), 1+1+len(pod)+1+9*5-9*(1+len(pod)+8+1); got != want || 4*(len(gb)-20) > len(mb) {
		t.Errorf("grouped report %d bytes, in the middle %d: %d apart; want %d (a quarter or less of the claims' bytes)", len(gb), len(mb), got, want)
	}
	for _, r := range []loadReport{
		{Node: "a", Claims: nine, GroupClaims: true},                                                        // no state
		{Node: "a", Claims: nine, HasState: true, Wire: 1, Version: 3, HasVersion: true, GroupClaims: true}, // v0.1.0's form
		{Node: "a", Claims: nine, HasState: true, GroupClaims: true},                                        // no digest version
	} {
		b, err := encodeLoad(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeLoad(b[1:])
		if err != nil || got.GroupClaims || !cmp.Equal(got.Claims, nine) {
			t.Errorf("decodeLoad(%+v's bytes) = %+v, %v; want the claims in the middle", r, got, err)
		}
	}
	for _, tail := range [][]byte{
		{1, 1, 'b', 0},                // a group of no claims
		{1, 1, 'b', 1, 1, 2, 3},       // truncated key
		{1, 1, 'b', 1, 1, 0, 0, 0, 0}, // depth 0
		{1, 0},                        // empty peer
		{maxClaims + 1},               // too many groups
		{2, 1, 'b', 1, 1, 0, 0, 0, 1, 1, 'c', maxClaims}, // over maxClaims in all
	} {
		b, _ := encodeLoad(full)
		if _, err := decodeLoad(append(b[1:], tail...)); err == nil {
			t.Errorf("decodeLoad(report, then %x): no error", tail)
		}
	}
}

// A mesh groups its reports' claims only while every member reads wire 2.
func TestReportGroupsClaims(t *testing.T) {
	m := cluster(t, 1, nil)[0]
	if r, _, _, ok := m.nextReport(); !ok || !r.GroupClaims {
		t.Errorf("nextReport alone = %+v, %v; want GroupClaims", r, ok)
	}
	m.tableMu.Lock()
	m.table.upsert("old", Meta{Wire: 1}, true, time.Now())
	m.tableMu.Unlock()
	if r, _, _, ok := m.nextReport(); !ok || r.GroupClaims {
		t.Errorf("nextReport beside a v0.1.0 member = %+v, %v; want the claims in the middle", r, ok)
	}
}

// loadV010 is a load report as v0.1.0 (a2f31aa) encodes loadReport{Node:
// "p", Seq: 9, Load: {Running: 1, Serving: 2}, Claims: {{Peer: "q", Key:
// 5, Keys: 3}}, Engine: serving, Epoch: 4, HasState: true}: it ends at the
// epoch.
var loadV010 = []byte{kindLoad, 1, 'p', 9, 1, 0, 0, 2, 0, 1, 1, 'q', 5, 0, 0, 0, 0, 0, 0, 0, 3, 0, 4}

// TestLoadWireV010: this build reads v0.1.0's report as wire 1, and what it
// writes is v0.1.0's bytes and then the wire version, the prefill share
// and the digest version, which v0.1.0's decoder, reading up to the epoch,
// ignores. A report that ends at the wire version (an earlier build of
// this version) has no share, one that ends at the share no digest version.
func TestLoadWireV010(t *testing.T) {
	want := loadReport{Node: "p", Seq: 9, Load: route.Load{Running: 1, Serving: 2, Fronted: true},
		Claims: []peerClaim{{Peer: "q", Key: 5, Keys: 3}}, Engine: route.EngineServing, Epoch: 4, HasState: true, Wire: 1}
	got, err := decodeMsg(loadV010)
	if err != nil {
		t.Fatalf("decodeMsg(v0.1.0's load) error %v", err)
	}
	if diff := cmp.Diff(want, reportOf(got)); diff != "" {
		t.Errorf("decodeMsg(v0.1.0's load) mismatch (-want +got):\n%s", diff)
	}
	if b, err := encodeLoad(want); err != nil || !bytes.Equal(b, loadV010) {
		t.Errorf("encodeLoad(Wire 1) = %x, %v; want v0.1.0's bytes %x", b, err, loadV010)
	}
	want.Wire = 0 // as load.go builds it: this build's
	want.Load.PrefillShare = 0.2
	b, err := encodeLoad(want)
	if err != nil || !bytes.Equal(b, append(slices.Clip(loadV010), WireVersion, 200, 1)) {
		t.Errorf("encodeLoad = %x, %v; want v0.1.0's bytes then %d and 200 (uvarint)", b, err, WireVersion)
	}
	noShare := append(slices.Clip(loadV010), WireVersion)
	got, err = decodeMsg(noShare)
	if r := reportOf(got); err != nil || r.Wire != WireVersion || r.Load.PrefillShare != 0 {
		t.Errorf("decodeMsg(no share) = %+v, %v; want wire %d, no share", r, err, WireVersion)
	}
	// With the digest version after the share: v0.1.0 read it from the
	// meta, which then changed with every delta.
	want.Version, want.HasVersion = 300, true
	b, err = encodeLoad(want)
	if err != nil || !bytes.Equal(b, append(slices.Clip(loadV010), WireVersion, 200, 1, 0xac, 0x02, 0)) {
		t.Errorf("encodeLoad(version 300) = %x, %v; want v0.1.0's bytes then %d, 200, 300 and 0 prefilling (uvarints)", b, err, WireVersion)
	}
	if _, err := decodeMsg(append(slices.Clip(loadV010), WireVersion, 200, 1, 0xac)); err == nil {
		t.Error("decodeMsg(truncated digest version): no error")
	}
	// An earlier development build's: the digest version ends it.
	got, err = decodeMsg(append(slices.Clip(loadV010), WireVersion, 200, 1, 0xac, 0x02))
	if r := reportOf(got); err != nil || r.Wire != WireVersion || r.Version != 300 || r.Load.Prefilling != 0 {
		t.Errorf("decodeMsg(no prefilling) = %+v, %v; want %+v", r, err, want)
	}
	if _, err := decodeMsg(append(slices.Clip(loadV010), WireVersion, 200, 1, 0xac, 0x02, 0xff)); err == nil {
		t.Error("decodeMsg(truncated prefilling): no error")
	}
	// A newer version's report: its wire version, the share, the digest
	// version, the prefilling count, no claim groups, then fields this
	// build does not know, read as far as it knows them.
	want.Load.Prefilling = 255
	newer := append(slices.Clip(loadV010), WireVersion+1, 200, 1, 0xac, 0x02, 0xff, 0x01, 0, 'x')
	got, err = decodeMsg(newer)
	want.Wire, want.GroupClaims = WireVersion+1, true
	if err != nil || !cmp.Equal(want, reportOf(got)) {
		t.Errorf("decodeMsg(newer load) = %+v, %v; want %+v", reportOf(got), err, want)
	}
	if _, err := decodeMsg(append(slices.Clip(loadV010), WireVersion, 0xe9, 0x07)); err == nil {
		t.Error("decodeMsg(share 1001 thousandths): no error")
	}
}

// TestDecodeMsgNewer: what a newer version may send that this one cannot
// read is ErrNewer, not malformed.
func TestDecodeMsgNewer(t *testing.T) {
	db, _ := encodeDigest(testDigest("a", 1, 1, 1))
	format3 := slices.Clone(db)
	format3[1+4] = bloom.FormatRemovals + 1
	rb, _ := encodeResponses(responsesMsg{Entries: []respown.Entry{{ID: "own", Node: "a"}}})
	resp2 := slices.Clone(rb)
	resp2[1]++
	for _, tt := range []struct {
		name string
		in   []byte
	}{
		{"unknown kind in kvroute's range", []byte{kindResponses + 1, 1, 2}},
		{"last kind byte", []byte{kindLast}},
		{"digest format 3", format3},
		{"responses version 2", resp2},
	} {
		m, err := decodeMsg(tt.in)
		if !errors.Is(err, ErrNewer) || errors.Is(err, ErrMsg) {
			t.Errorf("%s: decodeMsg(%x) = %+v, %v; want ErrNewer and not ErrMsg", tt.name, tt.in, m, err)
		}
	}
}

func TestDecodeMsgErrors(t *testing.T) {
	xb, _ := encodeDelta(bloom.Delta{Node: "a", Epoch: 1, From: 1, To: 2, Keys: []blockkey.Key{1}})
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"unknown kind", []byte{0x01, 2, 3}},
		{"kind only", []byte{kindDigest}},
		{"truncated delta", xb[:len(xb)-3]},
		{"delta as digest", append([]byte{kindDigest}, xb[1:]...)},
		{"need-full truncated", []byte{kindNeedFull, 5, 'a'}},
		{"need-full trailing", []byte{kindNeedFull, 1, 'a', 1, 'b', 0}},
		{"need-full empty name", []byte{kindNeedFull, 0, 1, 'b'}},
		{"load empty name", []byte{kindLoad, 0, 1, 1, 1, 1, 1, 1}},
		{"load truncated", []byte{kindLoad, 1, 'a', 1, 2, 3}},
		{"load claim truncated", append(append([]byte{kindLoad, 1, 'a', 1, 0, 0, 0, 0, 0}, 1, 1, 'b'), make([]byte, 5)...)},
		{"load claim zero keys", append(append([]byte{kindLoad, 1, 'a', 1, 0, 0, 0, 0, 0}, 1, 1, 'b'), make([]byte, 9)...)},
		{"load too many claims", []byte{kindLoad, 1, 'a', 1, 0, 0, 0, 0, 0, 99}},
		{"load bad engine state", []byte{kindLoad, 1, 'a', 1, 0, 0, 0, 0, 0, 0, 3, 0}},
		{"load epoch truncated", []byte{kindLoad, 1, 'a', 1, 0, 0, 0, 0, 0, 0, 1, 0x80}},
		{"load field too big", []byte{kindLoad, 1, 'a', 1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0}},
		{"load wire version 1 written", append(slices.Clip(loadV010), 1)},
		{"load wire version 0", append(slices.Clip(loadV010), 0)},
		{"kind past kvroute's range", []byte{kindLast + 1}},
		{"kind before it", []byte{kindFirst - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := decodeMsg(tt.in); !errors.Is(err, ErrMsg) {
				t.Errorf("decodeMsg(%x) = %+v, %v; want ErrMsg", tt.in, m, err)
			}
		})
	}
}

func FuzzDigestMsg(f *testing.F) {
	small := bloom.Build(bloom.Header{Node: "n", Epoch: 1, Version: 1, Params: bloom.Params{M: 128, K: 3}}, []blockkey.Key{1, 2})
	db, _ := encodeDigest(small)
	xb, _ := encodeDelta(bloom.Delta{Node: "n", Epoch: 1, From: 1, To: 2, Keys: []blockkey.Key{3, 4}})
	nb, _ := encodeNeedFull(needFull{Requester: "r", Origin: "n"})
	lb, _ := encodeLoad(loadReport{Node: "n", Seq: 5, Load: route.Load{Running: 1, KVUsage: 0.5, Serving: 2}, Claims: []peerClaim{{Peer: "p", Key: 9, Keys: 4}}})
	sb, _ := encodeLoad(loadReport{Node: "n", Seq: 6, Engine: route.EngineDown, Epoch: 7, HasState: true})
	gb, _ := encodeLoad(loadReport{Node: "n", Seq: 8, Claims: []peerClaim{{Peer: "p", Key: 9, Keys: 4}, {Peer: "p", Key: 10, Keys: 8}, {Peer: "q", Key: 11, Keys: 2}},
		HasState: true, HasVersion: true, Version: 3, GroupClaims: true}) // claims at the end, by peer
	// A report of the version before claims and state: it must re-encode as
	// it came (the fuzzer's first find after the state was added).
	pre := []byte("\xd4\x010000000")
	newer := append(slices.Clip(loadV010), WireVersion+1, 9)
	shared := append(slices.Clip(loadV010), WireVersion, 200, 1)                // a prefill share of 0.2
	versioned := append(slices.Clip(loadV010), WireVersion, 200, 1, 0xac, 0x02) // and digest version 300
	prefilling := append(slices.Clip(versioned), 3)                             // and 3 waiting for a first token
	tb, _ := encodeTextPrefix(TextPrefix{Hash: 7, Tokens: 40, Bytes: 160, Keys: []blockkey.Key{1, 2}})
	rb, _ := encodeResponses(responsesMsg{State: true, Entries: []respown.Entry{{ID: "resp_0123456789abcdef0123456789abcdef", Node: "n"}, {ID: "own", Node: "p"}}})
	// Claims in the middle (whole keys) and an empty group at the end: no
	// version writes both, and re-encoded they all go at the end as tags
	// (CI's fuzzer found it).
	both, _ := encodeLoad(loadReport{Node: "n", Seq: 9, Claims: []peerClaim{{Peer: "p", Key: 0x3030303030303030, Keys: 4}}, HasState: true, HasVersion: true, Version: 3})
	both = append(both, 0)
	for _, b := range [][]byte{db, xb, nb, lb, sb, gb, both, pre, loadV010, newer, shared, versioned, prefilling, tb, rb, {kindDigest}, {}} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMsg(b)
		if err != nil {
			return
		}
		if slotOf(m.kind) < 0 {
			t.Fatalf("decodeMsg returned kind %#x", m.kind)
		}
		again, err := m.body.encode()
		if err != nil {
			t.Fatalf("re-encode kind %#x: %v", m.kind, err)
		}
		m2, err := decodeMsg(again)
		if err != nil {
			t.Fatalf("decodeMsg(re-encoded) error %v", err)
		}
		if m2.kind != m.kind {
			t.Fatalf("kind %#x after round trip; want %#x", m2.kind, m.kind)
		}
		if m.kind == kindLoad && !cmp.Equal(tagged(reportOf(m2)), tagged(reportOf(m))) {
			t.Fatalf("load %+v after round trip; want %+v (keys compared by tag)", reportOf(m2), reportOf(m))
		}
		if m.kind == kindDigest && digestOf(m2).Header() != digestOf(m).Header() {
			t.Fatalf("digest header %+v after round trip; want %+v", digestOf(m2).Header(), digestOf(m).Header())
		}
	})
}
