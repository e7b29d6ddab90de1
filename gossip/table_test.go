package gossip

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func metaAt(epoch, version uint64) Meta {
	return Meta{APIAddr: "p:8000", HasDigest: true, DigestEpoch: epoch, DigestVersion: version}
}

// copyOf returns the epoch and version of the table's copy of id.
func copyOf(tb *table, id string) (epoch, version uint64, ok bool) {
	p := tb.peers[id]
	if p == nil || p.digest == nil {
		return 0, 0, false
	}
	h := p.digest.Header()
	return h.Epoch, h.Version, true
}

func TestTableApplyDelta(t *testing.T) {
	tests := []struct {
		name        string
		copy        *bloom.Digest // nil: no copy
		x           bloom.Delta
		want        outcome
		wantDropped bool
		wantVersion uint64 // of the copy afterwards; 0: no copy
	}{
		{"follows", testDigest("p", 1, 5), bloom.Delta{Node: "p", Epoch: 1, From: 5, To: 6, Keys: []blockkey.Key{9}}, applied, false, 6},
		{"ahead is held", testDigest("p", 1, 5), bloom.Delta{Node: "p", Epoch: 1, From: 6, To: 7}, held, false, 5},
		{"stale", testDigest("p", 1, 5), bloom.Delta{Node: "p", Epoch: 1, From: 4, To: 5}, stale, false, 5},
		{"no copy yet", nil, bloom.Delta{Node: "p", Epoch: 1, From: 5, To: 6}, gap, false, 0},
		{"new epoch drops copy", testDigest("p", 1, 5), bloom.Delta{Node: "p", Epoch: 2, From: 5, To: 6}, gap, true, 0},
		{"unknown origin", testDigest("p", 1, 5), bloom.Delta{Node: "q", Epoch: 1, From: 5, To: 6}, unknown, false, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(4)
			tb.upsert("p", metaAt(1, 5), true, t0)
			tb.peers["p"].digest = tt.copy
			got, dropped := tb.applyDelta(tt.x, t0.Add(time.Second))
			if got != tt.want || dropped != tt.wantDropped {
				t.Errorf("applyDelta(%+v) = %v, %v; want %v, %v", tt.x, got, dropped, tt.want, tt.wantDropped)
			}
			_, v, _ := copyOf(tb, "p")
			if v != tt.wantVersion {
				t.Errorf("copy version after applyDelta = %d; want %d", v, tt.wantVersion)
			}
		})
	}
}

func TestTableAppliedDeltaIsTestable(t *testing.T) {
	tb := newTable(4)
	tb.upsert("p", metaAt(1, 1), true, t0)
	if o := tb.applyDigest(testDigest("p", 1, 1, 100), t0); o != applied {
		t.Fatalf("applyDigest = %v; want applied", o)
	}
	if o, _ := tb.applyDelta(bloom.Delta{Node: "p", Epoch: 1, From: 1, To: 2, Keys: []blockkey.Key{101}}, t0.Add(time.Second)); o != applied {
		t.Fatalf("applyDelta = %v; want applied", o)
	}
	v := tb.views()[0]
	if n := v.Digest.PrefixLen([]blockkey.Key{100, 101}); n != 2 || !v.DigestAt.Equal(t0.Add(time.Second)) {
		t.Errorf("view PrefixLen = %d, DigestAt %v; want 2, %v", n, v.DigestAt, t0.Add(time.Second))
	}
}

func TestTableApplyDigest(t *testing.T) {
	tests := []struct {
		name        string
		copy        *bloom.Digest
		in          *bloom.Digest
		want        outcome
		wantVersion uint64
	}{
		{"first", nil, testDigest("p", 1, 5), applied, 5},
		{"newer", testDigest("p", 1, 5), testDigest("p", 1, 9), applied, 9},
		{"same version refreshes", testDigest("p", 1, 5), testDigest("p", 1, 5), applied, 5},
		{"older", testDigest("p", 1, 5), testDigest("p", 1, 4), stale, 5},
		{"other epoch, lower version", testDigest("p", 1, 5), testDigest("p", 2, 1), applied, 1},
		{"unknown", nil, testDigest("q", 1, 5), unknown, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(4)
			tb.upsert("p", metaAt(1, 5), true, t0)
			tb.peers["p"].digest = tt.copy
			if got := tb.applyDigest(tt.in, t0); got != tt.want {
				t.Errorf("applyDigest(%+v) = %v; want %v", tt.in.Header(), got, tt.want)
			}
			if _, v, _ := copyOf(tb, "p"); v != tt.wantVersion {
				t.Errorf("copy version = %d; want %d", v, tt.wantVersion)
			}
		})
	}
}

func TestTableUpsertEpoch(t *testing.T) {
	tests := []struct {
		name        string
		before      Meta
		copy        *bloom.Digest
		after       Meta
		afterOK     bool
		wantDropped bool
	}{
		{"same epoch keeps", metaAt(1, 5), testDigest("p", 1, 5), metaAt(1, 9), true, false},
		{"epoch moves on drops", metaAt(1, 5), testDigest("p", 1, 5), metaAt(2, 1), true, true},
		{"copy already of new epoch", metaAt(1, 5), testDigest("p", 2, 1), metaAt(2, 1), true, false},
		{"malformed meta changes nothing", metaAt(1, 5), testDigest("p", 1, 5), Meta{}, false, false},
		{"no digest announced", metaAt(1, 5), testDigest("p", 1, 5), Meta{APIAddr: "p:8000"}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(4)
			tb.upsert("p", tt.before, true, t0)
			tb.peers["p"].digest = tt.copy
			if got := tb.upsert("p", tt.after, tt.afterOK, t0.Add(time.Second)); got != tt.wantDropped {
				t.Errorf("upsert(%+v) dropped = %v; want %v", tt.after, got, tt.wantDropped)
			}
			if _, _, ok := copyOf(tb, "p"); ok == tt.wantDropped {
				t.Errorf("copy held = %v; want %v", ok, !tt.wantDropped)
			}
			wantMeta := tt.before
			if tt.afterOK {
				wantMeta = tt.after
			}
			if diff := cmp.Diff(wantMeta, tb.peers["p"].meta); diff != "" {
				t.Errorf("meta mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTableRepairs(t *testing.T) {
	const after, every = 2 * time.Second, time.Second
	tb := newTable(4)
	tb.upsert("behind", metaAt(1, 9), true, t0)
	tb.peers["behind"].digest = testDigest("behind", 1, 5)
	tb.upsert("current", metaAt(1, 5), true, t0)
	tb.peers["current"].digest = testDigest("current", 1, 7) // meta lags deltas: normal
	tb.upsert("missing", metaAt(3, 1), true, t0)
	tb.upsert("silent", Meta{APIAddr: "s:1"}, true, t0) // never published a digest
	// The meta no longer follows the deltas (advert.note); the pushes do.
	tb.upsert("pushed", metaAt(1, 2), true, t0)
	tb.peers["pushed"].digest = testDigest("pushed", 1, 5)
	tb.applyLoad(loadReport{Node: "pushed", Seq: 1, Engine: route.EngineServing, Epoch: 1, HasState: true, Version: 6, HasVersion: true}, t0)
	// A push of another epoch says nothing of this copy's version (the
	// meta's epoch decides that).
	tb.upsert("other", metaAt(1, 2), true, t0)
	tb.peers["other"].digest = testDigest("other", 1, 5)
	tb.applyLoad(loadReport{Node: "other", Seq: 1, Engine: route.EngineServing, Epoch: 2, HasState: true, Version: 9, HasVersion: true}, t0)

	steps := []struct {
		at   time.Duration
		want []string
	}{
		{0, nil},           // lag just noticed
		{time.Second, nil}, // not long enough
		{2 * time.Second, []string{"behind", "missing", "pushed"}},
		{2500 * time.Millisecond, nil}, // asked 0.5 s ago
		{3 * time.Second, []string{"behind", "missing", "pushed"}},
	}
	for _, s := range steps {
		if got := tb.repairs(t0.Add(s.at), time.Hour, after, every); !cmp.Equal(got, s.want, cmpopts.EquateEmpty()) {
			t.Errorf("repairs(t0+%v) = %v; want %v", s.at, got, s.want)
		}
	}
	tb.applyDigest(testDigest("behind", 1, 9), t0.Add(3*time.Second))
	tb.applyDigest(testDigest("pushed", 1, 6), t0.Add(3*time.Second))
	if got := tb.repairs(t0.Add(10*time.Second), time.Hour, after, every); !cmp.Equal(got, []string{"missing"}) {
		t.Errorf("repairs after the full digests = %v; want [missing]", got)
	}
}

func TestTableReorder(t *testing.T) {
	d := func(from uint64, k blockkey.Key) bloom.Delta {
		return bloom.Delta{Node: "p", Epoch: 1, From: from, To: from + 1, Keys: []blockkey.Key{k}}
	}
	tb := newTable(4)
	tb.upsert("p", metaAt(1, 1), true, t0)
	tb.applyDigest(testDigest("p", 1, 1), t0)
	// A burst handed over newest first.
	for i, x := range []bloom.Delta{d(4, 14), d(3, 13), d(2, 12), d(1, 11)} {
		want := held
		if i == 3 {
			want = applied
		}
		if o, _ := tb.applyDelta(x, t0); o != want {
			t.Errorf("applyDelta(%d→%d) = %v; want %v", x.From, x.To, o, want)
		}
	}
	if _, v, _ := copyOf(tb, "p"); v != 5 {
		t.Errorf("version after the reversed burst = %d; want 5", v)
	}
	if v := tb.views()[0]; v.Digest.PrefixLen([]blockkey.Key{11, 12, 13, 14}) != 4 {
		t.Errorf("reversed burst: not every key testable")
	}
	if p := tb.peers["p"]; len(p.early) != 0 || !p.earlySince.IsZero() {
		t.Errorf("held deltas left after drain: %d", len(p.early))
	}

	// 5→6 is lost: 6→7 waits, then a full digest is asked for.
	const wait = 100 * time.Millisecond
	if o, _ := tb.applyDelta(d(6, 16), t0); o != held {
		t.Fatalf("applyDelta(6→7) = %v; want held", o)
	}
	if got := tb.repairs(t0.Add(wait/2), wait, time.Hour, time.Second); len(got) != 0 {
		t.Errorf("repairs before the reorder wait = %v; want none", got)
	}
	if got := tb.repairs(t0.Add(wait), wait, time.Hour, time.Second); !cmp.Equal(got, []string{"p"}) {
		t.Errorf("repairs after the reorder wait = %v; want [p]", got)
	}
	// The full digest at 6 lets the held 6→7 apply.
	tb.applyDigest(testDigest("p", 1, 6, 11, 12, 13, 14, 15), t0.Add(wait))
	if _, v, _ := copyOf(tb, "p"); v != 7 {
		t.Errorf("version after the full digest = %d; want 7 (held delta applied)", v)
	}
}

func TestTableEarlyBounded(t *testing.T) {
	tb := newTable(4)
	tb.upsert("p", metaAt(1, 1), true, t0)
	tb.applyDigest(testDigest("p", 1, 1), t0)
	var last outcome
	for i := range uint64(maxEarly + 1) {
		last, _ = tb.applyDelta(bloom.Delta{Node: "p", Epoch: 1, From: 10 + i, To: 11 + i}, t0)
	}
	if last != gap || len(tb.peers["p"].early) != maxEarly {
		t.Errorf("delta %d ahead = %v with %d held; want gap with %d held", maxEarly+1, last, len(tb.peers["p"].early), maxEarly)
	}
}

func TestTableViewsAndFailures(t *testing.T) {
	tb := newTable(4)
	tb.upsert("b", Meta{APIAddr: "b:8000", Models: []string{"m"}, KeyScheme: 1, Draining: true,
		Running: 2, Waiting: 1, KVUsageMilli: 500, Serving: 3, QueuedPrefill: 40}, true, t0)
	tb.upsert("a", Meta{APIAddr: "a:8000"}, true, t0.Add(time.Second))
	tb.upsert("bad", Meta{}, false, t0) // meta never readable: no address
	tb.markFailed("b", t0.Add(5*time.Second))
	tb.markFailed("b", t0.Add(4*time.Second)) // older report does not win
	tb.markFailed("nobody", t0)

	want := []route.PeerView{
		{ID: "a", Addr: "a:8000", Load: route.Load{Fronted: true}}, // no push yet: no LoadAt
		{ID: "b", Addr: "b:8000", Models: []string{"m"}, KeyScheme: 1, Draining: true,
			Load:        route.Load{Running: 2, Waiting: 1, KVUsage: 0.5, Serving: 3, Fronted: true, QueuedPrefillTokens: 40},
			LastFailure: t0.Add(5 * time.Second)},
	}
	if diff := cmp.Diff(want, tb.views(), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("views mismatch (-want +got):\n%s", diff)
	}
	tb.remove("b")
	if got := len(tb.views()); got != 1 {
		t.Errorf("len(views) after remove = %d; want 1", got)
	}
}

func TestTableAsk(t *testing.T) {
	tb := newTable(4)
	tb.upsert("p", Meta{}, true, t0)
	steps := []struct {
		id   string
		at   time.Duration
		want bool
	}{
		{"p", 0, true},
		{"p", 500 * time.Millisecond, false},
		{"p", time.Second, true},
		{"q", 0, false}, // unknown
	}
	for _, s := range steps {
		if got := tb.ask(s.id, t0.Add(s.at), time.Second); got != s.want {
			t.Errorf("ask(%q, t0+%v) = %v; want %v", s.id, s.at, got, s.want)
		}
	}
}

func TestTableApplyLoad(t *testing.T) {
	tb := newTable(4)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tb.upsert("a", Meta{APIAddr: "a:1", Running: 9, Serving: 9}, true, t0)
	l := func(s int) route.Load { return route.Load{Running: 1, Serving: s, Fronted: true} }
	steps := []struct {
		r    loadReport
		at   time.Duration
		want outcome
		load route.Load
	}{
		{loadReport{Node: "b", Seq: 1, Load: l(1)}, 1, unknown, route.Load{Running: 9, Serving: 9, Fronted: true}},
		{loadReport{Node: "a", Seq: 10, Load: l(3)}, 2, applied, l(3)},
		{loadReport{Node: "a", Seq: 9, Load: l(2)}, 3, stale, l(3)}, // reordered UDP
		{loadReport{Node: "a", Seq: 10, Load: l(2)}, 4, stale, l(3)},
		{loadReport{Node: "a", Seq: 12, Load: l(5)}, 5, applied, l(5)},
	}
	for i, s := range steps {
		now := t0.Add(s.at * time.Second)
		if got := tb.applyLoad(s.r, now); got != s.want {
			t.Errorf("step %d: applyLoad = %v; want %v", i, got, s.want)
		}
		if v := tb.views()[0]; v.Load != s.load {
			t.Errorf("step %d: load %+v; want %+v", i, v.Load, s.load)
		}
	}
	// A later meta keeps the pushed load and its time: pushes are fresher.
	tb.upsert("a", Meta{APIAddr: "a:1", Running: 0}, true, t0.Add(time.Minute))
	if v := tb.views()[0]; v.Load != l(5) || !v.LoadAt.Equal(t0.Add(5*time.Second)) {
		t.Errorf("after meta: load %+v at %v; want %+v at +5s", v.Load, v.LoadAt, l(5))
	}
}

// TestAddClaimCopies checks addClaims keeps the newest keepClaims, claimed
// at the time given, and never writes to a slice a snapshot may hold; a
// batch keeps what its claims added one at a time would.
func TestAddClaimCopies(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var cs []route.Claim
	var held [][]route.Claim
	for i := range keepClaims + 5 {
		cs = addClaims(cs, t0.Add(time.Duration(i)), route.Claim{Keys: i + 1})
		held = append(held, cs)
	}
	if len(cs) != keepClaims || cs[0].Keys != 6 || cs[keepClaims-1].Keys != keepClaims+5 || !cs[0].At.Equal(t0.Add(5)) {
		t.Fatalf("after %d claims: len %d, first %d at %v, last %d; want %d, 6 at +5ns, %d", keepClaims+5, len(cs), cs[0].Keys, cs[0].At, cs[len(cs)-1].Keys, keepClaims, keepClaims+5)
	}
	for i, h := range held {
		if got := h[len(h)-1].Keys; got != i+1 {
			t.Errorf("snapshot %d's last claim changed to %d; want %d", i, got, i+1)
		}
	}
	for _, tt := range []struct{ before, batch int }{{0, 3}, {10, 5}, {30, 5}, {keepClaims, keepClaims + 3}, {3, keepClaims + 1}} {
		var before, batch []route.Claim
		for i := range tt.before {
			before = append(before, route.Claim{Keys: i + 1, At: t0})
		}
		for i := range tt.batch {
			batch = append(batch, route.Claim{Keys: 100 + i})
		}
		one := before
		for _, c := range batch {
			one = addClaims(one, t0.Add(time.Hour), c)
		}
		got := addClaims(before, t0.Add(time.Hour), batch...)
		if !slices.Equal(got, one) {
			t.Errorf("%d claims, then a batch of %d: %v; one at a time %v", tt.before, tt.batch, got, one)
		}
		if len(before) > 0 && len(got) > 0 && &got[0] == &before[0] {
			t.Errorf("%d claims, then a batch of %d: shares the snapshot's array", tt.before, tt.batch)
		}
	}
}

// TestTableEngineState walks a peer through an engine failure and back: a
// down engine or a withdrawn digest drops the copy and the claims at once,
// and a digest of an epoch the pushes do not name is never matched.
func TestTableEngineState(t *testing.T) {
	tb := newTable(4)
	tb.upsert("a", metaAt(1, 5), true, t0)
	tb.peers["a"].digest = testDigest("a", 1, 5)
	claim := route.Claim{Key: 7, Keys: 2, At: t0}
	view := func() route.PeerView { return tb.views()[0] }
	type want struct {
		engine route.Engine
		digest bool // the view matches a digest
		held   bool // the table still holds a copy
		claims int
	}
	check := func(step string, w want) {
		t.Helper()
		v := view()
		got := want{engine: v.Engine, digest: v.Digest != nil, held: tb.peers["a"].digest != nil, claims: len(v.Claims)}
		if got != w {
			t.Errorf("%s: %+v; want %+v", step, got, w)
		}
	}
	tb.claim("a", claim.At, claim)
	check("before any stated push", want{route.EngineServing, true, true, 1})

	tb.applyLoad(loadReport{Node: "a", Seq: 1, Engine: route.EngineServing, Epoch: 1, HasState: true}, t0)
	check("serving, epoch 1", want{route.EngineServing, true, true, 1})

	tb.applyLoad(loadReport{Node: "a", Seq: 2, Engine: route.EngineDown, HasState: true}, t0)
	check("engine down", want{route.EngineDown, false, false, 0})

	// The new engine's empty digest (epoch 2) may overtake the push naming it.
	tb.applyDigest(testDigest("a", 2, 1), t0)
	check("new digest before its push", want{route.EngineDown, false, true, 0})
	tb.applyLoad(loadReport{Node: "a", Seq: 3, Engine: route.EngineServing, Epoch: 2, HasState: true}, t0)
	check("serving, epoch 2", want{route.EngineServing, true, true, 0})

	// An old-epoch copy (a full digest resent late) is held but not matched.
	tb.claim("a", claim.At, claim)
	tb.applyDigest(testDigest("a", 1, 9), t0)
	check("late old-epoch digest", want{route.EngineServing, false, true, 1})

	// A push of another epoch forgets the claims placed on the old cache.
	tb.applyLoad(loadReport{Node: "a", Seq: 4, Engine: route.EngineServing, Epoch: 3, HasState: true}, t0)
	check("epoch 3", want{route.EngineServing, false, true, 0})

	// Withdrawn: serving, but no digest to match.
	tb.applyLoad(loadReport{Node: "a", Seq: 5, Engine: route.EngineServing, Epoch: 0, HasState: true}, t0)
	check("withdrawn", want{route.EngineServing, false, false, 0})

	// A report of an earlier version changes neither.
	tb.applyLoad(loadReport{Node: "a", Seq: 6}, t0)
	check("stateless report", want{route.EngineServing, false, false, 0})
}

// TestTableMetaEngine checks a meta's engine counts until a push states it.
func TestTableMetaEngine(t *testing.T) {
	tb := newTable(4)
	m := metaAt(1, 5)
	tb.upsert("a", m, true, t0)
	tb.peers["a"].digest = testDigest("a", 1, 5)
	m.Engine = route.EngineDown
	tb.upsert("a", m, true, t0)
	if v := tb.views()[0]; v.Engine != route.EngineDown || v.Digest != nil {
		t.Fatalf("meta says down: view engine %v, digest %v; want down and none", v.Engine, v.Digest != nil)
	}
	tb.applyLoad(loadReport{Node: "a", Seq: 1, Engine: route.EngineServing, Epoch: 1, HasState: true}, t0)
	tb.upsert("a", m, true, t0) // a meta older than the push, gossiped late
	if v := tb.views()[0]; v.Engine != route.EngineServing {
		t.Errorf("after a stated push, a late meta set engine %v; want serving", v.Engine)
	}
}

// TestTableViewsSorted: views come out by ID whatever the order peers
// joined and left in, one per peer with a readable meta.
func TestTableViewsSorted(t *testing.T) {
	tb := newTable(4)
	for _, id := range []string{"d", "b", "e", "a", "c", "f"} {
		tb.upsert(id, metaAt(1, 1), id != "f", t0)
	}
	tb.remove("e")
	tb.remove("e")
	tb.remove("zz")
	tb.upsert("e2", metaAt(1, 1), true, t0)
	var got []string
	for _, v := range tb.views() {
		got = append(got, v.ID)
	}
	if want := []string{"a", "b", "c", "d", "e2"}; !slices.Equal(got, want) {
		t.Errorf("views = %v; want %v", got, want)
	}
	if len(tb.sorted) != len(tb.peers) {
		t.Errorf("sorted holds %d entries, peers %d", len(tb.sorted), len(tb.peers))
	}
}

// The local pod's view goes where its ID sorts among the peers', also
// before and after all of them.
func TestViewsWithSelf(t *testing.T) {
	tb := newTable(4)
	for _, id := range []string{"b", "d", "f"} {
		tb.upsert(id, metaAt(1, 1), true, t0)
	}
	for _, self := range []string{"a", "c", "e", "g"} {
		var ids []string
		for _, v := range tb.viewsWith(nil, &route.PeerView{ID: self, Local: true}) {
			ids = append(ids, v.ID)
		}
		if !slices.IsSorted(ids) || len(ids) != 4 || !slices.Contains(ids, self) {
			t.Errorf("views with self %s: %v; want the four IDs sorted", self, ids)
		}
	}
}

// Views written over a used buffer are the views a new slice gets, in
// the buffer's array when it is large enough: nothing of what it held
// shows, also where a peer without a meta was skipped.
func TestViewsOverBuffer(t *testing.T) {
	tb := newTable(4)
	for i := range 6 {
		m := metaAt(1, 1)
		m.Models = []string{"m"}
		tb.upsert(fmt.Sprintf("p%d", i), m, i != 2, t0) // p2's meta did not decode
		tb.applyDigest(testDigest(fmt.Sprintf("p%d", i), 1, 1, blockkey.Key(i)), t0)
	}
	tb.markFailed("p4", t0)
	self := &route.PeerView{ID: "p3x", Local: true}
	want := tb.viewsWith(nil, self)
	used := make([]route.PeerView, 12)
	for i := range used {
		used[i] = route.PeerView{ID: "stale", Addr: "10.0.0.1:1", Models: []string{"old"}, Draining: true,
			Load: route.Load{Running: 99, KVUsage: 1}, LoadAt: t0, LastFailure: t0, Claims: []route.Claim{{Key: 1, Keys: 1}}}
	}
	got := tb.viewsWith(used[:3], self)
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b route.Matcher) bool { return a == b })); diff != "" {
		t.Errorf("views over a used buffer (-new slice +over buffer):\n%s", diff)
	}
	if &got[0] != &used[0] {
		t.Errorf("views went to a new array; want the buffer's")
	}
}

// viewsAfter walks the table in chunks: every peer once, in order, also
// when peers come and go between chunks.
func TestViewsAfter(t *testing.T) {
	tb := newTable(4)
	for i := range 40 {
		tb.upsert(fmt.Sprintf("p%02d", i), metaAt(1, 1), true, t0)
	}
	var ids []string
	var buf [16]route.PeerView
	for after, more := "", true; more; {
		var vs []route.PeerView
		vs, more = tb.viewsAfter(after, buf[:0])
		for _, v := range vs {
			ids = append(ids, v.ID)
		}
		if len(vs) > 0 {
			after = vs[len(vs)-1].ID
		}
		if len(ids) == 16 {
			tb.remove("p16")                          // the next chunk's first
			tb.upsert("p15a", metaAt(1, 1), true, t0) // after the walk's place
			tb.upsert("p00a", metaAt(1, 1), true, t0) // behind it: not seen
		}
	}
	if !slices.IsSorted(ids) || len(ids) != 40 || slices.Contains(ids, "p16") || !slices.Contains(ids, "p15a") {
		t.Errorf("walked %d views %v; want 40 in order, p16 gone and p15a seen", len(ids), ids)
	}
}

// TestGapCauses: a solo mesh counts the deltas that cannot follow its copy
// by why: no copy yet, another epoch.
func TestGapCauses(t *testing.T) {
	m := start(t, testConfig("solo"))
	now := time.Now()
	m.tableMu.Lock()
	m.table.upsert("p", metaAt(1, 1), true, now)
	m.tableMu.Unlock()
	deltaMsg{bloom.Delta{Node: "p", Epoch: 1, From: 1, To: 2}}.apply(m, now) // no copy yet
	digestMsg{testDigest("p", 1, 1)}.apply(m, now)
	deltaMsg{bloom.Delta{Node: "p", Epoch: 1, From: 1, To: 2}}.apply(m, now) // follows: no gap
	deltaMsg{bloom.Delta{Node: "p", Epoch: 2, From: 1, To: 2}}.apply(m, now) // another epoch: the copy goes
	deltaMsg{bloom.Delta{Node: "p", Epoch: 2, From: 2, To: 3}}.apply(m, now) // and then no copy
	s := m.Stats()
	if s.Gaps != 3 || s.GapsNoCopy != 2 || s.GapsEpoch != 1 {
		t.Errorf("gaps %d: no copy %d, epoch %d; want 3: 2, 1", s.Gaps, s.GapsNoCopy, s.GapsEpoch)
	}
}
