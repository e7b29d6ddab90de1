package forward

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/route"
)

// Admission by a per-pod queue bound (Config.MaxQueue, Config.MaxQueueWait).
//
// A pod is full when its engine has MaxQueue or more requests waiting (not
// yet scheduled), or when the prompt tokens queued there for prefill would
// take MaxQueueWait or more at the engine's prefill rate: a request sent
// there would wait that long for its first token. A busy pod (a full batch,
// nothing waiting) is not full. When every pod that could serve a client's
// request (the choice's eligible candidates) is full, the front answers 429
// with Retry-After at once, before any of the request is proxied: queueing
// it anyway would only lengthen every pod's wait, and the wait after the
// burst. A refusal marks no pod failed: a full pod is busy, not dead.
//
// Admitted, a request goes to a pod with room: the choice's failover
// order (Decision.Attempts) is kept, but the full pods move to its end
// (steer), so the prefix holder serves it unless its queue is full, and a
// request the mesh has room for does not wait behind a full queue because
// its prefix lives there (the overload scenario's chats waited 54 s so).
//
// A pod is also full for a request of over SmallPrefill uncached tokens
// while its engine's prefill share (route.Load.PrefillShare, Config.
// MaxPrefillShare) is at the bound and the request would leave more than
// one engine step's token budget (Config.StepTokens) queued for prefill
// there: a queue bound alone is refilled as fast as the engine drains it,
// so under a sustained backlog every engine step carries a full prefill
// chunk and the answers it decodes crawl (the overload scenario's long
// answers got 2 tokens a second for a minute). Refusing long prompts
// there drains the queue and gives the engine prefill-free steps a share
// of its time; a short one (a follow-up turn of a cached conversation)
// costs a step little and is still taken. A queue that fits in a step is
// not that backlog, however often the engine prefills: its steps stay
// short and its answers keep their pace. On the share alone, multi-turn
// chat at its knee lost 3.6-4.3% of its requests after the clients'
// retries (8 pods, 60 req/s) for answers 2% faster at the p99; with the
// step budget a fifth to a half fewer (its queues often pass a step).
//
// A client's last attempt passes the prefill share (Config.ServeRetry):
// the OpenAI and Anthropic SDKs number every attempt (RetryCountHeader,
// 0 on the first) and give up after their second retry, so refusing that
// attempt for the answers' pace loses a request a pod with room in its
// queue could serve, a second and a half later than its first attempt.
// The queue bounds still refuse it: they keep a burst's wait bounded,
// and the share only the pace of the answers decoding meanwhile.
//
// A request that arrives as a hop was admitted by its sender and is served
// (or refused with 503 for the usual reasons, serveHop): it is never
// forwarded again and never refused for the queue, so a full mesh cannot
// bounce it between pods. The sender's view is at most a load report old,
// so a pod can pass its bound by what arrives within one report.
//
// Whatever the bounds, a client's request that no engine can take (every
// candidate ineligible, the local engine down) gets a retryable 503 at once.

// queueFullKind is the request_errors_total kind of a refused request;
// prefillBusyKind of one refused only for the prefill share.
const (
	queueFullKind   = "queue_full"
	prefillBusyKind = "prefill_busy"
)

// SmallPrefill is the uncached tokens up to which a request is admitted
// whatever the pod's prefill share: at a prefill rate near 16k tokens a
// second (the simulator's, an 8B model on an H100) 1024 tokens are about
// 60 ms, a few decode steps.
const SmallPrefill = 1024

// RetryCountHeader numbers a client's attempts at one request: the
// Stainless-built SDKs (OpenAI's and Anthropic's, in Python, Node and Go)
// send it on every attempt, 0 on the first.
const RetryCountHeader = "X-Stainless-Retry-Count"

// noEngineKind is the request_errors_total kind of a request no engine
// could take (every pod's engine down).
const noEngineKind = "no_engine"

// retryAfter is the Retry-After of a refusal, in seconds: about the time
// a load report takes to show a queue draining, and short enough that a
// client's retry lands soon after the burst ends.
const retryAfter = 1

// podQueue is one pod's queue as the front knows it.
type podQueue struct {
	Waiting int     // requests waiting at the engine
	Prefill int     // prompt tokens queued for prefill
	Share   float64 // the engine's prefill share now (route.ShareAt)
	// Work is the uncached tokens the request at hand would prefill
	// there (route.Config.Work); 0 when not known.
	Work float64
}

// bounds are admission's: MaxRequests waiting, MaxWait of queued prefill
// at PrefillRate tokens a second, MaxShare of prefill share for a request
// of over SmallPrefill tokens that would leave more than StepTokens
// queued. A zero bound is off, and so is a MaxShare of 1 or more; a zero
// StepTokens counts no queue.
type bounds struct {
	MaxRequests int
	MaxWait     time.Duration
	PrefillRate float64
	MaxShare    float64
	StepTokens  int
}

func (b bounds) off() bool {
	return b.MaxRequests <= 0 && (b.MaxWait <= 0 || b.PrefillRate <= 0) && !b.shareOn()
}

func (b bounds) shareOn() bool { return b.MaxShare > 0 && b.MaxShare < 1 }

// full reports whether a pod with queue q takes no new request.
func (b bounds) full(q podQueue) bool {
	return b.queueFull(q) || b.shareFull(q)
}

// queueFull is full by the queue bounds alone.
func (b bounds) queueFull(q podQueue) bool {
	if b.MaxRequests > 0 && q.Waiting >= b.MaxRequests {
		return true
	}
	return b.MaxWait > 0 && b.PrefillRate > 0 &&
		time.Duration(float64(q.Prefill)/b.PrefillRate*float64(time.Second)) >= b.MaxWait
}

// shareFull is full for q's request by the prefill share.
func (b bounds) shareFull(q podQueue) bool {
	return b.shareOn() && q.Work > SmallPrefill && q.Share >= b.MaxShare &&
		float64(max(q.Prefill, 0))+q.Work > float64(max(b.StepTokens, 0))
}

// admit reports whether a request may be served, given the queues of the
// pods that could serve it: yes when the bounds are off, when no pod could
// serve it (the front then answers as it does without bounds), or when at
// least one pod is not full.
func admit(qs []podQueue, b bounds) bool {
	if b.off() || len(qs) == 0 {
		return true
	}
	for _, q := range qs {
		if !b.full(q) {
			return true
		}
	}
	return false
}

// queueAt is pod p's queue as the front knows it. Waiting is the larger of
// the engine's scraped vllm:num_requests_waiting and, for a fronted pod,
// its exact requests less the scraped running ones (the scrape is up to
// --load-interval old; when the batch is full, every request that arrived
// since waits), both while the report is younger than cfg.LoadTTL; plus
// what this front sent it since the report (InFlight, taken as queued). A
// stale or missing report counts only those. Prefill is the pushed queued
// prefill tokens and this front's own since (the local pod's are exact).
// Share is the pushed prefill share carried to now with the report's
// queue (route.ShareAt); 0 for a stale report.
func queueAt(cfg route.Config, p *route.PeerView, now time.Time) podQueue {
	q := podQueue{Waiting: max(p.Load.InFlight, 0), Prefill: max(p.Load.InFlightPrefillTokens, 0)}
	if !p.LoadAt.IsZero() && (cfg.LoadTTL <= 0 || now.Sub(p.LoadAt) <= cfg.LoadTTL) {
		w := max(p.Load.Waiting, 0)
		if p.Load.Fronted {
			// Serving is exact, Running a scrape up to its interval old:
			// in a burst the difference counts requests vLLM has
			// scheduled since. None of them waits unless it also waits
			// for its first token (Prefilling, exact).
			w = max(w, min(p.Load.Serving-max(p.Load.Running, 0), p.Load.Prefilling))
		}
		q.Waiting += w
		q.Prefill += max(p.Load.QueuedPrefillTokens, 0)
		q.Share = route.ShareAt(p.Load.PrefillShare, p.Load.QueuedPrefillTokens > 0, now.Sub(p.LoadAt))
	}
	return q
}

// candidateQueues returns queueAt of each eligible candidate of d, with
// the work a request of prompt tokens would be there (0 tokens: none);
// peers are those the choice was made on (choose's second result).
func candidateQueues(cfg route.Config, d route.Decision, peers []route.PeerView, prompt int, now time.Time) []podQueue {
	var out []podQueue
	eachQueue(cfg, d, peers, prompt, now, func(q podQueue) bool {
		out = append(out, q)
		return true
	})
	return out
}

// eachQueue calls f with each of candidateQueues' queues in turn, until f
// returns false: admission stops at the first pod with room, which at a
// thousand peers is most of its cost saved.
//
// A Decision among many peers lists only some (route.ListPeers): when
// none of those has room, the peers it omits follow, those route.Excluded
// does not rule out, each with the prompt's whole work (what they hold of
// it was not kept).
func eachQueue(cfg route.Config, d route.Decision, peers []route.PeerView, prompt int, now time.Time, f func(podQueue) bool) {
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if !c.Eligible {
			continue
		}
		p := peerAt(peers, c)
		if p == nil {
			continue
		}
		q := queueAt(cfg, p, now)
		if prompt > 0 {
			q.Work = cfg.Work(c, prompt)
		}
		if !f(q) {
			return
		}
	}
	if d.Omitted == 0 {
		return
	}
	listed := make(map[int]bool, len(d.Candidates))
	for i := range d.Candidates {
		listed[d.Candidates[i].Index] = true
	}
	for i := range peers {
		if listed[i] || route.Excluded(cfg, peers[i], now) != "" {
			continue
		}
		q := queueAt(cfg, &peers[i], now)
		q.Work = float64(max(prompt, 0))
		if !f(q) {
			return
		}
	}
}

// steer returns d with the full pods (by qs, keyed by peer ID) moved to the
// end of its failover order and the first other one as its target, and
// whether the target changed. Pods missing from qs are not full.
func steer(d route.Decision, qs map[string]podQueue, b bounds) (route.Decision, bool) {
	if b.off() || len(d.Attempts) < 2 {
		return d, false
	}
	var room, full []string
	for _, id := range d.Attempts {
		if q, ok := qs[id]; ok && b.full(q) {
			full = append(full, id)
		} else {
			room = append(room, id)
		}
	}
	if len(room) == 0 || room[0] == d.Attempts[0] {
		return d, false
	}
	d.Attempts = append(room, full...)
	d.Target = room[0]
	d.Candidates = slices.Clone(d.Candidates)
	for i := range d.Candidates {
		c := &d.Candidates[i]
		c.Chosen = c.ID == d.Target
		if c.Chosen {
			d.Local = c.Local
		}
	}
	return d, true
}

// steered is steer for the front's peers, for a request of prompt tokens
// admitted under b.
func (h *Handler) steered(d route.Decision, peers []route.PeerView, prompt int, b bounds) (route.Decision, bool) {
	if b.off() {
		return d, false
	}
	if len(d.Attempts) < 2 {
		return d, false
	}
	// steer moves only the failover order's pods: their queues alone.
	now := h.now()
	qs := make(map[string]podQueue, len(d.Attempts))
	for _, id := range d.Attempts {
		if p := peerOf(d, peers, id); p != nil {
			qs[id] = queueAt(h.cfg.Route, p, now)
		}
	}
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if q, ok := qs[c.ID]; ok && prompt > 0 {
			q.Work = h.cfg.Route.Work(c, prompt)
			qs[c.ID] = q
		}
	}
	return steer(d, qs, b)
}

func (h *Handler) bounds() bounds {
	return bounds{MaxRequests: h.cfg.MaxQueue, MaxWait: h.cfg.MaxQueueWait,
		PrefillRate: h.cfg.Route.PrefillTokensPerSecond, MaxShare: h.cfg.MaxPrefillShare, StepTokens: h.cfg.StepTokens}
}

// admitted decides whether a client's request of prompt tokens (0: not
// known yet) routed by d is served, and returns the bounds it was
// admitted under (steered's: the share off for a client's last attempt
// that only the share refused). It returns false after answering, in the
// API's error shape, with Retry-After and counted in request_errors_total
// by kind:
//
//   - no_engine, 503: no pod can serve (no candidate is eligible) and the
//     local engine is down, so the local attempt would only fail (a refused
//     connection, or the dial timeout for a hung engine) into a 502;
//   - queue_full, 429: every eligible candidate is full (bounds.full);
//   - prefill_busy, 429: so, but some only by the prefill share.
func (h *Handler) admitted(c *gin.Context, d route.Decision, peers []route.PeerView, prompt int) (bounds, bool) {
	if d.Eligible == 0 && !h.localReady.Load() {
		return bounds{}, h.noEngine(c) // refused: no bounds to steer by
	}
	b, ok, waived := h.admittedFrom(c, queueSource{d: &d, peers: peers, prompt: prompt})
	if waived {
		h.metrics.shareWaived.WithLabelValues(apiOf(c).String()).Inc()
	}
	return b, ok
}

// lastAttempt reports whether c is a client's attempt at or past
// Config.ServeRetry by its RetryCountHeader.
func (h *Handler) lastAttempt(c *gin.Context) bool {
	if h.cfg.ServeRetry <= 0 {
		return false
	}
	v := c.GetHeader(RetryCountHeader)
	if v == "" {
		return false
	}
	n, err := strconv.Atoi(v)
	return err == nil && n >= h.cfg.ServeRetry
}

// noEngine answers that no engine can serve the request (admitted's 503).
func (h *Handler) noEngine(c *gin.Context) bool {
	h.metrics.badRequests.WithLabelValues(noEngineKind, apiOf(c).String()).Inc()
	c.Header("Retry-After", strconv.Itoa(retryAfter))
	writeError(c, http.StatusServiceUnavailable, "no engine can serve this request now; retry later")
	return false
}

// queueSource is the pods admission reads the queues of: a decision's
// eligible candidates (d set), or before any choice every peer walk
// visits that route.Excluded does not rule out at at.
type queueSource struct {
	d      *route.Decision
	peers  []route.PeerView // d's
	prompt int
	walk   func(f func(*route.PeerView) bool)
	at     time.Time
}

// each is eachQueue for either kind of source.
func (s *queueSource) each(cfg route.Config, now time.Time, f func(podQueue) bool) {
	if s.d != nil {
		eachQueue(cfg, *s.d, s.peers, s.prompt, now, f)
		return
	}
	s.walk(func(p *route.PeerView) bool {
		return route.Excluded(cfg, *p, s.at) != "" || f(queueAt(cfg, p, now))
	})
}

func (s *queueSource) anyEligible(cfg route.Config) bool {
	found := false
	s.walk(func(p *route.PeerView) bool {
		found = route.Excluded(cfg, *p, s.at) == ""
		return !found
	})
	return found
}

// admittedFrom is admitted's queue bounds on the pods of s. It returns
// the bounds the request was admitted under, and waived when only
// because it is a client's last attempt (the share off).
func (h *Handler) admittedFrom(c *gin.Context, s queueSource) (b bounds, ok, waived bool) {
	b = h.bounds()
	if b.off() {
		return b, true, false
	}
	// The queues up to the first pod with room: admit's rule reads only
	// that far, and a refusal has them all for its message. The usual
	// answer, a first pod with room, fits room and allocates nothing.
	var room [1]podQueue
	qs := room[:0]
	s.each(h.cfg.Route, h.now(), func(q podQueue) bool {
		qs = append(qs, q)
		return b.full(q)
	})
	if admit(qs, b) {
		return b, true, false
	}
	share := slices.ContainsFunc(qs, func(q podQueue) bool { return !b.queueFull(q) })
	if share && h.lastAttempt(c) {
		b.MaxShare = 0
		return b, true, true
	}
	prompt := s.prompt
	kind, msg := queueFullKind, fmt.Sprintf(
		"every pod that could serve this request is full (%d requests waiting or %s of prompt queued); retry later",
		h.cfg.MaxQueue, h.cfg.MaxQueueWait)
	if share {
		kind, msg = prefillBusyKind, fmt.Sprintf(
			"every pod that could serve this request is full or has been prefilling for %.0f%% of the last %s with more than a step's %d tokens queued with it; its prompt of %d tokens would hold back the answers they are decoding; retry later",
			b.MaxShare*100, route.ShareWindow, b.StepTokens, prompt)
	}
	h.metrics.badRequests.WithLabelValues(kind, apiOf(c).String()).Inc()
	c.Header("Retry-After", strconv.Itoa(retryAfter))
	writeError(c, http.StatusTooManyRequests, msg)
	return b, false, false
}

// admittedAny is admission before the request is parsed, tokenized or
// routed: when no pod at all could take a request now (every pod's engine
// down, or every pod that may serve anything full), the request is
// refused as admitted would, without the /tokenize call and the choice an
// overload would otherwise pay for every refused request. Otherwise the
// choice decides, and admitted checks its candidates. It reads the peers
// only up to the first with room (Peers.EachPeer): no view of the others
// and no candidate list is built for it.
func (h *Handler) admittedAny(c *gin.Context) bool {
	if h.peers == nil {
		return true
	}
	now := h.now()
	// Each peer freshened as it is read: the walk stops at the first pod
	// with room, usually the first, where a snapshot built every view.
	walk := func(f func(*route.PeerView) bool) {
		h.peers.EachPeer(now, func(p *route.PeerView) bool {
			h.mu.Lock()
			h.freshenOneLocked(p, now)
			h.mu.Unlock()
			return f(p)
		})
	}
	none := true
	walk(func(*route.PeerView) bool { none = false; return false })
	if none {
		return true // no table yet: the local engine's own answer
	}
	s := queueSource{walk: walk, at: now}
	if !h.localReady.Load() && !s.anyEligible(h.cfg.Route) {
		return h.noEngine(c)
	}
	_, ok, _ := h.admittedFrom(c, s) // a waiver is counted by admitted, after the choice
	return ok
}

// retryableRefusal makes a 503 or 429 that reaches a client retryable and
// its own: the last candidate refused (a peer's sidecar whose engine went
// down since our view, a vLLM restarting or limiting), so the client is
// told when to try again, and the peer's refusal marker, meant for its
// sender, is dropped. A hop's answer goes back to its sender as it is.
func retryableRefusal(resp *http.Response, st *reqState) {
	if (resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests) || st.reason == "hop" {
		return
	}
	resp.Header.Del(RefusedHeader)
	if resp.Header.Get("Retry-After") == "" {
		resp.Header.Set("Retry-After", strconv.Itoa(retryAfter))
	}
}
