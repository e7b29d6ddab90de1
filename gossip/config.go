package gossip

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/membership"
	"github.com/kvroute/kvroute/route"
)

// Config configures a Mesh. Start from DefaultConfig (pods) or LocalConfig
// (tests, the simulator and the chaos harness) and set the identity fields.
type Config struct {
	// Config is the membership: the node's name, addresses, seeds,
	// encryption and label, and memberlist's settings
	// (membership.Config documents each).
	membership.Config

	// APIAddr is the host:port peers forward requests to (our OpenAI port).
	// It travels in the node meta. Required.
	APIAddr string

	// EngineAddr is the host:port where peers can reach this pod's vLLM
	// itself, advertised in the node meta (Meta.EngineAddr). Optional:
	// peers use it only to ask that vLLM about a stored response while
	// this sidecar is away. At most 255 bytes.
	EngineAddr string

	// Models are the model and LoRA names this pod serves, advertised in the
	// node meta. Names that do not fit the 512-byte meta are left out and
	// the meta says so (Meta.ModelsTruncated).
	Models []string

	// KeyScheme is the blockkey scheme version our digests use. Default
	// blockkey.Version.
	KeyScheme int

	// RoutingStride is how many vLLM blocks each key of our digests stands
	// for (blockkey.Scheme.Stride, the sidecar's --routing-stride). It is
	// advertised in the node meta, so that peers of another stride probe
	// our digest at the positions it keeps (route.Strided), and peers'
	// digests are probed here as theirs say. Default 4
	// (blockkey.DefaultScheme).
	RoutingStride int

	// Engine is the local vLLM's state at Join; SetEngine changes it. The
	// default, route.EngineServing, suits a mesh that does not watch an
	// engine; a sidecar starts at route.EngineStarting.
	Engine route.Engine

	// FullDigestInterval is how often the full local digest goes to every
	// member by TCP. Deltas carry removals as well as additions, and the
	// owner rebuilds its digest when its removals pile up (cachestate), so
	// this is only the backstop for a copy that went wrong unnoticed (a lost
	// last delta is also caught by the digest version the load reports
	// carry, RepairAfter).
	// Cost per node: members × digest size / interval (117 KB for 100k keys
	// at 1%: 50 peers at 60 s is ~98 KB/s). Default 60 s.
	FullDigestInterval time.Duration

	// MetaInterval is the least time between two node-meta updates
	// (UpdateNode re-broadcasts an alive message to the whole cluster), so
	// load figures reach peers at most this often. Draining goes out at once.
	// Default 1 s.
	MetaInterval time.Duration

	// LoadPushInterval is the least time between two load reports this
	// node pushes straight to every member (UDP, ~40 bytes). A report goes
	// out whenever the load changes, so peers see a request land within
	// about this long instead of a meta round (MetaInterval plus gossip):
	// stale loads make independent sidecars herd onto the pod that looked
	// idlest. Cost at saturation: members × 1/interval packets a second
	// (63 peers at 25 ms: 2,520/s, ~150 KB/s). Default 25 ms.
	LoadPushInterval time.Duration

	// ClaimPushInterval is the least time between a push and the next
	// when that one carries a new claim (Mesh.Claim): a claim tells the
	// other fronts where the request that made it went, so that its
	// siblings arriving there meanwhile (an agent's parallel calls,
	// within tens of milliseconds) follow it. At most LoadPushInterval;
	// 0: LoadPushInterval (a claim waits as a load does); negative: none.
	// Default none: agent fan-out at the 8-pod knee kept 0.5-1.5 points
	// more of its hit rate with claims at once than after 25 ms, for the
	// same bytes (docs/bench/2026-12-07/fanout-claims.md). A front that
	// routes more than 1/LoadPushInterval requests a second then sends
	// more reports than that, at most one per LoadPushDelay.
	ClaimPushInterval time.Duration

	// LoadPushDelay is how long a changed load or a new claim waits before
	// it is pushed. The change is a request landing at, leaving or being
	// sent to a node; meanwhile that request is being written out, and a
	// push at once put this node's send, and each peer's reading of it, on
	// the request's path. Changes within the delay go out in one report.
	// The engine's state goes at once. Default 2 ms, small against
	// LoadPushInterval; negative: none.
	LoadPushDelay time.Duration

	// RepairAfter is how long a peer's copy may lag behind the digest version
	// in the peer's load reports (or its meta) before we ask the origin for
	// a full digest. A report may overtake the deltas before it, so a lag
	// that lasts means the last deltas were lost. Default 2 s.
	RepairAfter time.Duration

	// ReorderWait is how long a delta that arrived ahead of its predecessor
	// is held for the missing one before we ask for a full digest. memberlist
	// hands queued UDP messages over newest first, so bursts arrive
	// reversed; a wait of a few gossip ticks absorbs that without a TCP
	// round of the whole filter. Default 100 ms.
	ReorderWait time.Duration

	// NeedFullInterval is the least time between two full-digest requests to
	// one origin. Default 1 s.
	NeedFullInterval time.Duration

	// LoadRefresh re-pushes an unchanged load, so peers can tell a steady
	// load from a silent node: route.Config.SilentFor (1.5 s) excludes a
	// peer after three missed refreshes, so a dead or cut-off pod is out
	// within 2 s and a single lost packet excludes nobody. Cost per node at
	// N peers: 2N packets a second sent and 2N received (~60 bytes each;
	// 63 peers: 126/s, ~8 KB/s each way), and only while the load stands
	// still, since every pushed change restarts the wait. Default 500 ms;
	// keep it under a third of the peers' SilentFor.
	LoadRefresh time.Duration

	// InboxDepth bounds the messages handed from memberlist's receive loop to
	// the mesh loop. When full, messages are dropped and counted (a lost
	// delta is repaired by a full digest). Default 1024.
	InboxDepth int

	// OutboxDepth bounds the messages queued per peer. A peer that cannot
	// keep up (or is dead but not yet detected) loses deltas, counted, and is
	// repaired by a full digest. Default 256.
	OutboxDepth int

	// MaxStreams bounds the messages this node sends by TCP at once (full
	// digests, deltas too large for a packet, loads that change the
	// engine's state); the others wait their turn. memberlist opens a
	// connection per such message, and a node that learned of many peers
	// at once (its join, a healed partition) opened one to each: a
	// descriptor at both ends for each of hundreds of peers, and in the
	// scale harness, where 128 nodes share one process, more than its
	// 20,000. Default 16.
	MaxStreams int

	// PacketBytes is the largest message sent by UDP; larger deltas go by
	// TCP. Default 1200: memberlist's 1400-byte packet less the label,
	// encryption and compound overhead (docs/reference/libraries.md §1.3).
	PacketBytes int
}

// DefaultConfig returns the settings for a pod network, on memberlist's
// DefaultLANConfig. Set NodeName, AdvertiseAddr, APIAddr, Join, SecretKey
// and Label.
func DefaultConfig() Config {
	return Config{
		Config:             membership.DefaultConfig(),
		KeyScheme:          blockkey.Version,
		RoutingStride:      blockkey.DefaultScheme().Stride,
		FullDigestInterval: time.Minute,
		LoadPushInterval:   25 * time.Millisecond,
		ClaimPushInterval:  -1,
		LoadPushDelay:      2 * time.Millisecond,
		MetaInterval:       time.Second,
		RepairAfter:        2 * time.Second,
		ReorderWait:        100 * time.Millisecond,
		NeedFullInterval:   time.Second,
		LoadRefresh:        500 * time.Millisecond,
		InboxDepth:         1024,
		OutboxDepth:        256,
		MaxStreams:         16,
		PacketBytes:        1200,
	}
}

// LocalConfig returns settings for a single machine (tests, the simulator,
// chaos): memberlist's DefaultLocalConfig timings, loopback, a free port and
// short intervals.
func LocalConfig() Config {
	c := DefaultConfig()
	c.Config = membership.LocalConfig()
	c.FullDigestInterval = 2 * time.Second
	c.MetaInterval = 200 * time.Millisecond
	c.RepairAfter = 500 * time.Millisecond
	c.ReorderWait = 50 * time.Millisecond
	c.NeedFullInterval = 200 * time.Millisecond
	return c
}

// withDefaults fills zero fields so a partly built Config still works.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.FullDigestInterval <= 0 {
		c.FullDigestInterval = d.FullDigestInterval
	}
	if c.LoadPushInterval <= 0 {
		c.LoadPushInterval = d.LoadPushInterval
	}
	switch {
	case c.ClaimPushInterval == 0 || c.ClaimPushInterval > c.LoadPushInterval:
		c.ClaimPushInterval = c.LoadPushInterval
	case c.ClaimPushInterval < 0:
		c.ClaimPushInterval = 0
	}
	switch {
	case c.LoadPushDelay == 0:
		c.LoadPushDelay = d.LoadPushDelay
	case c.LoadPushDelay < 0:
		c.LoadPushDelay = 0
	}
	if c.MetaInterval <= 0 {
		c.MetaInterval = d.MetaInterval
	}
	if c.RepairAfter <= 0 {
		c.RepairAfter = d.RepairAfter
	}
	if c.ReorderWait <= 0 {
		c.ReorderWait = d.ReorderWait
	}
	if c.NeedFullInterval <= 0 {
		c.NeedFullInterval = d.NeedFullInterval
	}
	if c.LoadRefresh <= 0 {
		c.LoadRefresh = d.LoadRefresh
	}
	if c.InboxDepth <= 0 {
		c.InboxDepth = d.InboxDepth
	}
	if c.OutboxDepth <= 0 {
		c.OutboxDepth = d.OutboxDepth
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = d.MaxStreams
	}
	if c.PacketBytes <= 0 {
		c.PacketBytes = d.PacketBytes
	}
	if c.KeyScheme == 0 {
		c.KeyScheme = d.KeyScheme
	}
	if c.RoutingStride <= 0 {
		c.RoutingStride = d.RoutingStride
	}
	return c
}

// ErrConfig is wrapped by Join when the configuration cannot work.
var ErrConfig = membership.ErrConfig

// validate checks the mesh's own fields; membership.New checks its.
func (c Config) validate() error {
	switch {
	case c.APIAddr == "":
		return fmt.Errorf("api address is empty: %w", ErrConfig)
	case len(c.APIAddr) > maxAPIAddrBytes:
		return fmt.Errorf("api address of %d bytes: %w", len(c.APIAddr), ErrConfig)
	case len(c.EngineAddr) > maxAPIAddrBytes:
		return fmt.Errorf("engine address of %d bytes: %w", len(c.EngineAddr), ErrConfig)
	case c.KeyScheme < 0 || c.KeyScheme > 255:
		return fmt.Errorf("key scheme %d: %w", c.KeyScheme, ErrConfig)
	case c.RoutingStride > maxStride:
		return fmt.Errorf("routing stride %d, at most %d: %w", c.RoutingStride, maxStride, ErrConfig)
	}
	return nil
}
