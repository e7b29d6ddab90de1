package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// benchMatcher costs about what a Bloom test does per key: a map probe
// plus the hashing of k positions.
type benchMatcher map[blockkey.Key]struct{}

var sink uint64

func (m benchMatcher) PrefixLen(keys []blockkey.Key) int {
	for i, k := range keys {
		h := uint64(k)
		for range 4 { // k=7 Bloom positions come from two hashes; this is about that work
			h = mix(h)
		}
		sink += h
		if _, ok := m[k]; !ok {
			return i
		}
	}
	return len(keys)
}

func BenchmarkMatcherPerKey(b *testing.B) {
	keys := keysN(1, 2048)
	m := benchMatcher{}
	for _, k := range keys {
		m[k] = struct{}{}
	}
	b.ResetTimer()
	for b.Loop() {
		m.PrefixLen(keys)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2048, "ns/key")
}

// BenchmarkChoose routes one request through DefaultChain. Realistic
// matches: every peer holds the 4-key system prompt and misses after it;
// one peer holds three quarters of the prompt (a conversation's history).
func BenchmarkChoose(b *testing.B) {
	for _, peersN := range []int{8, 64, 256} {
		for _, tokens := range []int{1024, 32768} {
			b.Run(fmt.Sprintf("peers=%d/tokens=%d", peersN, tokens), func(b *testing.B) {
				keys := keysN(1, tokens/16)
				peers := make([]PeerView, peersN)
				for i := range peers {
					m := benchMatcher{}
					held := 4
					if i == peersN/2 {
						held = len(keys) * 3 / 4
					}
					for _, k := range keys[:held] {
						m[k] = struct{}{}
					}
					peers[i] = PeerView{ID: fmt.Sprintf("pod-%03d", i), KeyScheme: blockkey.Version,
						Digest: m, DigestAt: t0, LoadAt: t0, Load: Load{Running: i % 7, Waiting: i % 3, KVUsage: 0.5}}
				}
				policy := DefaultChain(DefaultConfig(), NewRecent(DefaultRecentConfig()))
				req := Request{Keys: keys, TokensPerKey: 16}
				b.ReportAllocs()
				for b.Loop() {
					d := policy.Choose(req, peers, t0)
					if d.Reason != ReasonAffinity {
						b.Fatalf("Reason = %s; want affinity", d.Reason)
					}
				}
			})
		}
	}
}

// BenchmarkRecent measures the speculative-entry cost per forward.
func BenchmarkRecent(b *testing.B) {
	r := NewRecent(DefaultRecentConfig())
	keys := keysN(1, 2048)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now := t0.Add(time.Duration(i) * time.Microsecond)
		r.Record("pod-1", keys, now)
		if r.PrefixLen("pod-1", keys, now) != len(keys) {
			b.Fatal("recorded chain not found")
		}
		i++
	}
}

// BenchmarkRecentFull records a new 32k-token chain (512 keys) per forward
// into a Recent kept full by the forwards before it, as a busy sidecar's
// is: every write and expiry misses the cache.
func BenchmarkRecentFull(b *testing.B) {
	r := NewRecent(DefaultRecentConfig())
	peers := []string{"pod-1", "pod-2", "pod-3"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now := t0.Add(time.Duration(i) * 40 * time.Millisecond)
		keys := keysN(i*1000, 512)
		r.Record(peers[i%len(peers)], keys, now)
		i++
	}
	b.ReportMetric(float64(r.Len()), "live")
}

// BenchmarkAttempts is the failover order the front computes after every
// choice (forward's handler), over one candidate per peer.
func BenchmarkAttempts(b *testing.B) {
	for _, n := range []int{8, 64, 1000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			d := Decision{Target: "pod-001", Bound: 5}
			for i := range n {
				d.Candidates = append(d.Candidates, Candidate{ID: fmt.Sprintf("pod-%03d", i),
					Local: i == 0, Eligible: i%10 != 9, Load: float64(i % 7), Over: i%7 == 6})
			}
			b.ReportAllocs()
			for b.Loop() {
				if got := Attempts(d, 3); len(got) != 3 {
					b.Fatalf("Attempts = %v; want 3", got)
				}
			}
		})
	}
}
