package gossip

import (
	"sync"
	"sync/atomic"
)

// sender sends to one peer, in order, from its own goroutine, so a slow or
// dead peer (a TCP send can block for memberlist's TCPTimeout) delays only
// its own messages. Full-digest requests are coalesced into one flag and
// served with the newest local digest before the next queued message.
//
// Load reports take a lane of their own (pushLoad, runLoad): a slot that
// holds the newest report, sent by a second goroutine. Peers take a pod
// whose reports stop for route.Config.SilentFor (1.5 s) for dead, so a
// report must never wait behind the queue (a burst of deltas, response
// announcements or text prefixes, or a full digest by TCP) nor be dropped
// because the queue is full: a busy pod would look like a dead one.
type sender struct {
	m        *Mesh
	id       string
	q        chan out
	kick     chan struct{} // wakes run when wantFull is set
	wantFull atomic.Bool
	stop     chan struct{} // closed when the peer leaves

	loadMu   sync.Mutex
	hasLoad  bool          // load holds a report not yet sent
	load     loadReport    // the newest report
	loadB    []byte        // load encoded; nil once merged with a replaced one
	reliable bool          // load must go by TCP: it, or one it replaced, changed the state
	loadKick chan struct{} // wakes runLoad
}

// out is one message: by UDP, or by TCP when reliable.
type out struct {
	b        []byte
	reliable bool
}

func newSender(m *Mesh, id string, depth int) *sender {
	return &sender{
		m:    m,
		id:   id,
		q:    make(chan out, depth),
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),

		loadKick: make(chan struct{}, 1),
	}
}

// pushLoad hands the peer our newest load report r, encoded as b (shared
// by every sender, never modified); it never blocks. A report still unsent
// is replaced by r, which carries the same node's newer load and state:
// its claims, facts of their own, go on in r (the newest maxClaims), and
// if either had to go reliably, r does.
func (s *sender) pushLoad(r loadReport, b []byte, reliable bool) {
	s.loadMu.Lock()
	if s.hasLoad {
		if n := len(s.load.Claims); n > 0 {
			cs := append(append(make([]peerClaim, 0, n+len(r.Claims)), s.load.Claims...), r.Claims...)
			r.Claims, b = cs[max(0, len(cs)-maxClaims):], nil
		}
		reliable = reliable || s.reliable
	}
	s.hasLoad, s.load, s.loadB, s.reliable = true, r, b, reliable
	s.loadMu.Unlock()
	select {
	case s.loadKick <- struct{}{}:
	default:
	}
}

// takeLoad empties the load slot: the report, its bytes (nil: encode
// it), whether it must go reliably, and whether there was one.
func (s *sender) takeLoad() (loadReport, []byte, bool, bool) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	r, b, rel, ok := s.load, s.loadB, s.reliable, s.hasLoad
	s.hasLoad, s.load, s.loadB, s.reliable = false, loadReport{}, nil, false
	return r, b, rel, ok
}

// runLoad sends the load slot's report whenever it is filled, until the
// peer leaves or the mesh shuts down; it returns after the send in
// progress, if any.
func (s *sender) runLoad() {
	defer s.m.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case <-s.m.done:
			return
		case <-s.loadKick:
		}
		r, b, reliable, ok := s.takeLoad()
		if !ok {
			continue
		}
		if b == nil {
			var err error
			if b, err = encodeLoad(r); err != nil {
				s.m.stats.sendErrors.Add(1)
				s.m.log.Error().Err(err).Msg("encode merged load report")
				continue
			}
		}
		s.send(out{b: b, reliable: reliable})
	}
}

// enqueue queues o, or drops and counts it when the queue is full: a lost
// delta is repaired by a full digest.
func (s *sender) enqueue(o out) {
	select {
	case s.q <- o:
	default:
		s.m.stats.outboxDrops.Add(1)
	}
}

// requestFull asks run to send the full local digest soon, once however many
// times it is asked before it gets to it.
func (s *sender) requestFull() {
	s.wantFull.Store(true)
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run sends until the peer leaves (stop) or the mesh shuts down (done). It
// returns after the send in progress, if any, completes or fails. It
// starts runLoad, whose place in the mesh's WaitGroup it takes while its
// own still holds the group open.
func (s *sender) run() {
	defer s.m.wg.Done()
	s.m.wg.Add(1)
	go s.runLoad()
	for {
		if s.wantFull.Swap(false) {
			if b := s.m.fullBytes(s.id); b != nil {
				s.send(out{b: b, reliable: true})
			}
		}
		select {
		case <-s.stop:
			return
		case <-s.m.done:
			return
		case o := <-s.q:
			s.send(o)
		case <-s.kick:
		}
	}
}

// stream takes a slot for a TCP send (Config.MaxStreams), waiting for
// one if need be; false when the peer left or the mesh shut down first.
func (s *sender) stream() bool {
	select {
	case s.m.streams <- struct{}{}:
		return true
	default:
	}
	s.m.stats.streamWaits.Add(1)
	select {
	case s.m.streams <- struct{}{}:
		return true
	case <-s.stop:
	case <-s.m.done:
	}
	return false
}

func (s *sender) send(o out) {
	ms := s.m.ms.Load()
	if ms == nil {
		s.m.stats.sendErrors.Add(1)
		return
	}
	if drop := s.m.hooks.dropOut; drop != nil && drop(s.id, o.b) {
		return
	}
	if o.reliable {
		if !s.stream() {
			return
		}
		defer func() { <-s.m.streams }()
		if hold := s.m.hooks.streaming; hold != nil {
			hold(s.id)
		}
	}
	if err := ms.Send(s.id, o.b, o.reliable); err != nil {
		s.m.stats.sendErrors.Add(1)
		s.m.log.Debug().Err(err).Str("peer", s.id).Msg("gossip send failed")
		return
	}
	s.m.stats.sent.count(o.b)
}
