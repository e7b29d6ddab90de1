package scale

import (
	"container/list"
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/cachestate"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/route"
	"github.com/kvroute/kvroute/vllmclient"
)

// model is the one model every node serves.
const model = "scale-model"

// BlockTokens is tokens per vLLM block, the simulated engines' own.
const BlockTokens = 16

// scheme is the sidecar's routing at c's stride. A trace id stands for one
// routing key's worth of vLLM blocks (RoutingStride of them), which the
// simulated engine stores, touches and evicts together: the digests then
// carry the keys a sidecar at that stride would, for the same vLLM churn.
func (c Config) scheme() blockkey.Scheme {
	return blockkey.Scheme{BlockSize: BlockTokens, Stride: c.RoutingStride}
}

// keys are the routing keys of ids' prefixes, one per id.
func (c Config) keys(ids []uint64) []blockkey.Key {
	return c.scheme().Request(blockkey.ModelRoot(model, ""), promptTokens(ids, c.RoutingStride))
}

// request is what a front chooses for: the prompt of ids, keyed by ks
// (c.keys(ids)).
func (c Config) request(ids []uint64, ks []blockkey.Key) route.Request {
	// The model unnamed: the base model, which a front names so
	// (forward.Handler.choose), since every pod serves it.
	return route.Request{Keys: ks, TokensPerKey: BlockTokens * c.RoutingStride,
		PromptTokens: len(ids)*c.RoutingStride*BlockTokens + 1}
}

// idsOf is how many trace ids hold blocks vLLM blocks: a cache's size in
// the simulated engine's units, at least one.
func (c Config) idsOf(blocks int) int { return max(blocks/c.RoutingStride, 1) }

// node is one sidecar's cache-state path: the real mesh, index and
// cachestate loop, fed by a simulated engine (lru) that stores and evicts
// blocks as vLLM would and reports them as vLLM's events.
type node struct {
	name   string
	mesh   *gossip.Mesh
	ix     *kvindex.Index
	items  chan vllmclient.Item
	chain  route.Chain
	rc     route.Config // chain's
	recent *route.Recent
	full   bool             // Config.NoShortlist
	views  []route.PeerView // choose's, over and over
	stop   context.CancelFunc
	done   chan struct{}
	seq    uint64
	lru    *list.List // of blocks, front newest
	at     map[uint64]*list.Element
	cap    int    // in trace ids
	stride int    // vLLM blocks per trace id
	stored uint64 // vLLM blocks stored since start
	// cpu is the offload tier (Config.CPUBlocks): trace ids, front
	// newest; nil without one.
	cpu    *list.List
	cpuAt  map[uint64]*list.Element
	cpuCap int
}

type noFront struct{}

func (noFront) SetLocalReady(bool) {}

func startNode(ctx context.Context, cfg Config, i int, seeds []string) (*node, error) {
	return startWarm(ctx, cfg, i, seeds, nil)
}

// startWarm is startNode whose engine first runs warm: its blocks are in
// the index before the engine serves, so its first digest, full, carries
// them (as a sidecar started beside a running engine replays its cache),
// not a delta as large as the cache to every member.
func startWarm(ctx context.Context, cfg Config, i int, seeds []string, warm func(*node) blockkey.Key) (*node, error) {
	name := fmt.Sprintf("n%03d", i)
	g := gossip.DefaultConfig()
	g.NodeName = name
	g.BindAddr, g.AdvertiseAddr = cfg.Addr, cfg.Addr
	g.BindPort = cfg.BasePort + i
	g.APIAddr = net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.BasePort+10000+i))
	g.Models = []string{model}
	g.RoutingStride = cfg.RoutingStride
	g.Engine = route.EngineStarting
	g.Join = seeds
	if cfg.FullDigestInterval > 0 {
		g.FullDigestInterval = cfg.FullDigestInterval
	}
	m, err := gossip.Join(ctx, cfg.slowGossip(g))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	// A sidecar's front pushes its load to every member (and refreshes it
	// while nothing changes): the traffic of the liveness signal, which
	// detect times.
	m.SetLoad(route.Load{Fronted: true})
	ix := kvindex.New(kvindex.Config{Model: model, Scheme: cfg.scheme(), CapacityBlocks: cfg.CapacityBlocks, Epoch: uint64(i + 1),
		TierStride: cfg.TierStride})
	c := cachestate.DefaultConfig()
	c.Node = name
	if cfg.DigestInterval > 0 {
		c.PublishInterval = cfg.DigestInterval
	}
	c.Params = bloom.ParamsFor(cfg.CapacityBlocks/cfg.RoutingStride+1, cfg.FPRate) // as the sidecar sizes it
	c.RebuildRemoved = cfg.RebuildRemoved
	cs := cachestate.New(cfg.slowCachestate(c), ix, m, noFront{}, nil, cfg.Log)
	rec := route.NewRecent(cfg.recentConfig())
	n := &node{name: name, mesh: m, ix: ix, items: make(chan vllmclient.Item, 256),
		chain: route.DefaultChain(cfg.routeConfig(), rec), rc: cfg.routeConfig(), recent: rec, full: cfg.NoShortlist,
		done: make(chan struct{}), lru: list.New(), at: map[uint64]*list.Element{},
		cap: cfg.idsOf(cfg.CapacityBlocks), stride: cfg.RoutingStride}
	if cfg.CPUBlocks > 0 {
		n.cpu, n.cpuAt, n.cpuCap = list.New(), map[uint64]*list.Element{}, cfg.idsOf(cfg.CPUBlocks)
	}
	eng := make(chan engine.Transition, 1)
	rctx, stop := context.WithCancel(context.Background())
	n.stop = stop
	go func() { // exits when stop is called
		defer close(n.done)
		cs.Run(rctx, n.items, eng, nil)
	}()
	if warm != nil {
		last := warm(n)
		if err := waitFor(ctx, cfg.stretch(30*time.Second), func() bool { return ix.Contains(last) }); err != nil {
			n.close()
			return nil, fmt.Errorf("node %s: warm cache never indexed: %w", name, err)
		}
	}
	eng <- engine.Transition{From: route.EngineStarting, To: route.EngineServing, Reason: "scale harness", At: time.Now()}
	return n, nil
}

// addr is where the node's memberlist listens.
func (n *node) addr(cfg Config, i int) string {
	return net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.BasePort+i))
}

// held is how many leading blocks of ids the simulated engine holds.
func (n *node) held(ids []uint64) int {
	for i, id := range ids {
		if _, ok := n.at[id]; !ok {
			return i
		}
	}
	return len(ids)
}

// block is a cached block: its trace id and its routing key.
type block struct {
	id  uint64
	key blockkey.Key
}

// cache has the simulated engine compute ids (ks their keys, or nil): it
// stores the blocks it lacks and touches all of them as vLLM frees a
// request's blocks (tail first, so the tail is evicted first), then
// evicts the oldest past capacity. It returns how many leading blocks it
// held, and the blocks stored and evicted.
func (n *node) cache(ids []uint64, ks []blockkey.Key) (h int, added []uint64, removed []block) {
	h = n.held(ids)
	added = ids[h:]
	for i := len(ids) - 1; i >= 0; i-- {
		if e, ok := n.at[ids[i]]; ok {
			n.lru.MoveToFront(e)
		}
	}
	for i := len(ids) - 1; i >= h; i-- {
		b := block{id: ids[i]}
		if i < len(ks) {
			b.key = ks[i]
		}
		n.at[ids[i]] = n.lru.PushFront(b)
	}
	for n.lru.Len() > n.cap {
		b := n.lru.Remove(n.lru.Back()).(block)
		delete(n.at, b.id)
		removed = append(removed, b)
	}
	return h, added, removed
}

// serve is cache, then the events the engine would publish, sent to the
// cachestate loop.
func (n *node) serve(ids []uint64, ks []blockkey.Key) (h int, added []uint64, removed []block) {
	h, added, removed = n.cache(ids, ks)
	var evs []kvevent.Event
	if len(added) > 0 {
		ev := kvevent.Event{Kind: kvevent.BlockStored, Tag: kvevent.BlockStored.String(), BlockSize: BlockTokens}
		if h > 0 {
			hs := blockHashes(ids[h-1], n.stride)
			p := hs[len(hs)-1]
			ev.Parent = &p
		}
		for _, id := range added {
			ev.BlockHashes = append(ev.BlockHashes, blockHashes(id, n.stride)...)
			ev.TokenIDs = append(ev.TokenIDs, tokens(id, n.stride)...)
		}
		evs = append(evs, ev)
		n.stored += uint64(len(added) * n.stride)
	}
	// The tier's copies are announced before the GPU removal, as vLLM's
	// offload finishes storing before the GPU block is reused.
	evs = append(evs, n.offload(removed)...)
	if len(removed) > 0 {
		ev := kvevent.Event{Kind: kvevent.BlockRemoved, Tag: kvevent.BlockRemoved.String()}
		for _, b := range removed {
			ev.BlockHashes = append(ev.BlockHashes, blockHashes(b.id, n.stride)...)
		}
		evs = append(evs, ev)
	}
	if len(evs) > 0 {
		n.items <- vllmclient.Item{Kind: vllmclient.KindBatch, Stream: vllmclient.Stream{Topic: "kv"},
			Batch: kvevent.Batch{Topic: "kv", Seq: n.seq, TS: float64(time.Now().UnixNano()) / 1e9, Events: evs}}
		n.seq++
	}
	return h, added, removed
}

// cpuMedium is the medium of vLLM's native CPU offload events.
var cpuMedium = "CPU"

// offload stores the blocks the GPU evicted in the CPU tier and returns
// the events vLLM's native offloading sends: a hash-only BlockStored
// (medium CPU, no tokens, no parent) per new copy, a BlockRemoved (CPU)
// per copy the tier pushes out. None without a tier.
func (n *node) offload(evicted []block) []kvevent.Event {
	if n.cpu == nil || len(evicted) == 0 {
		return nil
	}
	stored := kvevent.Event{Kind: kvevent.BlockStored, Tag: kvevent.BlockStored.String(), TokenIDs: []uint32{}, Medium: &cpuMedium}
	gone := kvevent.Event{Kind: kvevent.BlockRemoved, Tag: kvevent.BlockRemoved.String(), Medium: &cpuMedium}
	for _, b := range evicted {
		if e, ok := n.cpuAt[b.id]; ok {
			n.cpu.MoveToFront(e)
			continue
		}
		for n.cpu.Len() >= n.cpuCap {
			old := n.cpu.Remove(n.cpu.Back()).(uint64)
			delete(n.cpuAt, old)
			gone.BlockHashes = append(gone.BlockHashes, blockHashes(old, n.stride)...)
		}
		n.cpuAt[b.id] = n.cpu.PushFront(b.id)
		stored.BlockHashes = append(stored.BlockHashes, blockHashes(b.id, n.stride)...)
	}
	var evs []kvevent.Event
	if len(gone.BlockHashes) > 0 {
		evs = append(evs, gone)
	}
	if len(stored.BlockHashes) > 0 {
		evs = append(evs, stored)
	}
	return evs
}

func (n *node) close() {
	n.stop()
	<-n.done
	n.mesh.Shutdown()
}

// blockHashes are the engine's hashes of a trace id's stride blocks
// (never 0, which the wire reads as no parent).
func blockHashes(id uint64, stride int) []uint64 {
	hs := make([]uint64, stride)
	for j := range hs {
		hs[j] = id*uint64(stride) + uint64(j) + 1
	}
	return hs
}

// tokens are a trace id's stride blocks' token ids: distinct per id, as
// the blocks of a prefix-unique id are.
func tokens(id uint64, stride int) []uint32 {
	t := make([]uint32, stride*BlockTokens)
	x := id*0x9e3779b97f4a7c15 + 1
	for i := range t {
		x ^= x >> 29
		x *= 0xbf58476d1ce4e5b9
		t[i] = uint32(x>>40) % 150000
	}
	return t
}

// promptTokens is a request's prompt: its blocks plus one token, since
// vLLM recomputes the last prompt token and so reuses only full blocks
// before it.
func promptTokens(ids []uint64, stride int) []uint32 {
	out := make([]uint32, 0, len(ids)*stride*BlockTokens+1)
	for _, id := range ids {
		out = append(out, tokens(id, stride)...)
	}
	return append(out, 1)
}

// choose routes req from n as a sidecar's front does: among many peers on
// a shortlist of its table (gossip.Mesh.Shortlist), else on every view.
// It returns the Decision and how many views it read.
func (n *node) choose(req route.Request, now time.Time) (route.Decision, int) {
	if !n.full {
		sl := route.GetShortlist()
		defer route.PutShortlist(sl)
		var ok bool
		if n.views, ok = n.mesh.Shortlist(sl, &n.rc, &req, nil, n.recent, now, func(*route.PeerView) {}, n.views); ok {
			return n.chain.Choose(req, n.views, now), len(n.views)
		}
	}
	n.views = n.mesh.AppendSnapshot(n.views, now)
	return n.chain.Choose(req, n.views, now), len(n.views)
}
