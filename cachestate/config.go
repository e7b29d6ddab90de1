// Package cachestate is the local cache's state as the mesh sees it
// (docs/design.md §2 and D10): it applies the local vLLM's KV events to the exact
// index, publishes the digest peers test (deltas of added keys, a full
// digest after an epoch change or removals), and owns the engine's state as
// advertised: a digest only while the engine serves, withdrawn at once when
// it cannot, and a new, empty epoch published before an engine that comes
// back is advertised again. It also tells a partial index (the sidecar
// joined the event stream late without replay) and a silent event path (a
// misconfiguration) from a healthy one.
//
// The sidecar wires it:
//
//	st := cachestate.New(cfg, ix, mesh, front, cachestate.NewMetrics(reg), log)
//	go st.Run(ctx, sub.Items(), watcher.Transitions(), scrapes)
package cachestate

import (
	"time"

	"github.com/kvroute/kvroute/bloom"
)

// Config of a State. DefaultConfig documents the defaults.
type Config struct {
	// Node is this node's name in the mesh, the digests' origin. Required.
	Node string
	// Params size the digest (bloom.ParamsFor the KV capacity). A digest
	// of more entries than Params holds at its design rate (lower-tier
	// copies: vLLM does not say how large its CPU tier is) is built at
	// bloom.ParamsFor(entries + a quarter, FPRate) instead, at a rebuild.
	Params bloom.Params
	// FPRate is the false-positive rate Params was sized for. Default
	// bloom.DefaultFPRate.
	FPRate float64
	// PublishInterval is how often digest changes go to the mesh.
	// Default 100 ms.
	PublishInterval time.Duration
	// RebuildRemoved is how many removals the mesh carries beside the
	// digest's bits before a full digest is rebuilt from the index: peers
	// keep each one (8 bytes) until then, and the bits keep the load of
	// every key added since the last build, so it bounds both the memory a
	// peer holds for this pod and how far the false-positive rate drifts
	// above Params' target. Default (0) an eighth of the keys the digest
	// is sized for (bloom.Params.Keys): about a 1.3% rate for a 1% target,
	// and a full digest every ~17 s for a 20k-block cache evicting 166
	// blocks/s. Added entries past that eighth over the design load rebuild
	// it too (a lower tier filling).
	RebuildRemoved int
	// RebuildEvery bounds how long removed keys stay in the views of
	// members of wire 1, which read no removals: while one is in the mesh
	// removals rebuild the digest at most this often. Default 2 s.
	RebuildEvery time.Duration
	// Replay says a replay endpoint is configured, so the subscriber
	// recovers what a late start missed; without it the index is partial.
	Replay bool
	// SilenceWindow and SilenceTokens: an engine that has prefilled
	// SilenceTokens (a block's worth) and published no KV event for
	// SilenceWindow has a misconfigured event path. Defaults 10 s and 16.
	SilenceWindow time.Duration
	SilenceTokens int
	// OnServing, if set, is called each time the engine is advertised as
	// serving (a restarted vLLM may serve other models: re-read them).
	OnServing func()
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{PublishInterval: 100 * time.Millisecond, RebuildEvery: 2 * time.Second,
		SilenceWindow: 10 * time.Second, SilenceTokens: 16, Now: time.Now}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.PublishInterval <= 0 {
		c.PublishInterval = d.PublishInterval
	}
	if !(c.FPRate > 0 && c.FPRate < 1) {
		c.FPRate = bloom.DefaultFPRate
	}
	if c.RebuildEvery <= 0 {
		c.RebuildEvery = d.RebuildEvery
	}
	if c.SilenceWindow <= 0 {
		c.SilenceWindow = d.SilenceWindow
	}
	if c.SilenceTokens <= 0 {
		c.SilenceTokens = d.SilenceTokens
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	return c
}
