package forward

import (
	"sync"

	"github.com/kvroute/kvroute/route"
)

// snapshots keeps the copies of the peer table that the request path
// builds for its routing (the choice, admission, steering, the targets)
// and reads no more once it has its targets. A new copy per request was
// 320 KB at a thousand peers to clear and for the garbage collector to
// scan, twice the time of filling it.
type snapshots struct{ pool sync.Pool }

// take returns a buffer for Peers.AppendSnapshot; give it back when done.
func (s *snapshots) take() *[]route.PeerView {
	if b, ok := s.pool.Get().(*[]route.PeerView); ok {
		return b
	}
	return new([]route.PeerView)
}

// give returns a buffer that nothing reads any more. Its views still
// point into the table as it was (metas, digests); sync.Pool drops idle
// buffers within two garbage collections, and with them those.
func (s *snapshots) give(b *[]route.PeerView) { s.pool.Put(b) }
