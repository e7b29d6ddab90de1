package gossip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// Config configures a Mesh. Start from DefaultConfig (pods) or LocalConfig
// (tests, the simulator and the chaos harness) and set the identity fields.
type Config struct {
	// NodeName is this node's unique name in the cluster, normally $POD_NAME.
	// A dead name is never reused by memberlist (DeadNodeReclaimTime 0), so a
	// restarted pod needs a new name, which Deployments give it. Required.
	NodeName string

	// BindAddr and BindPort are where gossip listens (UDP and TCP). Default
	// 0.0.0.0:7946. Port 0 picks a free port (tests).
	BindAddr string
	BindPort int

	// AdvertiseAddr and AdvertisePort are what peers dial, normally $POD_IP
	// and BindPort. Empty lets memberlist pick a private IP, which fails on
	// pod networks outside RFC 1918 (docs/reference/libraries.md §1.8), so set it in pods.
	// AdvertisePort 0 means BindPort.
	AdvertiseAddr string
	AdvertisePort int

	// Join lists seeds as host:port, where host may be a DNS name (the
	// headless Service, publishNotReadyAddresses) that resolves to many pods.
	// It is resolved again before every join attempt. Empty means run alone
	// until another node joins us.
	Join []string

	// RejoinInterval is how often seeds not in the member list are joined
	// again, which heals partitions and startup races that memberlist never
	// heals by itself (docs/reference/libraries.md §1.9). Each wait is jittered by ±20%.
	// Default 30 s; 0 disables periodic rejoin (the first join still retries
	// with backoff until it reaches someone).
	RejoinInterval time.Duration

	// Rand jitters the rejoin and backoff waits. It is used by one goroutine
	// only. Nil means a generator seeded from NodeName: deterministic per node
	// and different across nodes, which is all that jitter needs.
	Rand *rand.Rand

	// Resolver resolves seed host names. Nil means net.DefaultResolver.
	Resolver Resolver

	// SecretKey, 16, 24 or 32 bytes, turns on AES-GCM for every packet and
	// stream (D9). Nil means unencrypted; a node with another key cannot
	// join.
	SecretKey []byte

	// Label is prefixed to every packet and stream (and authenticated when
	// encryption is on), so two products sharing pod IPs never merge. Use
	// "kvroute/<namespace>/<deployment>". At most 255 bytes.
	Label string

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

	// InboxDepth bounds the messages handed from memberlist's receive loop to
	// the mesh loop. When full, messages are dropped and counted (a lost
	// delta is repaired by a full digest). Default 1024.
	InboxDepth int

	// OutboxDepth bounds the messages queued per peer. A peer that cannot
	// keep up (or is dead but not yet detected) loses deltas, counted, and is
	// repaired by a full digest. Default 256.
	OutboxDepth int

	// PacketBytes is the largest message sent by UDP; larger deltas go by
	// TCP. Default 1200: memberlist's 1400-byte packet less the label,
	// encryption and compound overhead (docs/reference/libraries.md §1.3).
	PacketBytes int

	// Log receives the mesh's and memberlist's logs; memberlist's "[LEVEL]"
	// prefixes become zerolog levels. The zero Logger discards.
	Log zerolog.Logger

	// Memberlist, when set, edits the memberlist configuration after the
	// mesh has filled it in and before memberlist starts: a Transport for
	// tests, a CIDRsAllowed, or timings.
	Memberlist func(*memberlist.Config)

	local bool // LocalConfig: memberlist.DefaultLocalConfig timings
}

// Resolver looks up seed host names. *net.Resolver satisfies it.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// DefaultConfig returns the settings for a pod network, on memberlist's
// DefaultLANConfig. Set NodeName, AdvertiseAddr, APIAddr, Join, SecretKey
// and Label.
func DefaultConfig() Config {
	return Config{
		BindAddr:           "0.0.0.0",
		BindPort:           7946,
		RejoinInterval:     30 * time.Second,
		KeyScheme:          blockkey.Version,
		FullDigestInterval: time.Minute,
		LoadPushInterval:   25 * time.Millisecond,
		LoadPushDelay:      2 * time.Millisecond,
		MetaInterval:       time.Second,
		RepairAfter:        2 * time.Second,
		ReorderWait:        100 * time.Millisecond,
		NeedFullInterval:   time.Second,
		InboxDepth:         1024,
		OutboxDepth:        256,
		PacketBytes:        1200,
		Log:                zerolog.Nop(),
	}
}

// LocalConfig returns settings for a single machine (tests, the simulator,
// chaos): memberlist's DefaultLocalConfig timings, loopback, a free port and
// short intervals.
func LocalConfig() Config {
	c := DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.AdvertiseAddr = "127.0.0.1"
	c.RejoinInterval = 2 * time.Second
	c.FullDigestInterval = 2 * time.Second
	c.MetaInterval = 200 * time.Millisecond
	c.RepairAfter = 500 * time.Millisecond
	c.ReorderWait = 50 * time.Millisecond
	c.NeedFullInterval = 200 * time.Millisecond
	c.local = true
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
	if c.InboxDepth <= 0 {
		c.InboxDepth = d.InboxDepth
	}
	if c.OutboxDepth <= 0 {
		c.OutboxDepth = d.OutboxDepth
	}
	if c.PacketBytes <= 0 {
		c.PacketBytes = d.PacketBytes
	}
	if c.KeyScheme == 0 {
		c.KeyScheme = d.KeyScheme
	}
	return c
}

// ErrConfig is wrapped by Join when the configuration cannot work.
var ErrConfig = errors.New("invalid gossip config")

func (c Config) validate() error {
	switch {
	case c.NodeName == "":
		return fmt.Errorf("node name is empty: %w", ErrConfig)
	case len(c.NodeName) > 255:
		return fmt.Errorf("node name of %d bytes: %w", len(c.NodeName), ErrConfig)
	case c.APIAddr == "":
		return fmt.Errorf("api address is empty: %w", ErrConfig)
	case len(c.APIAddr) > maxAPIAddrBytes:
		return fmt.Errorf("api address of %d bytes: %w", len(c.APIAddr), ErrConfig)
	case len(c.EngineAddr) > maxAPIAddrBytes:
		return fmt.Errorf("engine address of %d bytes: %w", len(c.EngineAddr), ErrConfig)
	case c.SecretKey != nil && len(c.SecretKey) != 16 && len(c.SecretKey) != 24 && len(c.SecretKey) != 32:
		return fmt.Errorf("secret key of %d bytes, want 16, 24 or 32: %w", len(c.SecretKey), ErrConfig)
	case len(c.Label) > memberlist.LabelMaxSize:
		return fmt.Errorf("label of %d bytes: %w", len(c.Label), ErrConfig)
	case c.KeyScheme < 0 || c.KeyScheme > 255:
		return fmt.Errorf("key scheme %d: %w", c.KeyScheme, ErrConfig)
	}
	return nil
}

// memberlistConfig maps c onto memberlist's preset.
func (c Config) memberlistConfig(d delegate) *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	if c.local {
		mc = memberlist.DefaultLocalConfig()
	}
	mc.Name = c.NodeName
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort
	}
	mc.Label = c.Label
	mc.SecretKey = c.SecretKey
	// Our payloads don't compress: memberlist's LZW made a full digest
	// (bloom bits) 32% larger, so it went out raw anyway, and saved one byte
	// of a 107-byte delta and of a 62-byte load push. Trying cost 7% of a
	// sidecar's CPU under load, on the one thread (--procs 1) that also
	// serves requests.
	mc.EnableCompression = false
	mc.Delegate = d
	mc.Events = d
	mc.Logger = newStdLogger(c.Log)
	if c.Memberlist != nil {
		c.Memberlist(mc)
	}
	return mc
}
