package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// node is one running membership with a delegate that records what it is
// told.
type node struct {
	ms *Members

	mu      sync.Mutex
	meta    []byte
	msgs    [][]byte
	state   [][]byte
	joined  []string
	left    []string
	updated map[string][]byte // peer → its newest meta
}

func (n *node) NodeMeta(limit int) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.meta
}

func (n *node) setMeta(b []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.meta = b
}

func (n *node) NotifyMsg(b []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.msgs = append(n.msgs, b)
}

func (n *node) LocalState(join bool) []byte { return []byte("state of " + n.ms.cfg.NodeName) }

func (n *node) MergeRemoteState(buf []byte, join bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.state = append(n.state, buf)
}

func (n *node) Joined(p Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.joined = append(n.joined, p.Name)
}

func (n *node) Left(p Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.left = append(n.left, p.Name)
}

func (n *node) Updated(p Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.updated[p.Name] = p.Meta
}

// read runs f under n's lock.
func (n *node) read(f func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f()
}

// fast shortens memberlist's failure detection for loopback.
func fast(c *memberlist.Config) {
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = time.Second
}

// cluster starts k memberships n0..n{k-1} on loopback, all joined through
// n0, and shuts them down when the test ends.
func cluster(t *testing.T, k int) []*node {
	t.Helper()
	ns := make([]*node, k)
	for i := range ns {
		c := LocalConfig()
		c.NodeName = fmt.Sprintf("n%d", i)
		c.Memberlist = fast
		c.Settle = 0 // joins are sequential here; tests count join attempts
		if i > 0 {
			c.Join = []string{addrOf(ns[0])}
		}
		ns[i] = start(t, c)
		ns[i].ms.Join(context.Background())
	}
	waitFor(t, 5*time.Second, "every member everywhere", func() bool {
		for _, n := range ns {
			if n.ms.Len() != k {
				return false
			}
		}
		return true
	})
	return ns
}

// start starts a membership of c, not joined yet, shut down when the test
// ends.
func start(t *testing.T, c Config) *node {
	t.Helper()
	n := &node{meta: []byte("meta of " + c.NodeName), updated: map[string][]byte{}}
	ms, err := New(c, n, n)
	if err != nil {
		t.Fatalf("New(%s): %v", c.NodeName, err)
	}
	n.ms = ms
	t.Cleanup(func() { ms.Shutdown() })
	return n
}

func addrOf(n *node) string {
	self, _ := n.ms.Self()
	return self.Addr
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// TestMembersEventsAndMessages checks what the layer above relies on: it
// hears of each peer once (never of itself) with the peer's meta, a sent
// message arrives by either path, push/pull carries LocalState, a new meta
// arrives as an update, and a peer that leaves is reported gone.
func TestMembersEventsAndMessages(t *testing.T) {
	ns := cluster(t, 3)
	for i, n := range ns {
		var joined []string
		n.read(func() { joined = slices.Clone(n.joined) })
		slices.Sort(joined)
		var want []string
		for j := range ns {
			if j != i {
				want = append(want, fmt.Sprintf("n%d", j))
			}
		}
		if !slices.Equal(joined, want) {
			t.Errorf("n%d heard joins of %v; want %v", i, joined, want)
		}
	}
	// Meta travels with the member.
	var peer Node
	ns[0].ms.mu.Lock()
	peer = ns[0].ms.peers["n1"]
	ns[0].ms.mu.Unlock()
	if string(peer.Meta) != "meta of n1" || peer.Addr != addrOf(ns[1]) {
		t.Errorf("n0's copy of n1 = %q at %s; want its meta at %s", peer.Meta, peer.Addr, addrOf(ns[1]))
	}

	for _, reliable := range []bool{false, true} {
		msg := []byte(fmt.Sprintf("hello reliable=%v", reliable))
		if err := ns[0].ms.Send("n1", msg, reliable); err != nil {
			t.Fatalf("Send(reliable=%v): %v", reliable, err)
		}
		waitFor(t, 5*time.Second, string(msg), func() bool {
			var got bool
			ns[1].read(func() { got = slices.ContainsFunc(ns[1].msgs, func(b []byte) bool { return bytes.Equal(b, msg) }) })
			return got
		})
	}
	waitFor(t, 5*time.Second, "n0's push/pull state at n1", func() bool {
		var got bool
		ns[1].read(func() {
			got = slices.ContainsFunc(ns[1].state, func(b []byte) bool { return string(b) == "state of n0" })
		})
		return got
	})

	ns[2].setMeta([]byte("new meta of n2"))
	if err := ns[2].ms.UpdateMeta(time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n2's new meta at n0", func() bool {
		var m []byte
		ns[0].read(func() { m = ns[0].updated["n2"] })
		return string(m) == "new meta of n2"
	})
	if _, ok := ns[0].updated["n0"]; ok {
		t.Errorf("n0 was told of its own update")
	}

	if err := ns[2].ms.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n2 gone at n0 and n1", func() bool {
		gone := true
		for _, n := range ns[:2] {
			n.read(func() { gone = gone && slices.Contains(n.left, "n2") })
		}
		return gone && !ns[0].ms.addrs()[addrOf(ns[2])]
	})
	if err := ns[0].ms.Send("n2", []byte{1}, true); !errors.Is(err, ErrNotMember) {
		t.Errorf("Send to n2, which left: %v; want ErrNotMember", err)
	}
	if st := ns[0].ms.Stats(); st.SocketSent == 0 || st.SocketReceived == 0 {
		t.Errorf("socket bytes %+v; want both counted", st)
	}
	if err := ns[2].ms.Shutdown(); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := ns[2].ms.Shutdown(); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

// TestNewRejectsBadConfig checks each invalid field is refused before
// anything binds.
func TestNewRejectsBadConfig(t *testing.T) {
	for name, edit := range map[string]func(*Config){
		"no name":    func(c *Config) { c.NodeName = "" },
		"long name":  func(c *Config) { c.NodeName = string(make([]byte, 256)) },
		"short key":  func(c *Config) { c.SecretKey = make([]byte, 15) },
		"long label": func(c *Config) { c.Label = string(make([]byte, memberlist.LabelMaxSize+1)) },
	} {
		c := LocalConfig()
		c.NodeName = "n"
		edit(&c)
		n := &node{updated: map[string][]byte{}}
		ms, err := New(c, n, n)
		if err == nil {
			ms.Shutdown()
			t.Errorf("%s: New accepted it", name)
		} else if !errors.Is(err, ErrConfig) {
			t.Errorf("%s: New error %v; want ErrConfig", name, err)
		}
	}
}

// TestAdapterCopiesMessages checks a message and a push/pull state reach
// the delegate as copies: memberlist reuses its buffers.
func TestAdapterCopiesMessages(t *testing.T) {
	n := &node{updated: map[string][]byte{}}
	a := adapter{ms: &Members{}, d: n, ev: n}
	b := []byte{1, 2}
	a.NotifyMsg(b)
	a.MergeRemoteState(b, false)
	b[1] = 9 // memberlist reuses its buffer
	if got := n.msgs[0]; got[1] != 2 {
		t.Errorf("message %v; want the copy taken before reuse", got)
	}
	if got := n.state[0]; got[1] != 2 {
		t.Errorf("state %v; want the copy taken before reuse", got)
	}
	a.MergeRemoteState(nil, true)
	if len(n.state) != 1 {
		t.Errorf("an empty state was handed on")
	}
}
