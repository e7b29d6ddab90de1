package baseline

import (
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
)

// CHWBLConfig holds KubeAI PrefixHash's knobs (api/k8s/v1/model_types.go).
type CHWBLConfig struct {
	// PrefixChars is how many characters of the first user message are
	// hashed (KubeAI prefixCharLength, default 100).
	PrefixChars int
	// Replication is the number of virtual nodes per pod on the ring
	// (KubeAI replication, default 256; 20 caused skew, kubeai#447).
	Replication int
	// LoadFactor bounds a pod's load relative to the mean, counting the new
	// request (KubeAI meanLoadFactor 125%, default 1.25).
	LoadFactor float64
}

// DefaultCHWBLConfig returns KubeAI's defaults.
func DefaultCHWBLConfig() CHWBLConfig {
	return CHWBLConfig{PrefixChars: 100, Replication: 256, LoadFactor: 1.25}
}

// CHWBL is consistent hashing with bounded loads as KubeAI implements it
// (internal/loadbalancer/balance_chwbl.go): hash the prompt's prefix, walk
// the ring clockwise from it, and take the first pod whose in-flight load
// is within LoadFactor of the mean. It holds no cache state.
type CHWBL struct {
	cfg   CHWBLConfig
	ring  []vnode // sorted by hash
	names []string
	hash  func(string) uint64
}

type vnode struct {
	hash uint64
	pod  int
}

// NewCHWBL builds the ring for pods with the given names, in the order
// Pick's pods will come in. Zero config fields take the defaults.
func NewCHWBL(names []string, cfg CHWBLConfig) *CHWBL {
	return newCHWBL(names, cfg, xxhash.Sum64String)
}

// newCHWBL takes the hash so a test can lay out the ring by hand.
func newCHWBL(names []string, cfg CHWBLConfig, hash func(string) uint64) *CHWBL {
	d := DefaultCHWBLConfig()
	if cfg.PrefixChars <= 0 {
		cfg.PrefixChars = d.PrefixChars
	}
	if cfg.Replication <= 0 {
		cfg.Replication = d.Replication
	}
	if cfg.LoadFactor <= 0 {
		cfg.LoadFactor = d.LoadFactor
	}
	c := &CHWBL{cfg: cfg, names: slices.Clone(names), hash: hash}
	for i, n := range names {
		for r := range cfg.Replication {
			c.ring = append(c.ring, vnode{hash(n + strconv.Itoa(r)), i})
		}
	}
	slices.SortStableFunc(c.ring, func(a, b vnode) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return a.pod - b.pod
	})
	return c
}

// Key is the ring position of a request: the hash of the first PrefixChars
// characters of its first user message, then the model name (KubeAI adds
// the adapter name the same way).
func (c *CHWBL) Key(req Request) uint64 {
	return c.hash(prefixRunes(req.FirstUser, c.cfg.PrefixChars) + req.Model)
}

// prefixRunes returns the first n characters (runes, as KubeAI counts
// them; invalid UTF-8 bytes count one each) of s.
func prefixRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// Pick implements Policy.
func (c *CHWBL) Pick(req Request, pods []Pod, _ time.Time) int {
	loads := make([]int, len(pods))
	for i, p := range pods {
		loads[i] = p.InFlight
	}
	return c.walk(c.Key(req), loads)
}

// walk returns the first pod clockwise from key whose load passes
// loadOK; if none does (only possible with a pod list that does not match
// the ring), the owner of key.
func (c *CHWBL) walk(key uint64, loads []int) int {
	if len(c.ring) == 0 {
		return 0
	}
	total := 0
	for _, l := range loads {
		total += l
	}
	start, _ := slices.BinarySearchFunc(c.ring, key, func(v vnode, k uint64) int {
		switch {
		case v.hash < k:
			return -1
		case v.hash > k:
			return 1
		}
		return 0
	})
	for n := range c.ring {
		v := c.ring[(start+n)%len(c.ring)]
		if v.pod < len(loads) && c.loadOK(loads[v.pod], total, len(loads)) {
			return v.pod
		}
	}
	return c.ring[start%len(c.ring)].pod % len(loads)
}

// loadOK is KubeAI's bound: with nothing in flight every pod passes;
// otherwise load <= (total+1)/n * LoadFactor, the +1 being the new request
// (docs/reference/anchors.md §1.2).
func (c *CHWBL) loadOK(load, total, n int) bool {
	if total == 0 {
		return true
	}
	return float64(load) <= float64(total+1)/float64(n)*c.cfg.LoadFactor
}
