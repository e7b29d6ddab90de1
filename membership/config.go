package membership

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Config configures a node's membership. Start from DefaultConfig (pods)
// or LocalConfig (tests, the simulator and the chaos harness) and set the
// identity fields.
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

	// Settle is when, after its first successful join, this node joins the
	// seeds again although they are live: at Settle and at 4×Settle (each
	// jittered by ±20%). A join is a full exchange of member lists. Nodes
	// that join a seed at the same moment as this one reach it only by
	// memberlist's gossip, whose few retransmits (RetransmitMult) can miss
	// a node that joined meanwhile; that node then learned of them only at
	// the next periodic push/pull, up to 30 s later, and chose among fewer
	// peers until then. Default 2 s; 0 disables.
	Settle time.Duration

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

	// Log receives memberlist's logs, whose "[LEVEL]" prefixes become
	// zerolog levels, and the joiner's. The zero Logger discards.
	Log zerolog.Logger

	// Memberlist, when set, edits the memberlist configuration after it
	// has been filled in and before memberlist starts: a Transport for
	// tests, a CIDRsAllowed, or timings.
	Memberlist func(*memberlist.Config)

	local bool // LocalConfig: memberlist.DefaultLocalConfig timings
}

// Resolver looks up seed host names. *net.Resolver satisfies it.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// DefaultConfig returns the settings for a pod network, on memberlist's
// DefaultLANConfig. Set NodeName, AdvertiseAddr, Join, SecretKey and Label.
func DefaultConfig() Config {
	return Config{
		BindAddr:       "0.0.0.0",
		BindPort:       7946,
		RejoinInterval: 30 * time.Second,
		Settle:         2 * time.Second,
		Log:            zerolog.Nop(),
	}
}

// LocalConfig returns settings for a single machine: memberlist's
// DefaultLocalConfig timings, loopback, a free port and a short rejoin.
func LocalConfig() Config {
	c := DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.AdvertiseAddr = "127.0.0.1"
	c.RejoinInterval = 2 * time.Second
	c.local = true
	return c
}

// ErrConfig is wrapped by New when the configuration cannot work.
var ErrConfig = errors.New("invalid gossip config")

func (c Config) validate() error {
	switch {
	case c.NodeName == "":
		return fmt.Errorf("node name is empty: %w", ErrConfig)
	case len(c.NodeName) > 255:
		return fmt.Errorf("node name of %d bytes: %w", len(c.NodeName), ErrConfig)
	case c.Settle < 0:
		return fmt.Errorf("settle %v is negative: %w", c.Settle, ErrConfig)
	case c.SecretKey != nil && len(c.SecretKey) != 16 && len(c.SecretKey) != 24 && len(c.SecretKey) != 32:
		return fmt.Errorf("secret key of %d bytes, want 16, 24 or 32: %w", len(c.SecretKey), ErrConfig)
	case len(c.Label) > memberlist.LabelMaxSize:
		return fmt.Errorf("label of %d bytes: %w", len(c.Label), ErrConfig)
	}
	return nil
}

// memberlistConfig maps c onto memberlist's preset.
func (c Config) memberlistConfig(a adapter) *memberlist.Config {
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
	// kvroute's payloads don't compress: memberlist's LZW made a full
	// digest (bloom bits) 32% larger, so it went out raw anyway, and saved
	// one byte of a 107-byte delta and of a 62-byte load push. Trying cost
	// 7% of a sidecar's CPU under load, on the one thread (--procs 1) that
	// also serves requests.
	mc.EnableCompression = false
	mc.Delegate = a
	mc.Events = a
	mc.Logger = newStdLogger(c.Log)
	if c.Memberlist != nil {
		c.Memberlist(mc)
	}
	return mc
}
