package route

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// assessment is one policy's choice in the making, a row per peer: who
// is eligible, each peer's load and the load bound (assess), then what
// the policy weighs. The Decision's Candidates are built from it last
// (decision, list.go), for every peer or only those the caller uses.
type assessment struct {
	cfg     *Config
	req     *Request
	peers   []PeerView
	at      moment // now, and the cutoffs every peer's times meet
	rows    []row
	d       Decision // all but its Candidates
	chosen  int      // the row chosen, or -1
	allOver bool     // every eligible peer is over the bound, so none is passed over
	waiting float64  // the eligible peers' mean Ahead
	idle    bool     // some eligible peer has no load and nothing waiting
}

// row is one peer as a policy weighs it: Candidate's numbers without its
// strings, so that a choice among a thousand peers reads each PeerView
// once and goes over rows that stay in cache.
type row struct {
	load, score   float64
	queued, ahead int
	// The match, in routing keys and in tokens per tier (capped at the
	// prompt; setMatch), on rank of ranks looked at.
	keys, gpu, cpu, disk int
	rank, ranks          int
	w                    uint64 // the rendezvous weight, once computed (assessment.weight)
	flags                flags
}

// flags are a row's facts: its state in the choice, then what its note
// says (note).
type flags uint16

const (
	rowEligible flags = 1 << iota
	rowOver
	rowScored
	rowPinned
	rowUnlisted // the model is not in its list, but its digest holds it
	rowStaleLoad
	rowOtherScheme // matching is skipped; the note names the scheme
	rowNoDigest
	rowStaleDigest
	rowRecent  // the match reaches further by this sidecar's forwards
	rowClaimed // or by claims
	rowBusier  // Rendezvous passed it over
	rowLocal   // PeerView.Local, kept here for the passes over rows
	rowWeighed // w is set

	// rowMatch are the flags a match sets: a Chain's later policy, which
	// does not match, shows its first policy's (decision).
	rowMatch = rowPinned | rowOtherScheme | rowNoDigest | rowStaleDigest | rowRecent | rowClaimed
)

func (r *row) is(f flags) bool { return r.flags&f != 0 }

// idle says the peer has no request, nor one waiting (idles).
func (r *row) idle() bool { return idles(r.load, r.ahead) }

// idles says a peer of load with ahead requests waiting has no request,
// nor one waiting: its load is at most its KV pressure's.
func idles(load float64, ahead int) bool { return load < 1 && ahead == 0 }

// assess checks eligibility and computes load and the bound for every
// peer, in rows (one per peer, overwritten): rate, then bound. It does
// not match keys: only Affinity pays for that, between the two.
func assess(cfg *Config, req *Request, peers []PeerView, now time.Time, rows []row) assessment {
	a := rate(cfg, req, peers, now, rows)
	a.bound()
	return a
}

// rate is assess's pass over the peers: each row's eligibility and load,
// and the eligible peers' mean load and queue.
func rate(cfg *Config, req *Request, peers []PeerView, now time.Time, rows []row) assessment {
	a := assessment{cfg: cfg, req: req, peers: peers, at: momentOf(cfg, now), rows: rows, chosen: -1}
	var sum float64
	ahead, idle := 0, false // idle: an eligible peer with no load and nothing waiting
	for i := range peers {
		p, r := &peers[i], &rows[i]
		*r = row{rank: NoRank}
		if p.Local {
			r.flags = rowLocal
		}
		if excluded(cfg, p, req, &a.at) != "" {
			continue
		}
		r.flags |= rowEligible
		a.d.Eligible++
		if req.Model != "" && p.ModelsTruncated && !slices.Contains(p.Models, req.Model) {
			r.flags |= rowUnlisted
		}
		var stale bool
		r.load, r.queued, r.ahead, stale = load(cfg, p, &a.at)
		if stale {
			r.flags |= rowStaleLoad
		}
		sum += r.load
		ahead += r.ahead
		idle = idle || r.idle()
	}
	if rs := req.Rest; rs != nil {
		a.d.Eligible += rs.Eligible
		sum += rs.Load
		ahead += rs.Ahead
		idle = idle || rs.Idle
	}
	if a.d.Eligible > 0 {
		a.idle = idle
		a.waiting = float64(ahead) / float64(a.d.Eligible)
		a.d.Mean = (sum + 1) / float64(a.d.Eligible)
	}
	return a
}

// bound sets the load bound and marks the rows over it. A match may
// spare a row the tight bound (rowRecent, rowClaimed): Affinity matches
// before it bounds.
func (a *assessment) bound() {
	if a.d.Eligible == 0 {
		return
	}
	cfg, m, rows := a.cfg, a.d.Mean, a.rows
	bound := max(m*(1+cfg.Slack), m+cfg.MinHeadroom)
	a.d.Bound = bound
	// The tight bound spares a peer whose match reaches further by what
	// was just sent there (this sidecar's forwards, claims): the requests
	// waiting there are most likely this one's siblings (a burst of one
	// new prefix), which its prefill serves too.
	tight := math.Inf(1)
	if a.idle && (cfg.IdleSlack > 0 || cfg.IdleHeadroom > 0) {
		tight = max(m*(1+cfg.IdleSlack), m+cfg.IdleHeadroom)
	}
	tightened, allOver := 0, true
	for i := range rows {
		r := &rows[i]
		if !r.is(rowEligible) {
			continue
		}
		switch {
		case r.load+1 > bound:
			r.flags |= rowOver
		case r.ahead > 0 && r.load+1 > tight && !r.is(rowRecent|rowClaimed):
			r.flags |= rowOver
			tightened++
		default:
			allOver = false
		}
	}
	a.allOver = allOver
	if tightened > 0 {
		a.d.Note = addNote(a.d.Note, fmt.Sprintf("a peer idles: %s with requests waiting over %s",
			plural(tightened, "peer"), num(tight, 2)))
	}
	if a.allOver {
		a.d.Note = addNote(a.d.Note, "every peer over the bound")
	}
}

// inBound reports whether a policy that respects the bound may pick row i.
func (a *assessment) inBound(i int) bool { return a.rows[i].inBound(a.allOver) }

// inBound is the assessment's inBound for r, allOver its allOver.
func (r *row) inBound(allOver bool) bool {
	return r.is(rowEligible) && (!r.is(rowOver) || allOver)
}

// Excluded returns why p may serve no request at all now (its engine down,
// draining, silent, a failed forward), or "": what /debug/peers shows.
func Excluded(cfg Config, p PeerView, now time.Time) string {
	at := momentOf(&cfg, now)
	return excluded(&cfg, &p, &Request{}, &at)
}

// moment is now and what a choice compares every peer's times with,
// computed once a choice: a comparison per peer where a time.Sub was
// (for times without a monotonic reading, a dozen nanoseconds each).
type moment struct {
	now time.Time
	// A report from before stale is stale (LoadTTL), one from before
	// silent silent (SilentFor), and a failure after failed recent
	// (FailFor); the N's are the same in Unix nanoseconds (nanos), and
	// digestN is when a digest received before it is stale (DigestTTL).
	stale                             time.Time
	staleN, silentN, failedN, digestN int64
}

func momentOf(cfg *Config, now time.Time) moment {
	n := now.UnixNano()
	return moment{now: now, stale: now.Add(-cfg.LoadTTL), staleN: n - int64(cfg.LoadTTL),
		silentN: n - int64(cfg.SilentFor), failedN: n - int64(cfg.FailFor), digestN: n - int64(cfg.DigestTTL)}
}

// excluded returns why p may not serve req, or "".
func excluded(cfg *Config, p *PeerView, req *Request, at *moment) string {
	switch barOf(cfg, p.Engine, p.Draining, p.Load.Fronted && !p.Local, nanos(p.LoadAt), nanos(p.LastFailure), at) {
	case barEngine:
		return "engine " + p.Engine.String()
	case barDraining:
		return "draining"
	case barNoPush:
		return "silent: no push yet"
	case barSilent:
		return fmt.Sprintf("silent %s", at.now.Sub(p.LoadAt).Round(time.Millisecond))
	case barFailed:
		return fmt.Sprintf("failed %s ago", at.now.Sub(p.LastFailure).Round(time.Millisecond))
	}
	if req.Model != "" && len(p.Models) > 0 && !slices.Contains(p.Models, req.Model) {
		if p.ModelsTruncated && holdsModel(cfg, p, req.Keys, at.now) {
			return ""
		}
		return "model"
	}
	return ""
}

// bar is why a peer may serve no request at all now (barOf), or barNone.
type bar uint8

const (
	barNone bar = iota
	barEngine
	barDraining
	barNoPush // watched, and no push yet
	barSilent // watched, and no push for SilentFor
	barFailed // a forward failed within FailFor
)

// barOf is excluded's rule but the model's, from the fields a Brief keeps
// as well as a PeerView: the engine's state, draining, the time of the
// last load report (watched: a fronted peer not this one, whose silence
// means it is gone) and of the last failed forward, in Unix nanoseconds,
// 0 for never.
func barOf(cfg *Config, e Engine, draining, watched bool, loadAt, failed int64, at *moment) bar {
	switch {
	case e != EngineServing:
		return barEngine
	case draining:
		return barDraining
	case watched && cfg.SilentFor > 0 && loadAt == 0:
		return barNoPush
	case watched && cfg.SilentFor > 0 && loadAt < at.silentN:
		return barSilent
	case failed != 0 && failed > at.failedN:
		return barFailed
	}
	return barNone
}

// nanos is t in Unix nanoseconds, 0 for the zero time: how a Brief keeps
// its times, and barOf compares them.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// holdsModel reports whether p's digest holds the first MinMatchKeys keys
// of the request (at least one). Keys are seeded with the model's name
// (blockkey.Root), so only a pod that served that model computed them:
// the evidence that lets a peer whose list was truncated serve a model it
// could not list. Claims and Recent do not count; they record where
// requests were sent, not what the pod serves.
func holdsModel(cfg *Config, p *PeerView, keys []blockkey.Key, now time.Time) bool {
	n := max(cfg.MinMatchKeys, 1)
	if len(keys) < n || p.Digest == nil || p.KeyScheme != blockkey.Version ||
		(cfg.DigestTTL > 0 && now.Sub(p.DigestAt) > cfg.DigestTTL) {
		return false
	}
	tm, ok := p.Digest.(TierMatcher)
	if !ok {
		return p.Digest.PrefixLen(keys[:n]) == n
	}
	// A pod of several ranks may hold the model's blocks on one rank
	// only; the model is served by every rank.
	ranks, _ := rankCount(p, tm)
	for r := range ranks {
		if g, _, _ := tm.TierPrefix(keys[:n], r); g == n {
			return true
		}
	}
	return false
}

// load returns p's load in requests, the prefill tokens queued ahead of a
// new request there and how many requests they are, and whether the report
// was stale:
//
//	load   = busy + InFlight + kv
//	queued = QueuedPrefillTokens + InFlightPrefillTokens
//	ahead  = Prefilling + InFlightPrefilling
//
// where busy is Serving for a Fronted peer, else max(Running+Waiting,
// Serving), and kv rises from 0 at KVKnee usage to KVWeight when full;
// or only what this sidecar has in flight there when the report is older
// than LoadTTL (or never came).
func load(cfg *Config, p *PeerView, at *moment) (x float64, queued, ahead int, stale bool) {
	l := &p.Load
	inflight := float64(max(l.InFlight, 0))
	queued, ahead = max(l.InFlightPrefillTokens, 0), max(l.InFlightPrefilling, 0)
	if p.LoadAt.IsZero() || (cfg.LoadTTL > 0 && p.LoadAt.Before(at.stale)) {
		return inflight, queued, ahead, true
	}
	// InFlight is what the report cannot count yet: each send raises the
	// target's load at once, which stops a burst from piling onto one pod
	// between reports.
	x = loadOf(cfg, busy(l), inflight, l.KVUsage)
	return x, queued + max(l.QueuedPrefillTokens, 0), ahead + max(l.Prefilling, 0), false
}

// busy is the requests a fresh report counts at the peer: Serving for a
// Fronted peer, else max(Running+Waiting, Serving).
func busy(l *Load) int {
	if l.Fronted {
		return max(l.Serving, 0)
	}
	return max(max(l.Running, 0)+max(l.Waiting, 0), l.Serving)
}

// loadOf is load's sum for a fresh report: busy requests, those in
// flight, and the KV term, rising from 0 at KVKnee usage to KVWeight
// when full.
func loadOf(cfg *Config, busy int, inflight, kv float64) float64 {
	x := float64(busy) + inflight
	if kv > cfg.KVKnee && !math.IsNaN(kv) {
		x += cfg.KVWeight * (min(kv, 1) - cfg.KVKnee) / (1 - min(cfg.KVKnee, 0.999))
	}
	return x
}

// wait is what a request waits for at a peer before its own prefill, in
// prefill tokens: the work queued there (at QueuedWeight) and price
// tokens for each request of load. It is the one cost that Affinity (at
// LoadTokens), Rendezvous and LeastLoad (at Config.price) rank by.
func wait(cfg *Config, queued int, load, price float64) float64 {
	return waitAt(cfg.queuedWeight(), queued, load, price)
}

// waitAt is wait with the queue's weight qw (Config.queuedWeight) worked
// out once, for a loop over many peers.
func waitAt(qw float64, queued int, load, price float64) float64 {
	return qw*float64(queued) + price*load
}

// queuedWeight is QueuedWeight, at least 0.
func (cfg *Config) queuedWeight() float64 { return max(cfg.QueuedWeight, 0) }

// price is LoadTokens for ranking by load alone: at least 1 token.
func (cfg Config) price() float64 { return max(cfg.LoadTokens, 1) }

// rendezvousKey returns the key that stands for the request's first
// RendezvousKeys routing keys, and false for a prompt with no keys.
//
// For a long prompt the key reaches MinMatchFraction of it, the share that
// Affinity needs: requests that share that much meet on one pod, while
// long unrelated prompts behind a short common preamble (every request of
// the Mooncake conversation trace shares its first 512 tokens) spread
// instead of all hashing to the same pod.
func rendezvousKey(cfg Config, keys []blockkey.Key) (blockkey.Key, bool) {
	if len(keys) == 0 {
		return 0, false
	}
	return keys[RendezvousDepth(cfg, len(keys))-1], true
}

// RendezvousDepth is how many leading keys of an n-key prompt (n > 0) the
// rendezvous key stands for: a cold prompt's home is its weights' top at
// that depth (kvscale's central index breaks its ties so too).
func RendezvousDepth(cfg Config, n int) int {
	return min(n, max(cfg.RendezvousKeys, 1, int(math.Ceil(cfg.MinMatchFraction*float64(n)))))
}

// weight is the highest-random-weight hash of (peer, key): FNV-1a of the ID
// folded into a splitmix64 finaliser. Every sidecar computes the same value.
func weight(id string, k blockkey.Key) uint64 { return weighed(IDHash(id), k) }

// weighed is weight for the peer whose IDHash is h.
func weighed(h uint64, k blockkey.Key) uint64 { return mix(h ^ mix(uint64(k))) }

// IDHash is the half of a peer's rendezvous weights that is its ID's
// alone (FNV-1a), which a Brief keeps.
func IDHash(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return h
}

func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// unit maps a weight to [0, 1) for display.
func unit(w uint64) float64 { return float64(w>>11) / (1 << 53) }

// better reports whether row i outranks j: higher score, then higher
// rendezvous weight for key k, then the smaller ID. The order of peers
// never matters.
func (a *assessment) better(k blockkey.Key, i, j int) bool {
	if si, sj := a.rows[i].score, a.rows[j].score; si != sj {
		return si > sj
	}
	if wi, wj := a.weight(i, k), a.weight(j, k); wi != wj {
		return wi > wj
	}
	return a.peers[i].ID < a.peers[j].ID
}

// top follows the rows a policy scores, in order, for best: the first
// to score the highest score, and whether a later one ties it.
type top struct {
	i     int // -1 until a row is seen
	score float64
	tied  bool
}

func (t *top) see(i int, score float64) {
	switch {
	case t.i < 0 || score > t.score:
		*t = top{i: i, score: score}
	case score == t.score:
		t.tied = true
	}
}

// best returns the scored row that outranks the others (better), or -1
// when none is scored. Only the rows that score t's score can, so the
// rendezvous weights that break ties are hashed for those alone, not for
// every row that ties with a best so far (among many idle peers, most of
// those before the holder's), and not at all when none ties. A NaN
// score, which no other raises or ties, is best only as the first row
// scored: one pass of better never outranks it either.
func (a *assessment) best(k blockkey.Key, t top) int {
	if !t.tied {
		return t.i
	}
	best := t.i
	for i := t.i + 1; i < len(a.rows); i++ {
		if r := &a.rows[i]; r.is(rowScored) && r.score == t.score && a.better(k, i, best) {
			best = i
		}
	}
	return best
}

// weight is row i's rendezvous weight for key k, computed once a choice:
// the best so far meets every peer that ties with it.
func (a *assessment) weight(i int, k blockkey.Key) uint64 {
	r := &a.rows[i]
	if !r.is(rowWeighed) {
		r.w, r.flags = weight(a.peers[i].ID, k), r.flags|rowWeighed
	}
	return r.w
}

// choose marks row i chosen and fills the Decision's target.
func (a *assessment) choose(i int, reason string) assessment {
	a.chosen = i
	a.d.Target, a.d.Local, a.d.Reason = a.peers[i].ID, a.peers[i].Local, reason
	return *a
}

// decline leaves the Decision with no target and says why.
func (a *assessment) decline(why string) assessment {
	a.d.Reason = ReasonNone
	a.d.Note = addNote(a.d.Note, why)
	return *a
}

func addNote(note, s string) string {
	if note == "" {
		return s
	}
	return note + "; " + s
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func addTag(note, s string) string {
	if s == "" {
		return note
	}
	if note == "" {
		return s
	}
	return note + ", " + s
}

// ttft is row r's expected time to first token: its wait and the
// prompt's tokens it does not hold, at the engine's prefill rate, and the
// loads of those it holds on a lower tier at theirs (Config.saved). Only
// Affinity knows the matches; the other policies' rows are priced as if
// they held nothing, which for a prefix nobody holds is the truth. 0 when
// the rate or the prompt is not known.
func (a *assessment) ttft(r *row) float64 {
	rate, prompt := a.cfg.PrefillTokensPerSecond, a.req.PromptTokens
	if rate <= 0 || prompt <= 0 {
		return 0
	}
	work := a.cfg.work(prompt, r.gpu, r.cpu, r.disk)
	// The queue at its real cost, whatever QueuedWeight ranks by.
	return (float64(r.queued) + max(a.cfg.LoadTokens, 0)*r.load + work) / rate
}
