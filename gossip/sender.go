package gossip

import (
	"sync/atomic"

	"github.com/hashicorp/memberlist"
)

// sender sends to one peer, in order, from its own goroutine, so a slow or
// dead peer (a TCP send can block for memberlist's TCPTimeout) delays only
// its own messages. Full-digest requests are coalesced into one flag and
// served with the newest local digest before the next queued message.
type sender struct {
	m        *Mesh
	id       string
	node     atomic.Pointer[memberlist.Node] // the peer's address, refreshed on update
	q        chan out
	kick     chan struct{} // wakes run when wantFull is set
	wantFull atomic.Bool
	stop     chan struct{} // closed when the peer leaves
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
// returns after the send in progress, if any, completes or fails.
func (s *sender) run() {
	defer s.m.wg.Done()
	for {
		if s.wantFull.Swap(false) {
			if b := s.m.fullBytes(); b != nil {
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

func (s *sender) send(o out) {
	ml, node := s.m.ml.Load(), s.node.Load()
	if ml == nil || node == nil {
		s.m.stats.sendErrors.Add(1)
		return
	}
	if drop := s.m.hooks.dropOut; drop != nil && drop(s.id, o.b) {
		return
	}
	var err error
	if o.reliable {
		err = ml.SendReliable(node, o.b)
	} else {
		err = ml.SendBestEffort(node, o.b)
	}
	if err != nil {
		s.m.stats.sendErrors.Add(1)
		s.m.log.Debug().Err(err).Str("peer", s.id).Msg("gossip send failed")
		return
	}
	s.m.stats.sent.count(o.b)
}
