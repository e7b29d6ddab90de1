package gossip

import (
	"testing"
)

// TestKindsTable checks every listed kind has its own byte and name, and a
// decoder that rejects its kind byte alone or decodes it to its own kind.
func TestKindsTable(t *testing.T) {
	bytes, names := map[byte]bool{}, map[string]bool{}
	for i, k := range kinds {
		if bytes[k.kind] || names[k.name] || k.name == "" || k.decode == nil {
			t.Errorf("kinds[%d] = {%#x %q}: byte or name repeated, or empty", i, k.kind, k.name)
		}
		bytes[k.kind], names[k.name] = true, true
		if got := slotOf(k.kind); got != i {
			t.Errorf("slotOf(%#x) = %d; want %d", k.kind, got, i)
		}
	}
	for b := range 256 {
		if !bytes[byte(b)] && slotOf(byte(b)) != -1 {
			t.Errorf("slotOf(%#x) = %d for a kind not listed; want -1", b, slotOf(byte(b)))
		}
	}
}

// TestStatsCountEveryKind checks traffic is counted by the kind byte, not
// by its distance from the first kind: every listed kind is exported by
// name (ByKind.All), the four named fields agree with it, and a byte that
// is not a kind is exported nowhere.
func TestStatsCountEveryKind(t *testing.T) {
	var c kindTraffic
	for n, k := range kinds {
		for range n + 1 {
			c.count(append([]byte{k.kind}, make([]byte, 10*n)...))
		}
	}
	c.count([]byte{0x01, 2, 3}) // not a kind: never exported
	got := c.byKind()
	if len(got.All) != len(kinds) {
		t.Errorf("len(All) = %d; want %d (one per kind)", len(got.All), len(kinds))
	}
	for n, k := range kinds {
		want := Traffic{Msgs: uint64(n + 1), Bytes: uint64((n + 1) * (1 + 10*n))}
		if got.All[k.name] != want {
			t.Errorf("All[%q] = %+v; want %+v", k.name, got.All[k.name], want)
		}
	}
	named := map[string]Traffic{"digest": got.Digest, "delta": got.Delta, "need_full": got.NeedFull, "load": got.Load}
	for name, tr := range named {
		if tr != got.All[name] || tr.Msgs == 0 {
			t.Errorf("ByKind field for %q = %+v; want All's %+v, non-zero", name, tr, got.All[name])
		}
	}
	if c[0x01].msgs.Load() != 1 {
		t.Errorf("kind 0x01 slot = %d messages; want 1 (every byte has a slot)", c[0x01].msgs.Load())
	}
}
