package gossip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// goroutines returns the stacks of every goroutine but the caller's whose
// stack mentions pkg (a function of it, or "created by" one).
func goroutines(pkg string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		if i > 0 && bytes.Contains(g, []byte(pkg)) { // 0 is the caller
			found = append(found, string(g))
		}
	}
	return found
}

// TestShutdownJoinsGoroutines checks that Shutdown returns while a seed
// lookup hangs, that after it no goroutine the mesh started is left (its
// loops, the joiner, a sender per peer), and that memberlist's own end too:
// a mesh torn down in a test or a sidecar drained and restarted in-process
// leaks nothing.
func TestShutdownJoinsGoroutines(t *testing.T) {
	const theirs = "hashicorp/memberlist."
	const gossipPkg, membershipPkg = "kvroute/kvroute/gossip.", "kvroute/kvroute/membership."
	ours := func() []string { return append(goroutines(gossipPkg), goroutines(membershipPkg)...) }
	// A seed lookup ends by itself after 5 s (membership's resolveTimeout);
	// Shutdown must end it sooner.
	const lookupLimit = 5 * time.Second
	// Earlier tests' memberlists may still be winding down.
	waitFor(t, 15*time.Second, "no memberlist goroutines before the test", func() bool { return len(goroutines(theirs)) == 0 })

	resolvers := make([]*stuckResolver, 3)
	ms := cluster(t, 3, func(i int, c *Config) {
		resolvers[i] = &stuckResolver{}
		c.Resolver = resolvers[i]
		c.Join = append(c.Join, "seeds.test:7946")
		c.RejoinInterval = 10 * time.Millisecond // soon in a lookup only Shutdown ends
	})
	if err := ms[0].PublishDigest(testDigest("n0", 1, 1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	ms[0].SetServing(3, 0, 0, 0)
	ms[1].Claim("n0", []route.Claim{{Key: 1, Keys: 2}})
	waitFor(t, 5*time.Second, "digest and load on n1 and n2", func() bool {
		v, _ := view(ms[2], "n0")
		return holds(ms[1], "n0", 1, 2) && holds(ms[2], "n0", 1, 2) && v.Load.Serving == 3
	})
	// Each mesh runs run, metaLoop, loadLoop, the joiner and a sender per
	// peer; seeing them proves the check below can see them too.
	for fn, want := range map[string]int{gossipPkg + "(*Mesh).run(": 3, gossipPkg + "(*Mesh).metaLoop(": 3,
		gossipPkg + "(*Mesh).loadLoop(": 3, membershipPkg + "(*joiner).loop(": 3, gossipPkg + "(*sender).run(": 3 * 2} {
		if got := len(goroutines(fn)); got != want {
			t.Errorf("%d goroutines in %s; want %d", got, fn, want)
		}
	}
	if len(goroutines(theirs)) == 0 {
		t.Fatalf("no memberlist goroutines while running: the check cannot see them")
	}
	waitFor(t, 5*time.Second, "every joiner in a lookup", func() bool {
		for _, r := range resolvers {
			if r.calls.Load() < 2 {
				return false
			}
		}
		return true
	})
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		for _, m := range ms {
			if err := m.Shutdown(); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		}
	}()
	select {
	case <-shut:
	case <-time.After(lookupLimit / 2): // less than a lookup's own limit: Shutdown ended them
		t.Fatalf("Shutdown did not return in %v:\n%s", lookupLimit/2, strings.Join(ours(), "\n\n"))
	}
	// Shutdown has waited for every one of them; the poll only lets a
	// goroutine past its wg.Done return.
	deadline := time.Now().Add(time.Second)
	for left := ours(); len(left) > 0; left = ours() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the mesh after Shutdown:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	deadline = time.Now().Add(15 * time.Second) // memberlist ends a stream within TCPTimeout
	for left := goroutines(theirs); len(left) > 0; left = goroutines(theirs) {
		if time.Now().After(deadline) {
			t.Fatalf("%d memberlist goroutines after Shutdown:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stuckResolver answers its first lookup with an error and blocks every
// later one until its context ends: a DNS server that stopped answering.
// No query leaves the process.
type stuckResolver struct{ calls atomic.Int32 }

func (r *stuckResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	if r.calls.Add(1) == 1 {
		return nil, errors.New("no such host")
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestMeshConcurrentUse drives every public method from several goroutines
// at once while peers exchange digests, loads and claims: under -race it
// checks the parts' locks guard what they share, and its deadline catches a
// lock-order deadlock.
func TestMeshConcurrentUse(t *testing.T) {
	ms := cluster(t, 3, func(i int, c *Config) { c.LoadPushInterval = time.Millisecond })
	const rounds = 200
	var wg sync.WaitGroup
	for i, m := range ms {
		name := fmt.Sprintf("n%d", i)
		wg.Add(4)
		go func() { // the cache's publisher
			defer wg.Done()
			for r := range uint64(rounds) {
				if r%50 == 0 {
					if err := m.PublishDigest(testDigest(name, 1+r/50, 1)); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				v := r % 50
				if err := m.PublishDelta(bloom.Delta{Node: name, Epoch: 1 + r/50, From: v, To: v + 1, Keys: []blockkey.Key{blockkey.Key(r)}}); err != nil {
					t.Errorf("PublishDelta(%d→%d): %v", v, v+1, err)
					return
				}
				if r%70 == 0 {
					m.WithdrawDigest()
					m.SetEngine(route.EngineDown)
					m.SetEngine(route.EngineServing)
					if err := m.PublishDigest(testDigest(name, 1+r/50, v+1)); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
		go func() { // the front
			defer wg.Done()
			for r := range rounds {
				m.SetServing(r%7, 0, 0, 0)
				m.Claim(fmt.Sprintf("n%d", r%3), []route.Claim{{Key: blockkey.Key(r), Keys: 1 + r%4}})
				m.MarkFailed(fmt.Sprintf("n%d", (r+1)%3), time.Now())
				_ = m.Snapshot(time.Now())
			}
		}()
		go func() { // the load scraper and the admin
			defer wg.Done()
			for r := range rounds {
				m.SetLoad(route.Load{Running: r % 5, KVUsage: float64(r%10) / 10})
				m.SetModels([]string{"m", fmt.Sprintf("a%d", r%2)})
				m.SetDraining(r%2 == 0)
				_ = m.Stats()
				_ = m.Members()
			}
		}()
		go func() { // memberlist delivering messages
			defer wg.Done()
			d := delegate{m}
			for r := range rounds {
				b, _ := encodeLoad(loadReport{Node: fmt.Sprintf("n%d", (i+1)%3), Seq: uint64(r + 1),
					Claims: []peerClaim{{Peer: name, Key: 5, Keys: 1}}, HasState: true})
				d.NotifyMsg(b)
				_ = d.NodeMeta(maxMetaBytes)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatalf("concurrent use did not finish in 20 s: a deadlock?\n%s", strings.Join(goroutines("kvroute/kvroute/gossip."), "\n\n"))
	}
	waitFor(t, 5*time.Second, "every peer sees every other's latest models", func() bool {
		for _, m := range ms {
			for _, v := range m.Snapshot(time.Now()) {
				if len(v.Models) != 2 || v.Models[1] != "a1" {
					return false
				}
			}
		}
		return true
	})
}

// TestShutdownDuringMetaUpdate checks Shutdown does not wait out a meta
// update whose broadcast cannot leave: memberlist's UpdateNode waits for
// it with no regard for Shutdown, so the mesh must bound that wait itself,
// here where updates are an hour apart and gossip never runs.
func TestShutdownDuringMetaUpdate(t *testing.T) {
	ms := cluster(t, 2, func(i int, c *Config) {
		c.MetaInterval = time.Hour
		c.Memberlist = func(mc *memberlist.Config) { fastDetection(mc); mc.GossipInterval = time.Hour }
	})
	ms[0].SetDraining(true) // kicks the meta loop into UpdateNode
	waitFor(t, 5*time.Second, "the meta loop in UpdateNode", func() bool {
		return len(goroutines("memberlist.(*Memberlist).UpdateNode(")) > 0
	})
	shut := make(chan error, 1)
	go func() { shut <- ms[0].Shutdown() }()
	select {
	case <-shut:
	case <-time.After(maxMetaWait + 2*time.Second):
		t.Fatalf("Shutdown still waiting after %v:\n%s", maxMetaWait+2*time.Second, strings.Join(goroutines("kvroute/kvroute/gossip."), "\n\n"))
	}
}
