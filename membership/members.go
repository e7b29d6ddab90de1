package membership

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Members is this node's membership: memberlist over counted sockets,
// joined to the seeds and rejoined. It is safe for concurrent use.
type Members struct {
	cfg  Config
	log  zerolog.Logger
	ml   *memberlist.Memberlist
	sock sockBytes // transport.go

	joinAttempts, joinFailures atomic.Uint64

	self  atomic.Pointer[Node] // this node, as memberlist last announced it
	mu    sync.Mutex
	peers map[string]Node // every live peer as of its last event: Send's addresses, the joiner's live set

	done     chan struct{}      // closed by Shutdown
	stopJoin context.CancelFunc // set by Join; nil before
	wg       sync.WaitGroup     // the joiner
	shut     sync.Once
	shutErr  error
}

// Node is a member as of one event. It is a copy: the *memberlist.Node
// that memberlist hands out is rewritten in place by its alive handling,
// so reading its fields later races (hashicorp/memberlist#306).
type Node struct {
	Name string
	Addr string // the gossip address, ip:port
	Meta []byte // its node meta, as its Delegate.NodeMeta made it
	ml   memberlist.Node
}

func nodeOf(n *memberlist.Node) Node {
	return Node{Name: n.Name, Addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), Meta: n.Meta, ml: *n}
}

// Stats are the membership's counters since New.
type Stats struct {
	JoinAttempts uint64 // memberlist.Join calls
	JoinFailures uint64 // calls that reached no one

	// SocketSent and SocketReceived are the bytes through the sockets:
	// every UDP payload and TCP stream byte, memberlist's own (probes,
	// acks, gossip of metas, push/pull) and the user's, without IP, UDP or
	// TCP headers. Zero with a transport a test brought.
	SocketSent, SocketReceived uint64
}

// New starts memberlist with d and ev as its delegates; it joins no one
// until Join. d and ev are called from the moment New starts, before it
// returns. New fails only on a bad configuration or when it cannot bind.
func New(cfg Config, d Delegate, ev Events) (*Members, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ms := &Members{
		cfg:   cfg,
		log:   cfg.Log.With().Str("component", "gossip").Logger(),
		peers: map[string]Node{},
		done:  make(chan struct{}),
	}
	mc := cfg.memberlistConfig(adapter{ms: ms, d: d, ev: ev})
	var own *transport // nil when a test brought its own
	if mc.Transport == nil {
		t, err := newTransport(mc.BindAddr, mc.BindPort, &ms.sock, func(err error) { ms.log.Warn().Err(err).Msg("gossip transport") })
		if err != nil {
			return nil, fmt.Errorf("start memberlist: %w", err)
		}
		// What memberlist does for its own transport on port 0.
		if mc.BindPort == 0 {
			mc.BindPort = t.Port()
		}
		if mc.AdvertisePort == 0 {
			mc.AdvertisePort = t.Port()
		}
		mc.Transport, own = t, t
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if own != nil { // memberlist leaves it open on some failures
			own.Shutdown()
		}
		return nil, fmt.Errorf("start memberlist: %w", err)
	}
	ms.ml = ml
	return ms, nil
}

// Join joins the seeds in the configuration and keeps rejoining them in
// the background (join.go). Being alone is not an error: when no seed
// answers (the first pod, or DNS not ready yet) it keeps trying, with
// backoff, then every RejoinInterval. Join waits for the first attempt
// (memberlist bounds each contact by its TCPTimeout) or for ctx, whichever
// ends first. Call it once.
func (ms *Members) Join(ctx context.Context) {
	rng := ms.cfg.Rand
	if rng == nil {
		h := fnv.New64a()
		h.Write([]byte(ms.cfg.NodeName))
		rng = rand.New(rand.NewPCG(h.Sum64(), 0))
	}
	j := &joiner{ms: ms, seeds: ms.cfg.Join, resolver: ms.cfg.Resolver, rng: rng, last: map[string][]string{}}
	if j.resolver == nil {
		j.resolver = net.DefaultResolver
	}
	jctx, stop := context.WithCancel(context.Background())
	first := make(chan bool, 1)
	ms.mu.Lock()
	select {
	case <-ms.done: // shut down already
		ms.mu.Unlock()
		stop()
		return
	default:
	}
	ms.stopJoin = stop
	ms.wg.Add(1)
	ms.mu.Unlock()
	go j.loop(jctx, first)
	select {
	case <-first:
	case <-ctx.Done(): // still alone, and still trying in the background
	}
}

// ErrNotMember is Send's error for a name that is no live peer.
var ErrNotMember = errors.New("not a live member")

// Send sends b to the live peer of that name, at the address of its last
// event: by TCP when reliable, else by UDP.
func (ms *Members) Send(name string, b []byte, reliable bool) error {
	ms.mu.Lock()
	n, ok := ms.peers[name]
	ms.mu.Unlock()
	if !ok {
		return fmt.Errorf("send to %s: %w", name, ErrNotMember)
	}
	if reliable {
		return ms.ml.SendReliable(&n.ml, b)
	}
	return ms.ml.SendBestEffort(&n.ml, b)
}

// UpdateMeta re-reads this node's meta (Delegate.NodeMeta) and broadcasts
// it to the cluster, waiting up to timeout for it to leave.
func (ms *Members) UpdateMeta(timeout time.Duration) error { return ms.ml.UpdateNode(timeout) }

// Len returns the number of live members, this node included.
func (ms *Members) Len() int { return ms.ml.NumMembers() }

// Self returns this node as memberlist last announced it, and false before
// it has.
func (ms *Members) Self() (Node, bool) {
	if n := ms.self.Load(); n != nil {
		return *n, true
	}
	return Node{}, false
}

// addrs returns the gossip address of every live member, this node
// included.
func (ms *Members) addrs() map[string]bool {
	live := map[string]bool{}
	if n := ms.self.Load(); n != nil {
		live[n.Addr] = true
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, n := range ms.peers {
		live[n.Addr] = true
	}
	return live
}

// Stats returns the counters since New.
func (ms *Members) Stats() Stats {
	return Stats{
		JoinAttempts:   ms.joinAttempts.Load(),
		JoinFailures:   ms.joinFailures.Load(),
		SocketSent:     ms.sock.sent.Load(),
		SocketReceived: ms.sock.recv.Load(),
	}
}

// Leave tells the cluster this node is going, waiting up to timeout for the
// message to leave; peers drop it at once instead of after failure
// detection. Call Shutdown afterwards.
func (ms *Members) Leave(timeout time.Duration) error { return ms.ml.Leave(timeout) }

// Shutdown stops the joiner and memberlist, and returns once they have: a
// join attempt in progress completes or fails first (memberlist bounds it
// by TCPTimeout), a seed lookup is cut. Without Leave first, peers notice
// only by failure detection (seconds). It is safe to call more than once.
func (ms *Members) Shutdown() error {
	ms.shut.Do(func() {
		ms.mu.Lock()
		close(ms.done)
		if ms.stopJoin != nil { // Join ran
			ms.stopJoin()
		}
		ms.mu.Unlock()
		ms.shutErr = ms.ml.Shutdown()
		ms.wg.Wait()
	})
	return ms.shutErr
}
