package gossip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/route"
)

func TestMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   Meta
	}{
		{"zero", Meta{}},
		{"typical", Meta{
			APIAddr: "10.1.2.3:8000", Models: []string{"meta-llama/Llama-3.1-8B-Instruct", "lora-a"},
			KeyScheme: 1, HasDigest: true, DigestEpoch: 7, DigestVersion: 1 << 40,
			Running: 12, Waiting: 3, KVUsageMilli: 875, Serving: 4, QueuedPrefill: 9000, Ranks: 4,
		}},
		{"one rank", Meta{APIAddr: "a:1", Ranks: 1}},
		{"most ranks", Meta{Models: []string{"m"}, Ranks: 256}},
		{"engine address", Meta{APIAddr: "10.1.2.3:8000", EngineAddr: "10.1.2.3:8001"}},
		{"engine address and ranks", Meta{APIAddr: "a:1", Ranks: 2, EngineAddr: "[fd00::1]:8001"}},
		{"draining", Meta{APIAddr: "[fd00::1]:8000", Draining: true}},
		{"max integers", Meta{DigestEpoch: ^uint64(0), DigestVersion: ^uint64(0), Running: 1<<31 - 1}},
		{"truncated flag kept", Meta{Models: []string{"a"}, ModelsTruncated: true}},
		{"empty model name", Meta{Models: []string{""}}},
		{"engine down", Meta{APIAddr: "a:1", Engine: route.EngineDown, Draining: true}},
		{"engine starting", Meta{Engine: route.EngineStarting}},
		{"store gone", Meta{APIAddr: "a:1", Engine: route.EngineDown, Draining: true, StoreGone: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := EncodeMeta(tt.in, maxMetaBytes)
			if err != nil {
				t.Fatalf("EncodeMeta(%+v) error %v", tt.in, err)
			}
			got, err := DecodeMeta(b)
			if err != nil {
				t.Fatalf("DecodeMeta(%x) error %v", b, err)
			}
			want := tt.in
			want.Wire = WireVersion // 0 is written as this build's
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("DecodeMeta(EncodeMeta(x)) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeMetaFitsLimit(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = strings.Repeat(string(rune('a'+i%26)), 20)
	}
	tests := []struct {
		name          string
		in            Meta
		limit         int
		wantModels    int
		wantTruncated bool
	}{
		{"all fit", Meta{Models: many[:5]}, 512, 5, false},
		{"too many names", Meta{APIAddr: "10.0.0.1:8000", Models: many}, 512, 23, true},
		{"tight limit", Meta{Models: many[:5]}, 60, 2, true},
		{"name over 255 skipped, later kept", Meta{Models: []string{strings.Repeat("x", 300), "b"}}, 512, 1, true},
		{"limit above 512 capped", Meta{Models: many}, 4096, 23, true},
		{"negative load clamped", Meta{Running: -5}, 512, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := EncodeMeta(tt.in, tt.limit)
			if err != nil {
				t.Fatalf("EncodeMeta error %v", err)
			}
			if len(b) > min(tt.limit, maxMetaBytes) {
				t.Errorf("len(EncodeMeta) = %d; want <= %d", len(b), tt.limit)
			}
			got, err := DecodeMeta(b)
			if err != nil {
				t.Fatalf("DecodeMeta error %v", err)
			}
			if len(got.Models) != tt.wantModels || got.ModelsTruncated != tt.wantTruncated {
				t.Errorf("models = %d truncated %v; want %d truncated %v",
					len(got.Models), got.ModelsTruncated, tt.wantModels, tt.wantTruncated)
			}
			if got.Running < 0 {
				t.Errorf("Running = %d; want >= 0", got.Running)
			}
		})
	}
}

func TestEncodeMetaErrors(t *testing.T) {
	if _, err := EncodeMeta(Meta{APIAddr: strings.Repeat("h", 256)}, 512); err == nil {
		t.Errorf("EncodeMeta(256-byte address) = nil error; want error")
	}
	if _, err := EncodeMeta(Meta{APIAddr: "10.0.0.1:8000"}, 10); err == nil {
		t.Errorf("EncodeMeta(limit 10) = nil error; want error")
	}
}

func TestDecodeMetaErrors(t *testing.T) {
	good, err := EncodeMeta(Meta{APIAddr: "10.0.0.1:8000", Models: []string{"m"}, DigestVersion: 300}, 512)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"version 0", append([]byte{0}, good[1:]...)},
		{"header only", good[:3]},
		{"cut in address", good[:8]},
		{"cut in varint", good[:4+len("10.0.0.1:8000")+2]},
		{"cut in models", good[:len(good)-1]},
		{"huge int", append(append([]byte{1, 0, 0, 0, 0, 0}, 0xff, 0xff, 0xff, 0xff, 0x0f), 0, 0, 0, 0, 0)},
		{"over 512 bytes", make([]byte, 513)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := DecodeMeta(tt.in); !errors.Is(err, ErrMeta) {
				t.Errorf("DecodeMeta(%x) = %+v, %v; want ErrMeta", tt.in, m, err)
			}
		})
	}
}

func TestDecodeMetaIgnoresAppendedFields(t *testing.T) {
	in := Meta{APIAddr: "a:1", Models: []string{"m"}, Wire: WireVersion + 1, Ranks: 2, EngineAddr: "a:2", Stride: 8} // a later version that appends fields
	b, _ := EncodeMeta(in, 512)
	got, err := DecodeMeta(append(b, 1, 2, 3))
	if err != nil {
		t.Fatalf("DecodeMeta(v%d) error %v", in.Wire, err)
	}
	if diff := cmp.Diff(in, got); diff != "" {
		t.Errorf("DecodeMeta(v%d) mismatch (-want +got):\n%s", in.Wire, diff)
	}
}

// TestMetaStride checks the appended stride: written alone it brings the
// fields before it (unset), a meta that ends before it reads as not said,
// and a stride this build cannot use reads as not said.
func TestMetaStride(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   Meta
		want int
	}{
		{"alone", Meta{APIAddr: "a:1", Stride: 16}, 16},
		{"with the others", Meta{APIAddr: "a:1", Ranks: 2, EngineAddr: "a:2", Stride: 4}, 4},
		{"not said", Meta{APIAddr: "a:1", Ranks: 2, EngineAddr: "a:2"}, 0},
		{"too large", Meta{APIAddr: "a:1", Stride: maxStride + 1}, 0},
		{"wire 1", Meta{APIAddr: "a:1", Stride: 4, Wire: 1}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := EncodeMeta(tt.in, maxMetaBytes)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMeta(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Stride != tt.want || got.Ranks != tt.in.Ranks || got.EngineAddr != tt.in.EngineAddr {
				t.Errorf("decoded stride %d, ranks %d, engine %q; want %d, %d, %q", got.Stride, got.Ranks, got.EngineAddr, tt.want, tt.in.Ranks, tt.in.EngineAddr)
			}
		})
	}
	// A stride past the limit in the bytes (a newer or bad sender) is
	// not said either.
	b, _ := EncodeMeta(Meta{APIAddr: "a:1", EngineAddr: "e"}, maxMetaBytes)
	b = binary.AppendUvarint(b, maxStride+1)
	if got, err := DecodeMeta(b); err != nil || got.Stride != 0 {
		t.Errorf("DecodeMeta(stride %d) = %d, %v; want 0, nil", maxStride+1, got.Stride, err)
	}
}

// metaV010 is a node meta as v0.1.0 (a2f31aa) encodes Meta{APIAddr:
// "10.0.0.7:8000", Models: {"m"}, KeyScheme: 1, HasDigest: true,
// DigestEpoch: 3, DigestVersion: 300, Running: 2, Serving: 5}: version 1,
// flags, key scheme, address, seven uvarints, one model.
var metaV010 = append(append([]byte{1, flagHasDigest, 1, 13}, "10.0.0.7:8000"...),
	3, 0xac, 0x02, 2, 0, 0, 5, 0, 1, 1, 'm')

// TestMetaWireV010: this build reads v0.1.0's meta as wire 1 and writes
// the same bytes but for the first, which v0.1.0 reads as a version of 1
// or more: the layout is unchanged.
func TestMetaWireV010(t *testing.T) {
	want := Meta{APIAddr: "10.0.0.7:8000", Models: []string{"m"}, KeyScheme: 1, HasDigest: true,
		DigestEpoch: 3, DigestVersion: 300, Running: 2, Serving: 5, Wire: 1}
	got, err := DecodeMeta(metaV010)
	if err != nil {
		t.Fatalf("DecodeMeta(v0.1.0's) error %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DecodeMeta(v0.1.0's) mismatch (-want +got):\n%s", diff)
	}
	again, err := EncodeMeta(got, 512)
	if err != nil || !bytes.Equal(again, metaV010) {
		t.Errorf("EncodeMeta(Wire 1) = %x, %v; want v0.1.0's bytes %x", again, err, metaV010)
	}
	want.Wire = 0
	ours, _ := EncodeMeta(want, 512)
	if ours[0] != WireVersion || !bytes.Equal(ours[1:], metaV010[1:]) {
		t.Errorf("EncodeMeta = %x; want %d then v0.1.0's bytes %x", ours, WireVersion, metaV010[1:])
	}
}

// TestMetaRanksCompat: the rank count is appended after the models, so
// every reader that ignores bytes there (v0.1.0, v0.2.0 before the field)
// reads the rest unchanged, and a meta without it (theirs) reads as no
// count.
func TestMetaRanksCompat(t *testing.T) {
	base := Meta{APIAddr: "10.0.0.7:8000", Models: []string{"m"}, KeyScheme: 1, HasDigest: true,
		DigestEpoch: 3, DigestVersion: 300, Running: 2, Serving: 5}
	without, _ := EncodeMeta(base, 512)
	with := base
	with.Ranks = 2
	b, err := EncodeMeta(with, 512)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[:len(without)], without) || !bytes.Equal(b[len(without):], []byte{2}) {
		t.Errorf("EncodeMeta(Ranks 2) = %x; want the meta without it, %x, then 02", b, without)
	}
	// A v0.2.0 sidecar from before the field wrote metaV010's bytes after
	// its wire byte.
	older := append([]byte{2}, metaV010[1:]...)
	got, err := DecodeMeta(older)
	if err != nil || got.Ranks != 0 {
		t.Errorf("DecodeMeta(a meta without the field) = Ranks %d, %v; want 0, nil", got.Ranks, err)
	}
	if again, _ := EncodeMeta(got, 512); !bytes.Equal(again, older) {
		t.Errorf("EncodeMeta(no count) = %x; want the bytes before the field, %x", again, older)
	}
	// v0.1.0 writes nothing after its models and reads nothing there.
	old := with
	old.Wire = 1
	if b, _ := EncodeMeta(old, 512); !bytes.Equal(b, metaV010) {
		t.Errorf("EncodeMeta(Wire 1, Ranks 2) = %x; want v0.1.0's bytes %x", b, metaV010)
	}
	if got, err := DecodeMeta(append(slices.Clone(metaV010), 2)); err != nil || got.Ranks != 0 {
		t.Errorf("DecodeMeta(wire 1 with a byte after the models) = Ranks %d, %v; want 0, nil", got.Ranks, err)
	}

	tests := []struct {
		name    string
		tail    []byte
		want    int
		wantErr bool
	}{
		{"count", []byte{3}, 3, false},
		{"an engine address and a newer version's fields after it", []byte{3, 3, 'a', ':', '1', 9, 9}, 3, false},
		{"above bloom.MaxRanks: no count", []byte{0x81, 0x02}, 0, false},
		{"cut in the varint", []byte{0x81}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeMeta(append(slices.Clone(without), tt.tail...))
			if tt.wantErr {
				if !errors.Is(err, ErrMeta) {
					t.Errorf("DecodeMeta = %+v, %v; want ErrMeta", got, err)
				}
				return
			}
			if err != nil || got.Ranks != tt.want || got.APIAddr != base.APIAddr || got.Serving != 5 {
				t.Errorf("DecodeMeta = %+v, %v; want Ranks %d and the rest as sent", got, err, tt.want)
			}
		})
	}
	for _, n := range []int{-1, 257} {
		m := base
		m.Ranks = n
		if b, err := EncodeMeta(m, 512); err != nil || !bytes.Equal(b, without) {
			t.Errorf("EncodeMeta(Ranks %d) = %x, %v; want no count, %x", n, b, err, without)
		}
	}
}

// TestMetaEngineAddrCompat: the engine address follows the rank count
// (written as 0 when there is none), so a reader that knows only the rank
// count, as v0.2.0 did, reads the rest unchanged and ignores it.
func TestMetaEngineAddrCompat(t *testing.T) {
	base := Meta{APIAddr: "10.0.0.7:8000", Models: []string{"m"}, HasDigest: true, DigestEpoch: 3}
	without, _ := EncodeMeta(base, 512)
	with := base
	with.EngineAddr = "10.0.0.7:8001"
	b, err := EncodeMeta(with, 512)
	if err != nil {
		t.Fatal(err)
	}
	tail := append([]byte{0, 13}, "10.0.0.7:8001"...)
	if !bytes.Equal(b[:len(without)], without) || !bytes.Equal(b[len(without):], tail) {
		t.Errorf("EncodeMeta(EngineAddr) = %x; want the meta without it, %x, then %x", b, without, tail)
	}
	got, err := DecodeMeta(b)
	if err != nil || got.Ranks != 0 || got.EngineAddr != with.EngineAddr {
		t.Errorf("DecodeMeta = Ranks %d, EngineAddr %q, %v; want 0, %q", got.Ranks, got.EngineAddr, err, with.EngineAddr)
	}
	// Cut inside the address: malformed, not a shorter address.
	if _, err := DecodeMeta(b[:len(b)-1]); !errors.Is(err, ErrMeta) {
		t.Errorf("DecodeMeta(cut engine address) error %v; want ErrMeta", err)
	}
	if _, err := EncodeMeta(Meta{EngineAddr: strings.Repeat("a", 256)}, 512); err == nil {
		t.Error("EncodeMeta(engine address of 256 bytes) = nil error")
	}
	// v0.1.0 gets none of it.
	old := with
	old.Wire = 1
	if b, _ := EncodeMeta(old, 512); len(b) != len(without) {
		t.Errorf("EncodeMeta(Wire 1, EngineAddr) = %d bytes; want %d, the fields before", len(b), len(without))
	}
}

// A full model list leaves room for the count: models give way, not it.
func TestEncodeMetaKeepsRanksWhenFull(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = strings.Repeat(string(rune('a'+i%26)), 20)
	}
	m := Meta{APIAddr: "10.0.0.1:8000", Models: many, Ranks: 200}
	for _, limit := range []int{512, 60} {
		b, err := EncodeMeta(m, limit)
		if err != nil || len(b) > limit {
			t.Fatalf("EncodeMeta(limit %d) = %d bytes, %v", limit, len(b), err)
		}
		got, err := DecodeMeta(b)
		if err != nil || got.Ranks != 200 || !got.ModelsTruncated {
			t.Errorf("limit %d: DecodeMeta = Ranks %d truncated %v, %v; want 200, true", limit, got.Ranks, got.ModelsTruncated, err)
		}
	}
}

// A node's rank count reaches its peers through the meta, and Snapshot
// shows it, its own included.
func TestMeshAdvertisesRanks(t *testing.T) {
	ms := cluster(t, 2, func(_ int, c *Config) { c.MetaInterval = time.Hour })
	ranks := func(m *Mesh) map[string]int {
		vs := m.Snapshot(time.Now())
		out := map[string]int{}
		for _, v := range vs {
			out[v.ID] = v.Ranks
		}
		return out
	}
	if got := ranks(ms[1]); got["n0"] != 0 || got["n1"] != 0 {
		t.Errorf("ranks before SetRanks = %v; want none advertised", got)
	}
	ms[0].SetRanks(2)
	ms[1].SetRanks(1)
	waitFor(t, 5*time.Second, "n0's 2 ranks on n1", func() bool { return ranks(ms[1])["n0"] == 2 })
	if got := ranks(ms[1]); got["n1"] != 1 {
		t.Errorf("n1's own count = %d; want 1", got["n1"])
	}
	if got := ranks(ms[0]); got["n0"] != 2 {
		t.Errorf("n0's own count = %d; want 2", got["n0"])
	}
	waitFor(t, 5*time.Second, "n1's 1 rank on n0", func() bool { return ranks(ms[0])["n1"] == 1 })
}

func TestOldestWire(t *testing.T) {
	tb := newTable(4)
	if got := tb.oldestWire(); got != WireVersion {
		t.Errorf("oldestWire(no peers) = %d; want ours, %d", got, WireVersion)
	}
	now := time.Unix(1000, 0)
	tb.upsert("new", Meta{Wire: WireVersion}, true, now)
	tb.upsert("unread", Meta{}, false, now)
	if w, ok := tb.wire("unread"); ok {
		t.Errorf("wire(peer without a meta) = %d, true; want false", w)
	}
	tb.upsert("old", Meta{Wire: 1}, true, now)
	if got := tb.oldestWire(); got != 1 {
		t.Errorf("oldestWire(with a v0.1.0 peer) = %d; want 1", got)
	}
	if w, ok := tb.wire("old"); !ok || w != 1 {
		t.Errorf("wire(old) = %d, %v; want 1, true", w, ok)
	}
	tb.remove("old")
	if got := tb.oldestWire(); got != WireVersion {
		t.Errorf("oldestWire(v0.1.0 peer gone) = %d; want %d", got, WireVersion)
	}
}

func FuzzMeta(f *testing.F) {
	for _, m := range []Meta{{}, {APIAddr: "10.0.0.1:8000", Models: []string{"a", "b"}, HasDigest: true, DigestVersion: 1 << 50, KVUsageMilli: 999}} {
		b, _ := EncodeMeta(m, 512)
		f.Add(b)
	}
	f.Add([]byte{1, 0xff, 0xff, 0xff})
	f.Add(metaV010)
	newer, _ := EncodeMeta(Meta{APIAddr: "a:1", Models: []string{"m"}, Wire: WireVersion + 1}, 512)
	f.Add(append(newer, 7, 7, 7)) // a newer version's appended fields
	ranked, _ := EncodeMeta(Meta{APIAddr: "a:1", Models: []string{"m"}, Ranks: 2}, 512)
	f.Add(ranked)
	engine, _ := EncodeMeta(Meta{APIAddr: "a:1", Models: []string{"m"}, EngineAddr: "a:2", StoreGone: true}, 512)
	f.Add(engine)
	strided, _ := EncodeMeta(Meta{APIAddr: "a:1", Models: []string{"m"}, Stride: 16}, 512)
	f.Add(strided)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		enc, err := EncodeMeta(m, 512)
		if err != nil {
			t.Fatalf("EncodeMeta(DecodeMeta(%x)) error %v", b, err)
		}
		if len(enc) > 512 {
			t.Fatalf("EncodeMeta = %d bytes; want <= 512", len(enc))
		}
		m2, err := DecodeMeta(enc)
		if err != nil {
			t.Fatalf("DecodeMeta(EncodeMeta(m)) error %v", err)
		}
		if diff := cmp.Diff(m, m2); diff != "" {
			t.Fatalf("round trip mismatch (-first +second):\n%s", diff)
		}
	})
}
