package bloom

import (
	"testing"

	"github.com/kvroute/kvroute/blockkey"
)

func TestTagPlainForRankZeroGPU(t *testing.T) {
	places := [][2]int{{0, 1}, {1, 0}, {2, 0}, {1, 1}, {2, 3}, {0, 255}}
	for _, k := range uniformKeys(3, 200) {
		if got := Tag(k, TierGPU, 0); got != k {
			t.Fatalf("Tag(%x, GPU, 0) = %x; want the key itself", k, got)
		}
		seen := map[blockkey.Key][2]int{k: {0, 0}}
		for _, p := range places {
			g := Tag(k, uint8(p[0]), p[1])
			if q, dup := seen[g]; dup {
				t.Fatalf("Tag(%x) collides for places %v and %v", k, q, p)
			}
			seen[g] = p
		}
	}
}

// tieredDigest builds the digest of a pod holding keys[:gpu] on rank's
// GPU and, at stride-aligned positions, the lower-tier entries given by
// tiers (index → tier).
func tieredDigest(keys []blockkey.Key, rank, gpu, stride int, tiers map[int]uint8, ranks int) *Digest {
	var entries []blockkey.Key
	for i := range gpu {
		entries = append(entries, Tag(keys[i], TierGPU, rank))
	}
	for j, t := range tiers {
		entries = append(entries, Tag(keys[j], t, rank))
	}
	if len(tiers) > 0 {
		entries = append(entries, TierMarker(stride))
	}
	for r := 1; r < ranks; r++ {
		entries = append(entries, RankMarker(r))
	}
	return Build(Header{Node: "p", Params: ParamsFor(1000, 0.001)}, entries)
}

func TestTierPrefix(t *testing.T) {
	keys := uniformKeys(11, 24)
	tests := []struct {
		name            string
		gpu             int
		tiers           map[int]uint8
		rank, ranks     int
		ask             int // rank looked up
		wantG, wantC    int
		wantD, wantRank int
	}{
		{name: "GPU only", gpu: 6, wantG: 6, wantRank: 1},
		{name: "CPU beyond the GPU prefix, each entry standing for the keys since the last",
			gpu: 5, tiers: map[int]uint8{7: TierCPU, 11: TierCPU, 15: TierCPU}, wantG: 5, wantC: 11, wantRank: 1},
		{name: "CPU then disk", gpu: 2, tiers: map[int]uint8{3: TierCPU, 7: TierCPU, 11: TierDisk, 15: TierDisk},
			wantG: 2, wantC: 6, wantD: 8, wantRank: 1},
		{name: "a gap at an aligned position ends the extension",
			gpu: 4, tiers: map[int]uint8{7: TierCPU, 11: TierCPU, 19: TierCPU}, wantG: 4, wantC: 8, wantRank: 1},
		{name: "one entry is no extension (a false positive would credit a stride)",
			gpu: 4, tiers: map[int]uint8{7: TierCPU}, wantG: 4, wantRank: 1},
		{name: "lower tier from the first key", tiers: map[int]uint8{3: TierCPU, 7: TierCPU}, wantC: 8, wantRank: 1},
		{name: "entries before the GPU prefix end are GPU blocks", gpu: 12, tiers: map[int]uint8{3: TierCPU, 7: TierCPU, 15: TierCPU, 19: TierCPU},
			wantG: 12, wantC: 8, wantRank: 1},
		{name: "rank 1's entries", gpu: 6, rank: 1, ranks: 2, ask: 1, wantG: 6, wantRank: 2},
		{name: "rank 1's entries are not rank 0's", gpu: 6, rank: 1, ranks: 2, ask: 0, wantRank: 2},
		{name: "rank 1's lower tier", gpu: 1, tiers: map[int]uint8{3: TierCPU, 7: TierDisk}, rank: 1, ranks: 3, ask: 1,
			wantG: 1, wantC: 3, wantD: 4, wantRank: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := tieredDigest(keys, tc.rank, tc.gpu, 4, tc.tiers, tc.ranks)
			g, c, dk := d.TierPrefix(keys, tc.ask)
			if g != tc.wantG || c != tc.wantC || dk != tc.wantD {
				t.Errorf("TierPrefix(rank %d) = %d, %d, %d; want %d, %d, %d", tc.ask, g, c, dk, tc.wantG, tc.wantC, tc.wantD)
			}
			if got := d.Ranks(); got != tc.wantRank {
				t.Errorf("Ranks() = %d; want %d", got, tc.wantRank)
			}
			if want := 4 * min(len(tc.tiers), 1); d.TierStride() != want {
				t.Errorf("TierStride() = %d; want %d", d.TierStride(), want)
			}
			if tc.ask == 0 && d.PrefixLen(keys) != g {
				t.Errorf("PrefixLen = %d; TierPrefix(rank 0) gpu = %d", d.PrefixLen(keys), g)
			}
		})
	}
}

func TestTierStrideMarkers(t *testing.T) {
	keys := uniformKeys(5, 4*16)
	for _, s := range tierStrides {
		tiers := map[int]uint8{}
		for j := s - 1; j < 3*s; j += s {
			tiers[j] = TierCPU
		}
		d := tieredDigest(keys, 0, 0, s, tiers, 1)
		if d.TierStride() != s {
			t.Fatalf("stride %d: TierStride() = %d", s, d.TierStride())
		}
		if _, c, _ := d.TierPrefix(keys, 0); c != 3*s {
			t.Errorf("stride %d: cpu keys %d; want %d", s, c, 3*s)
		}
		if !TierStrideOK(s) {
			t.Errorf("TierStrideOK(%d) = false", s)
		}
	}
	if TierStrideOK(3) {
		t.Error("TierStrideOK(3) = true; a stride the scan never tests")
	}
}

// The markers survive the wire and arrive by delta: a peer learns a tier
// or a rank when the owner first has one, without a full digest.
func TestTierMarkersByDeltaAndWire(t *testing.T) {
	keys := uniformKeys(8, 16)
	d := Build(Header{Node: "p", Epoch: 1, Version: 1, Params: ParamsFor(1000, 0.001)}, keys[:4])
	if d.Ranks() != 1 || d.TierStride() != 0 {
		t.Fatalf("GPU-only digest: Ranks %d, TierStride %d; want 1, 0", d.Ranks(), d.TierStride())
	}
	x := Delta{Node: "p", Epoch: 1, From: 1, To: 2, Keys: []blockkey.Key{
		Tag(keys[7], TierCPU, 0), Tag(keys[11], TierCPU, 0), TierMarker(4), RankMarker(1), Tag(keys[0], TierGPU, 1)}}
	n, err := d.Apply(x)
	if err != nil {
		t.Fatal(err)
	}
	if n.Ranks() != 2 || n.TierStride() != 4 {
		t.Fatalf("after delta: Ranks %d, TierStride %d; want 2, 4", n.Ranks(), n.TierStride())
	}
	b, err := n.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, dd := range []*Digest{n, back} {
		if g, c, _ := dd.TierPrefix(keys, 0); g != 4 || c != 8 {
			t.Errorf("rank 0: %d GPU, %d CPU keys; want 4, 8", g, c)
		}
		if g, _, _ := dd.TierPrefix(keys, 1); g != 1 {
			t.Errorf("rank 1: %d GPU keys; want 1", g)
		}
	}
	if back.Ranks() != 2 || back.TierStride() != 4 {
		t.Errorf("decoded: Ranks %d, TierStride %d; want 2, 4", back.Ranks(), back.TierStride())
	}
	var nilD *Digest
	if g, c, dk := nilD.TierPrefix(keys, 0); g+c+dk != 0 || nilD.Ranks() != 1 || nilD.TierStride() != 0 {
		t.Errorf("nil digest: %d %d %d, ranks %d, stride %d", g, c, dk, nilD.Ranks(), nilD.TierStride())
	}
}

// An untiered digest at its design load looks tiered or multi-rank only by
// a marker's false positive: about the digest's rate per marker tested.
func TestMarkerFalsePositives(t *testing.T) {
	const digests, n = 400, 2000
	p := ParamsFor(n, 0.01)
	tiered, ranked := 0, 0
	for i := range digests {
		d := Build(Header{Node: "p", Params: p}, uniformKeys(uint64(1000+i), n))
		if d.TierStride() != 0 {
			tiered++
		}
		if d.Ranks() != 1 {
			ranked++
		}
	}
	// 5 tier markers and 1 rank marker at ~1%: expect ~20 and ~4 of 400.
	if tiered > 45 || ranked > 15 {
		t.Errorf("%d of %d untiered digests look tiered, %d multi-rank; want about 5%% and 1%%", tiered, digests, ranked)
	}
}

func BenchmarkTierPrefixUntiered(b *testing.B) {
	keys := uniformKeys(1, 512)
	d := Build(Header{Node: "p", Params: ParamsFor(100_000, 0.01)}, append(uniformKeys(2, 100_000), keys[:256]...))
	for b.Loop() {
		d.TierPrefix(keys, 0)
	}
}

func BenchmarkTierPrefixTiered(b *testing.B) {
	keys := uniformKeys(1, 512)
	entries := append(uniformKeys(2, 100_000), keys[:128]...)
	for j := 131; j < 256; j += 4 {
		entries = append(entries, Tag(keys[j], TierCPU, 0))
	}
	d := Build(Header{Node: "p", Params: ParamsFor(100_000, 0.01)}, append(entries, TierMarker(4)))
	for b.Loop() {
		d.TierPrefix(keys, 0)
	}
}
