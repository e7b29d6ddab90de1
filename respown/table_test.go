package respown

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// vid is a vLLM-made id (KeyOf packs it).
func vid(i int) string { return fmt.Sprintf("resp_%032x", i) }

func TestKeyOf(t *testing.T) {
	tests := []struct {
		id     string
		packed bool
	}{
		{"resp_0123456789abcdef0123456789abcdef", true},
		{"resp_ffffffffffffffffffffffffffffffff", true},
		{"resp_0123456789ABCDEF0123456789abcdef", false}, // upper case: would not unpack to itself
		{"resp_0123456789abcdef0123456789abcde", false},
		{"resp_0123456789abcdef0123456789abcdef0", false},
		{"resq_0123456789abcdef0123456789abcdef", false},
		{"resp_0123456789abcdef0123456789abcdeg", false},
		{"my-own-request-id", false},
		{"", false},
	}
	for _, tt := range tests {
		k, ok := KeyOf(tt.id)
		if ok != tt.packed {
			t.Errorf("KeyOf(%q) ok = %v; want %v", tt.id, ok, tt.packed)
		}
		if ok && k.String() != tt.id {
			t.Errorf("KeyOf(%q).String() = %q; want the id back", tt.id, k.String())
		}
	}
}

func TestValid(t *testing.T) {
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"", false},
		{"a", true},
		{vid(1), true},
		{strings.Repeat("x", MaxIDBytes), true},
		{strings.Repeat("x", MaxIDBytes+1), false},
	} {
		if got := Valid(tt.id); got != tt.want {
			t.Errorf("Valid(%d bytes) = %v; want %v", len(tt.id), got, tt.want)
		}
	}
}

func ownerOf(tb *Table, id string) string {
	n, ok := tb.Owner(id)
	if !ok {
		return "-"
	}
	return n
}

func TestAddOwner(t *testing.T) {
	tb := New(16, time.Minute, 0)
	raw := "client-chosen id"
	if got := tb.Add("a", []string{vid(1), raw, "", strings.Repeat("x", MaxIDBytes+1)}, t0); got != 2 {
		t.Errorf("Add refused %d; want 2 (empty, too long)", got)
	}
	tb.Add("b", []string{vid(2)}, t0)
	for id, want := range map[string]string{vid(1): "a", raw: "a", vid(2): "b", vid(3): "-", "": "-"} {
		if got := ownerOf(tb, id); got != want {
			t.Errorf("Owner(%q) = %s; want %s", id, got, want)
		}
	}
	if tb.Len() != 3 {
		t.Errorf("Len() = %d; want 3", tb.Len())
	}
	// A client's id created again elsewhere lives there now; a peer's older
	// copy (Fill) does not move it back.
	tb.Add("b", []string{raw}, t0)
	tb.Fill("a", []string{raw, vid(4)}, t0)
	if got, got4 := ownerOf(tb, raw), ownerOf(tb, vid(4)); got != "b" || got4 != "a" {
		t.Errorf("after Add(b) and Fill(a): Owner(raw) = %s, Owner(4) = %s; want b, a", got, got4)
	}
	if tb.Add("", []string{vid(5)}, t0) != 1 || ownerOf(tb, vid(5)) != "-" {
		t.Errorf("Add with no node recorded something")
	}
}

func TestBoundOldestFirst(t *testing.T) {
	tb := New(4, time.Minute, 0)
	tb.Add("a", []string{vid(1), vid(2), vid(3), vid(4)}, t0)
	tb.Add("a", []string{vid(2)}, t0) // known, same owner: stays where it is
	tb.Add("a", []string{vid(5)}, t0) // replaces 1, the oldest
	want := []Entry{{vid(2), "a"}, {vid(3), "a"}, {vid(4), "a"}, {vid(5), "a"}}
	if diff := cmp.Diff(want, tb.Recent(10)); diff != "" {
		t.Errorf("Recent after overflow (-want +got):\n%s", diff)
	}
	// A moved id is the newest: the next overflow takes 2's old place
	// (empty now) and then 3, not 2.
	tb.Add("b", []string{vid(2)}, t0)
	tb.Add("a", []string{vid(6)}, t0)
	want = []Entry{{vid(4), "a"}, {vid(5), "a"}, {vid(2), "b"}, {vid(6), "a"}}
	if diff := cmp.Diff(want, tb.Recent(10)); diff != "" {
		t.Errorf("Recent after a move and overflow (-want +got):\n%s", diff)
	}
	if tb.Len() != 4 || ownerOf(tb, vid(3)) != "-" || ownerOf(tb, vid(1)) != "-" {
		t.Errorf("Len() = %d, Owner(3) = %s, Owner(1) = %s; want 4, -, -", tb.Len(), ownerOf(tb, vid(3)), ownerOf(tb, vid(1)))
	}
	if diff := cmp.Diff(want[2:], tb.Recent(2)); diff != "" {
		t.Errorf("Recent(2) (-want +got):\n%s", diff)
	}
	if got := tb.Recent(0); got != nil {
		t.Errorf("Recent(0) = %v; want nil", got)
	}
}

func TestRawIDsFreed(t *testing.T) {
	tb := New(8, time.Minute, 0)
	for i := range 100 {
		tb.Add("a", []string{fmt.Sprintf("custom-%d", i), vid(i)}, t0)
	}
	if tb.Len() != 8 || len(tb.raw) != 4 || len(tb.rawAt) != 4 || len(tb.packed) != 4 {
		t.Errorf("Len %d, raw %d, rawAt %d, packed %d; want 8, 4, 4, 4", tb.Len(), len(tb.raw), len(tb.rawAt), len(tb.packed))
	}
	if got := ownerOf(tb, "custom-99"); got != "a" {
		t.Errorf("Owner(custom-99) = %s; want a", got)
	}
	if got := ownerOf(tb, "custom-95"); got != "-" {
		t.Errorf("Owner(custom-95) = %s; want - (evicted)", got)
	}
}

func TestGoneAndBack(t *testing.T) {
	const goneFor = 10 * time.Minute
	tb := New(16, goneFor, 0)
	tb.Add("a", []string{vid(1), vid(2)}, t0)
	tb.Add("b", []string{vid(3)}, t0)
	tb.Add("c", []string{vid(4)}, t0)

	tb.Gone("a", t0)
	tb.Gone("a", t0.Add(time.Minute)) // already gone: keeps t0
	tb.Gone("c", t0.Add(time.Minute))
	tb.Gone("later", t0) // no entries yet: what it gets is gone too
	tb.Fill("later", []string{vid(8)}, t0)
	if !tb.IsGone("a") || tb.IsGone("b") || !tb.IsGone("later") {
		t.Errorf("IsGone(a, b, later) = %v, %v, %v; want true, false, true", tb.IsGone("a"), tb.IsGone("b"), tb.IsGone("later"))
	}
	if got := ownerOf(tb, vid(1)); got != "a" {
		t.Errorf("Owner(1) of a gone node = %s; want a, kept", got)
	}
	want := []Entry{{vid(3), "b"}}
	if diff := cmp.Diff(want, tb.Recent(10)); diff != "" {
		t.Errorf("Recent with a and c gone (-want +got):\n%s", diff)
	}

	tb.Back("c")
	tb.Add("b", []string{vid(5)}, t0.Add(goneFor-time.Nanosecond)) // not due yet
	if tb.Len() != 6 {
		t.Errorf("Len() before expiry = %d; want 6", tb.Len())
	}
	tb.Add("b", []string{vid(6)}, t0.Add(goneFor)) // a is due; c came back
	if tb.Len() != 4 || ownerOf(tb, vid(1)) != "-" || ownerOf(tb, vid(2)) != "-" || ownerOf(tb, vid(4)) != "c" {
		t.Errorf("after expiry: Len %d, Owner(1) %s, Owner(2) %s, Owner(4) %s; want 4, -, -, c",
			tb.Len(), ownerOf(tb, vid(1)), ownerOf(tb, vid(2)), ownerOf(tb, vid(4)))
	}
	if _, ok := tb.byName["a"]; ok || tb.IsGone("a") {
		t.Errorf("expired owner a still recorded")
	}
	// a comes back with new responses: a fresh, live owner.
	tb.Add("a", []string{vid(7)}, t0.Add(goneFor))
	if got := ownerOf(tb, vid(7)); got != "a" || tb.IsGone("a") {
		t.Errorf("Owner(7) = %s, IsGone(a) = %v; want a, false", got, tb.IsGone("a"))
	}
	if got := tb.Expire(t0.Add(100 * goneFor)); got != 0 {
		t.Errorf("Expire with no one gone dropped %d", got)
	}
}

func TestExpireFreesOwners(t *testing.T) {
	tb := New(2, time.Minute, 0)
	for i := range 50 {
		node := fmt.Sprintf("pod-%d", i)
		tb.Add(node, []string{vid(i)}, t0)
		tb.Gone(node, t0)
	}
	tb.Expire(t0.Add(time.Minute))
	if len(tb.byName) != 0 || len(tb.free) != len(tb.owners) || tb.Len() != 0 {
		t.Errorf("byName %d, free %d of %d owners, Len %d; want every owner freed", len(tb.byName), len(tb.free), len(tb.owners), tb.Len())
	}
	tb.Add("again", []string{vid(1)}, t0)
	if len(tb.owners) != 50 || ownerOf(tb, vid(1)) != "again" {
		t.Errorf("a new owner did not reuse a freed slot: %d owners", len(tb.owners))
	}
}

// model is the table's contract written plainly: each insert takes the next
// of max positions, an entry lives until its position is taken again or it
// is removed, and a gone node's entries are dropped goneFor after it went.
type model struct {
	max     int
	goneFor time.Duration
	seq     int
	ids     map[string]modelEntry
	gone    map[string]time.Time
}

type modelEntry struct {
	node string
	seq  int
}

func (m *model) expire(now time.Time) {
	for node, at := range m.gone {
		if !now.Before(at.Add(m.goneFor)) {
			delete(m.gone, node)
			for id, e := range m.ids {
				if e.node == node {
					delete(m.ids, id)
				}
			}
		}
	}
}

func (m *model) add(node string, ids []string, now time.Time, move bool) {
	m.expire(now)
	for _, id := range ids {
		if e, ok := m.ids[id]; ok && (!move || e.node == node) {
			continue
		}
		m.ids[id] = modelEntry{node, m.seq}
		m.seq++
		for id, e := range m.ids {
			if e.seq < m.seq-m.max {
				delete(m.ids, id)
			}
		}
	}
}

func (m *model) goneAt(node string, now time.Time) {
	m.expire(now)
	if _, ok := m.gone[node]; !ok {
		m.gone[node] = now
	}
}

func TestTableMatchesModel(t *testing.T) {
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		const max, goneFor = 16, time.Minute
		tb := New(max, goneFor, 0)
		m := &model{max: max, goneFor: goneFor, ids: map[string]modelEntry{}, gone: map[string]time.Time{}}
		now := t0
		nodes := []string{"a", "b", "c"}
		id := func() string {
			if i := rng.IntN(40); i%3 == 0 {
				return fmt.Sprintf("c%d", i)
			} else {
				return vid(i)
			}
		}
		for step := range 2000 {
			now = now.Add(time.Duration(rng.IntN(10)) * time.Second)
			node := nodes[rng.IntN(len(nodes))]
			switch op := rng.IntN(10); {
			case op < 5:
				ids := []string{id(), id()}
				tb.Add(node, ids, now)
				m.add(node, ids, now, true)
			case op < 7:
				ids := []string{id()}
				tb.Fill(node, ids, now)
				m.add(node, ids, now, false)
			case op < 8:
				tb.Gone(node, now)
				m.goneAt(node, now)
			case op < 9:
				tb.Back(node)
				delete(m.gone, node)
			default:
				tb.Expire(now)
				m.expire(now)
			}
			if tb.Len() != len(m.ids) {
				t.Fatalf("seed %d step %d: Len() = %d; model holds %d", seed, step, tb.Len(), len(m.ids))
			}
			for i := range 40 {
				for _, x := range []string{vid(i), fmt.Sprintf("c%d", i)} {
					want := "-"
					if e, ok := m.ids[x]; ok {
						want = e.node
					}
					if got := ownerOf(tb, x); got != want {
						t.Fatalf("seed %d step %d: Owner(%s) = %s; model says %s", seed, step, x, got, want)
					}
				}
			}
			var live int
			for _, e := range m.ids {
				if _, g := m.gone[e.node]; !g {
					live++
				}
			}
			if got := len(tb.Recent(max)); got != live {
				t.Fatalf("seed %d step %d: Recent holds %d; model has %d entries of live nodes", seed, step, got, live)
			}
		}
	}
}

// BenchmarkAdd fills a default-sized table and reports what an entry
// costs in memory (DefaultMaxEntries' doc quotes it).
func BenchmarkAdd(b *testing.B) {
	for _, tt := range []struct {
		name string
		id   func(i int) string
	}{
		{"vllm", vid},
		{"custom", func(i int) string { return fmt.Sprintf("agent-7/session-%d/turn", i) }},
	} {
		b.Run(tt.name, func(b *testing.B) {
			ids := make([]string, DefaultMaxEntries)
			for i := range ids {
				ids[i] = tt.id(i)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			tb := New(DefaultMaxEntries, DefaultGoneFor, DefaultGrace)
			for i, id := range ids {
				tb.Add(fmt.Sprintf("pod-%d", i%16), []string{id}, t0)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perEntry := float64(after.HeapAlloc-before.HeapAlloc) / DefaultMaxEntries
			b.ResetTimer()
			one := []string{""}
			for i := range b.N {
				one[0] = ids[i%len(ids)]
				tb.Add("pod-x", one, t0)
			}
			b.ReportMetric(perEntry, "B/entry") // after ResetTimer, which deletes metrics
			runtime.KeepAlive(tb)
		})
	}
}

// An owner that left is Away for Grace (its sidecar may be restarting with
// its vLLM alive), Gone after, and Live again when it comes back; each
// entry keeps when it was recorded.
func TestLookupGrace(t *testing.T) {
	const grace = 10 * time.Second
	tb := New(16, time.Hour, grace)
	tb.Add("a", []string{vid(1), "client-chosen"}, t0.Add(1500*time.Millisecond))
	tb.Fill("b", []string{vid(2)}, t0.Add(3*time.Second))
	tb.Gone("a", t0.Add(5*time.Second))
	tb.Gone("quiet", t0.Add(6*time.Second)) // left with no entries: still away

	left := t0.Add(5 * time.Second)
	tests := []struct {
		name string
		id   string
		now  time.Time
		want Lookup
		ok   bool
	}{
		{"live, recorded to the second", vid(2), t0.Add(time.Hour), Lookup{Node: "b", Status: Live, At: t0.Add(3 * time.Second)}, true},
		{"just left", vid(1), left, Lookup{Node: "a", Status: Away, At: t0.Add(time.Second), Left: left}, true},
		{"within grace", "client-chosen", left.Add(grace - time.Nanosecond), Lookup{Node: "a", Status: Away, At: t0.Add(time.Second), Left: left}, true},
		{"grace over", vid(1), left.Add(grace), Lookup{Node: "a", Status: Gone, At: t0.Add(time.Second), Left: left}, true},
		{"unknown", vid(9), left, Lookup{}, false},
	}
	for _, tt := range tests {
		got, ok := tb.Lookup(tt.id, tt.now)
		if ok != tt.ok || !got.At.Equal(tt.want.At) || !got.Left.Equal(tt.want.Left) {
			t.Errorf("%s: Lookup = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
		got.At, got.Left, tt.want.At, tt.want.Left = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if got != tt.want {
			t.Errorf("%s: Lookup = %+v; want %+v", tt.name, got, tt.want)
		}
	}

	away := tb.Away(left.Add(grace - time.Nanosecond))
	slices.Sort(away)
	if diff := cmp.Diff([]string{"a", "quiet"}, away); diff != "" {
		t.Errorf("Away within grace (-want +got):\n%s", diff)
	}
	if got := tb.Away(t0.Add(6*time.Second + grace)); len(got) != 0 {
		t.Errorf("Away after every grace = %v; want none", got)
	}
	tb.Back("a")
	if got, _ := tb.Lookup(vid(1), left.Add(grace)); got.Status != Live || !got.Left.IsZero() {
		t.Errorf("Lookup after Back = %+v; want live, no Left", got)
	}
	if got := tb.Away(left); slices.Contains(got, "a") {
		t.Errorf("Away after a came back = %v; want no a", got)
	}
}

// A node that left with its store lost is Gone at once, not Away for the
// grace; back in the mesh, it is Live again, and a later leave has the
// grace again.
func TestLost(t *testing.T) {
	const grace = 10 * time.Second
	tb := New(16, time.Hour, grace)
	tb.Add("a", []string{vid(1)}, t0)
	tb.Add("b", []string{vid(2)}, t0)
	tb.Lost("a", t0)
	tb.Gone("b", t0)
	status := func(id string, at time.Time) Status {
		l, _ := tb.Lookup(id, at)
		return l.Status
	}
	if a, b := status(vid(1), t0), status(vid(2), t0); a != Gone || b != Away {
		t.Errorf("just left: lost a %v, gone b %v; want gone, away", a, b)
	}
	if away := tb.Away(t0); len(away) != 1 || away[0] != "b" {
		t.Errorf("Away = %v; want [b]", away)
	}
	tb.Back("a")
	if got := status(vid(1), t0); got != Live {
		t.Errorf("back: %v; want live", got)
	}
	tb.Gone("a", t0.Add(time.Minute))
	if got := status(vid(1), t0.Add(time.Minute)); got != Away {
		t.Errorf("left again, store not said lost: %v; want away", got)
	}
}
