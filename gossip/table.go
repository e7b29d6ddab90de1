package gossip

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// table is the view of every live peer: its meta, its digest and its recent
// failures. It is plain data, with time passed in; Mesh.tableMu guards it.
type table struct {
	peers map[string]*peer
	// sorted is every entry of peers, by ID: views come out in order
	// without a sort or a lookup, which at a thousand peers cost more
	// than the choice itself.
	sorted []named
	stride int // ours (Config.RoutingStride): views probe peers' digests in our keys
	// group holds the peers' plain digests bit by bit across peers
	// (regroup), for route to match them all at once; misfits counts the
	// peers whose plain digest is of another shape.
	group   *bloom.Transposed
	misfits int
	briefs  briefs // the peers as route.Shortlist reads them (briefs.go)
	// claims indexes the claims the peers hold, for route.Shortlist.
	claims route.ClaimIndex
}

type peer struct {
	meta     Meta
	metaOK   bool          // meta decoded at least once
	digest   *bloom.Digest // replaced wholesale, never modified
	grouped  *route.Member // digest as the table's group holds it; nil: not held
	misfit   bool          // digest is plain but of another shape than the group's (regroup)
	digestAt time.Time     // when digest last changed
	loadAt   time.Time     // when the load last arrived (push or meta)
	pushed   route.Load    // the newest pushed load; used once loadSeq > 0
	loadSeq  uint64        // Seq of pushed; 0 until the first push
	// engine and epoch are from the newest push that carried them (stated):
	// the peer's engine and the digest epoch it advertises, 0 for none.
	// Before such a push the meta's engine counts, and any digest epoch.
	engine      route.Engine
	epoch       uint64
	stated      bool
	version     uint64        // of the digest of epoch, from the newest push; 0: it carried none
	since       time.Time     // when the current cache began (route.PeerView.Since)
	claims      []route.Claim // newest last, at most keepClaims
	lastFailure time.Time     // last failed forward reported by MarkFailed
	behindSince time.Time     // since when digest has lagged meta; zero if not
	lastAsk     time.Time     // last need-full request sent to it
	// early holds deltas that arrived before the one they follow, by From.
	// memberlist hands queued UDP messages over newest first (its handoff
	// queue is LIFO), so a burst of deltas routinely arrives reversed.
	early      map[uint64]bloom.Delta
	earlySince time.Time // when the oldest held delta arrived; zero if none
	brief      int       // its place in the table's briefs; -1: none
}

// maxEarly bounds the deltas held per peer; more means something was lost.
const maxEarly = 64

// outcome is what applying a digest or delta did.
type outcome int

const (
	applied outcome = iota
	held            // ahead of our copy: held until the deltas between arrive
	stale           // older than our copy: dropped
	gap             // cannot follow our copy: ask for a full digest
	unknown         // from a node not in the table
)

type named struct {
	id string
	p  *peer
}

func byID(e named, id string) int { return strings.Compare(e.id, id) }

func newTable(stride int) *table {
	return &table{peers: map[string]*peer{}, stride: stride, group: bloom.NewTransposed()}
}

// upsert records a peer joining or updating its meta. metaOK false keeps the
// previous meta (a malformed update changes nothing). It reports whether the
// peer's digest was dropped because its epoch moved on: a meta that changes
// the digest epoch proves the old claims are gone, unless our copy is already
// of the new epoch (the full digest overtook the meta).
func (t *table) upsert(id string, m Meta, metaOK bool, now time.Time) (dropped bool) {
	p := t.peers[id]
	if p == nil {
		p = &peer{brief: -1}
		t.peers[id] = p
		i, _ := slices.BinarySearchFunc(t.sorted, id, byID)
		t.sorted = slices.Insert(t.sorted, i, named{id, p})
		t.unsort()
	}
	if !metaOK {
		return false
	}
	if !p.metaOK {
		t.unsort() // its first view
	}
	defer t.touch(p)
	if p.digest != nil && p.metaOK && p.meta.HasDigest && m.HasDigest &&
		p.meta.DigestEpoch != m.DigestEpoch && p.digest.Header().Epoch != m.DigestEpoch {
		p.digest, p.digestAt, dropped = nil, now, true
		t.regroup(p)
	}
	if m.Engine != route.EngineServing && !p.stated {
		t.dropDigest(p, now)
		t.dropClaims(id, p)
		p.since = now
	}
	p.meta, p.metaOK = m, true
	if p.loadSeq == 0 { // pushes are fresher than the meta's load
		p.loadAt = now
	}
	return dropped
}

// applyLoad records a pushed load report. Older reports than the last one
// applied are stale (UDP reorders); reports from unknown nodes are dropped.
func (t *table) applyLoad(r loadReport, now time.Time) outcome {
	p := t.peers[r.Node]
	if p != nil {
		defer t.touch(p)
	}
	switch {
	case p == nil:
		return unknown
	case r.Seq <= p.loadSeq:
		return stale
	}
	p.pushed, p.loadSeq, p.loadAt = r.Load, r.Seq, now
	if r.HasState {
		if (p.stated && r.Epoch != p.epoch) || r.Engine != route.EngineServing {
			t.dropClaims(r.Node, p) // placed on a cache that is gone, or on no cache
			p.since = now
		}
		if r.Engine != route.EngineServing || r.Epoch == 0 {
			t.dropDigest(p, now) // withdrawn: it must not match a byte more
		}
		p.engine, p.epoch, p.stated = r.Engine, r.Epoch, true
		p.version = r.Version // 0 without one, which no copy lags
	}
	return applied
}

func (t *table) dropDigest(p *peer, now time.Time) {
	if p.digest != nil {
		p.digest, p.digestAt = nil, now
		t.regroup(p)
	}
	p.early, p.earlySince = nil, time.Time{}
}

// engineState is the peer's engine: from its newest stated push, else from
// its meta.
func (p *peer) engineState() route.Engine {
	if p.stated {
		return p.engine
	}
	return p.meta.Engine
}

// current reports whether the digest held is the one the peer advertises
// now: a copy of an epoch its pushes no longer name (a restarted engine's
// old cache, or a new digest that overtook the push naming it) is held but
// never matched.
func (p *peer) current() bool {
	return p.digest != nil && (!p.stated || p.digest.Header().Epoch == p.epoch)
}

// remove forgets a peer that left or died, with its digest.
func (t *table) remove(id string) {
	p, ok := t.peers[id]
	if !ok {
		return
	}
	p.digest = nil
	t.regroup(p)
	t.dropClaims(id, p)
	delete(t.peers, id)
	t.unsort()
	if i, ok := slices.BinarySearchFunc(t.sorted, id, byID); ok {
		t.sorted = slices.Delete(t.sorted, i, i+1)
	}
}

// applyDigest replaces the origin's copy with d unless ours is newer in the
// same epoch. Another epoch always replaces: epochs are not ordered.
func (t *table) applyDigest(d *bloom.Digest, now time.Time) outcome {
	h := d.Header()
	p := t.peers[h.Node]
	if p == nil {
		return unknown
	}
	defer t.touch(p)
	if p.digest != nil {
		c := p.digest.Header()
		if c.Epoch == h.Epoch && h.Version < c.Version {
			return stale
		}
	}
	p.digest, p.digestAt = d, now
	p.drain(now)
	t.regroup(p)
	return applied
}

// applyDelta applies x to the origin's copy, then any held deltas that now
// follow. A delta ahead of the copy is held (see peer.early); repairs asks
// for a full digest if the gap does not fill within the reorder wait. A
// delta of another epoch drops the copy at once (its claims are gone) and
// reports a gap; dropped says so.
func (t *table) applyDelta(x bloom.Delta, now time.Time) (o outcome, dropped bool) {
	p := t.peers[x.Node]
	if p == nil {
		return unknown, false
	}
	defer t.touch(p)
	if p.digest == nil {
		return gap, false
	}
	defer t.regroup(p)
	h := p.digest.Header()
	switch {
	case x.Epoch != h.Epoch:
		p.digest, p.digestAt = nil, now
		p.early, p.earlySince = nil, time.Time{}
		return gap, true
	case x.From > h.Version:
		if len(p.early) >= maxEarly {
			return gap, false
		}
		if p.early == nil {
			p.early = map[uint64]bloom.Delta{}
		}
		if len(p.early) == 0 {
			p.earlySince = now
		}
		p.early[x.From] = x
		return held, false
	}
	next, err := p.digest.Apply(x)
	switch {
	case err == nil:
		p.digest, p.digestAt = next, now
		p.drain(now)
		return applied, false
	case errors.Is(err, bloom.ErrStale):
		return stale, false
	default:
		return gap, false
	}
}

// drain applies the held deltas that follow the copy and forgets those it
// has passed.
func (p *peer) drain(now time.Time) {
	for len(p.early) > 0 {
		v := p.digest.Header().Version
		x, ok := p.early[v]
		if !ok {
			break
		}
		delete(p.early, v)
		if next, err := p.digest.Apply(x); err == nil {
			p.digest, p.digestAt = next, now
		}
	}
	v := p.digest.Header().Version
	for from, x := range p.early {
		if x.To <= v || x.Epoch != p.digest.Header().Epoch || from < v {
			delete(p.early, from)
		}
	}
	if len(p.early) == 0 {
		p.earlySince = time.Time{}
	}
}

// markFailed records a failed forward to id; unknown peers are ignored.
func (t *table) markFailed(id string, at time.Time) {
	if p := t.peers[id]; p != nil && at.After(p.lastFailure) {
		defer t.touch(p)
		p.lastFailure = at
	}
}

// ask reports whether a need-full request may go to id now, at most one per
// interval, and records it.
func (t *table) ask(id string, now time.Time, interval time.Duration) bool {
	p := t.peers[id]
	if p == nil || (!p.lastAsk.IsZero() && now.Sub(p.lastAsk) < interval) {
		return false
	}
	p.lastAsk = now
	return true
}

// lagging reports whether p's meta, or its newest push, announces a
// digest we do not hold. The meta carries the digest version at every
// change only while a v0.1.0 member is in the mesh (advert.note); the
// pushes always do.
func (p *peer) lagging() bool {
	if !p.metaOK || !p.meta.HasDigest {
		return false
	}
	if p.digest == nil {
		return true
	}
	h := p.digest.Header()
	if h.Epoch != p.meta.DigestEpoch || h.Version < p.meta.DigestVersion {
		return true
	}
	return p.epoch == h.Epoch && h.Version < p.version
}

// repairs returns the peers to ask for a full digest now, sorted: those
// whose held deltas have waited reorderWait for a missing one, and those
// whose copy has lagged their meta for lagAfter (a lost last delta, which no
// later delta reveals). Each peer is asked at most once per interval.
func (t *table) repairs(now time.Time, reorderWait, lagAfter, interval time.Duration) []string {
	var ids []string
	for id, p := range t.peers {
		stuck := !p.earlySince.IsZero() && now.Sub(p.earlySince) >= reorderWait
		if p.lagging() {
			if p.behindSince.IsZero() {
				p.behindSince = now
			}
		} else {
			p.behindSince = time.Time{}
		}
		behind := !p.behindSince.IsZero() && now.Sub(p.behindSince) >= lagAfter
		if (stuck || behind) && t.ask(id, now, interval) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// views returns a PeerView of every peer whose meta we could read, sorted by
// ID. A peer without a readable meta has no address to forward to.
func (t *table) views() []route.PeerView { return t.viewsWith(nil, nil) }

// viewsWith is views with self, if set, in its place (at a thousand peers
// inserting it afterwards cost a second copy of every view), written over
// buf's array when it is large enough: a new one of a thousand views is
// 320 KB to clear and for the garbage collector to scan, which took twice
// as long as filling it.
func (t *table) viewsWith(buf []route.PeerView, self *route.PeerView) []route.PeerView {
	n := len(t.sorted)
	if self != nil {
		n++
	}
	vs := slices.Grow(buf[:0], n)
	for _, e := range t.sorted {
		if self != nil && e.id >= self.ID {
			vs, self = append(vs, *self), nil
		}
		vs = vs[:len(vs)+1] // filled in place: no 320-byte copy per peer
		if !t.view(&vs[len(vs)-1], e) {
			vs = vs[:len(vs)-1]
		}
	}
	if self != nil {
		vs = append(vs, *self)
	}
	return vs
}

// viewsAfter fills buf (up to its capacity) with the views of the peers
// after the ID after ("": from the first), in views' order, and says
// whether peers remain: a walk over the table in chunks, its lock released
// between them.
func (t *table) viewsAfter(after string, buf []route.PeerView) ([]route.PeerView, bool) {
	i := 0
	if after != "" {
		i, _ = slices.BinarySearchFunc(t.sorted, after, byID)
		if i < len(t.sorted) && t.sorted[i].id == after {
			i++
		}
	}
	vs := buf[:0]
	for ; i < len(t.sorted) && len(vs) < cap(vs); i++ {
		vs = vs[:len(vs)+1]
		if !t.view(&vs[len(vs)-1], t.sorted[i]) {
			vs = vs[:len(vs)-1]
		}
	}
	return vs, i < len(t.sorted)
}

// view sets v to e's view and reports whether e has one: a peer whose
// meta we could not read has no address to forward to.
func (t *table) view(v *route.PeerView, e named) bool {
	id, p := e.id, e.p
	if !p.metaOK {
		return false
	}
	*v = route.PeerView{
		ID:   id,
		Addr: p.meta.APIAddr,
		// Kept by forward after the peer leaves (forward/direct.go).
		EngineAddr: p.meta.EngineAddr,
		StoreGone:  p.meta.StoreGone,
		// Shared: a meta is replaced whole, never modified.
		Models: p.meta.Models,
		// Models lists only what fits the meta; route knows what that means.
		ModelsTruncated: p.meta.ModelsTruncated,
		KeyScheme:       int(p.meta.KeyScheme),
		Ranks:           p.meta.Ranks,
		Load:            p.load(),
		LoadAt:          p.loadAt,
		// Every member pushes its load within a second of learning of
		// us; one that has not is dead or not yet heard from, and
		// route keeps a Fronted peer with no LoadAt out (SilentFor).
		// Its meta's load is as old as the meta.
		LastFailure: p.lastFailure,
		Draining:    p.meta.Draining,
		Engine:      p.engineState(),
		Since:       p.since,
		Claims:      p.claims, // copy-on-write (addClaim)
	}
	if p.loadSeq == 0 {
		v.LoadAt = time.Time{}
	}
	if p.current() { // a nil *Digest in the interface would not be nil
		var m route.Matcher = p.digest
		if p.grouped != nil {
			m = p.grouped
		}
		v.Digest, v.DigestAt = route.Strided(m, p.meta.Stride, t.stride), p.digestAt
	}
	return true
}

// keepClaims bounds the claims kept per peer: enough for the bursts of a
// few distinct prefixes within route.Config.ClaimTTL.
const keepClaims = 32

// addClaims returns claims with cs appended, each made at at, dropping
// the oldest beyond keepClaims. It never modifies claims: views share the
// slice with every request's snapshot instead of copying it per request.
// A request's claims come in one call, so they cost one copy, not one
// per claim.
func addClaims(claims []route.Claim, at time.Time, cs ...route.Claim) []route.Claim {
	all := len(claims) + len(cs)
	out := make([]route.Claim, 0, min(all, keepClaims))
	skip := all - cap(out) // the oldest, beyond keepClaims
	if skip < len(claims) {
		out = append(out, claims[skip:]...)
	}
	for _, c := range cs[max(0, skip-len(claims)):] {
		c.At = at
		out = append(out, c)
	}
	return out
}

// claim records claims on a known peer; unknown peers are ignored.
func (t *table) claim(id string, at time.Time, cs ...route.Claim) {
	if p := t.peers[id]; p != nil && p.engineState() == route.EngineServing { // a claim on no cache is void
		defer t.touch(p)
		old := p.claims
		p.claims = addClaims(old, at, cs...)
		// addClaims keeps a tail of the old list and appends the new.
		kept := len(p.claims) - min(len(cs), len(p.claims))
		t.claims.Drop(id, old[:len(old)-kept])
		t.claims.Add(id, p.claims[kept:])
	}
}

// dropClaims forgets every claim p holds, in its list and in the index.
func (t *table) dropClaims(id string, p *peer) {
	t.claims.Drop(id, p.claims)
	p.claims = nil
}

// load is the peer's newest load: pushed, or from its meta before any push.
func (p *peer) load() route.Load {
	if p.loadSeq > 0 {
		return p.pushed
	}
	return loadOf(p.meta)
}

// loadOf is the load a meta carries. It is Fronted like a pushed one: every
// member is a sidecar that fronts its pod, and one that has not pushed for
// route.Config.SilentFor (a pod that died before it ever pushed to us) is
// out of the choice until it does.
func loadOf(m Meta) route.Load {
	return route.Load{
		Fronted:             true,
		Running:             m.Running,
		Waiting:             m.Waiting,
		KVUsage:             float64(m.KVUsageMilli) / 1000,
		Serving:             m.Serving,
		QueuedPrefillTokens: m.QueuedPrefill,
	}
}
