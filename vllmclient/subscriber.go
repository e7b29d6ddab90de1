package vllmclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Subscriber receives vLLM's KV events and delivers them as ordered Items.
// See the package doc for the loss semantics.
type Subscriber struct {
	items     chan Item
	c         counters
	endpoints []string
	// restarts counts the restarts any rank reported. The data-parallel
	// ranks of one vLLM stop and start together, so when one rank reports
	// a restart the others expect theirs and do not report it again when
	// they next publish from seq 0, perhaps much later (the consumer would
	// clear its index of what the first rank stored since).
	restarts atomic.Uint64

	mu  sync.Mutex
	err error
}

// Subscribe opens one SUB socket per DP rank (and one replay DEALER per rank
// when cfg.ReplayEndpoint is set) and starts delivering Items. Binding or
// connecting happens before it returns, so a bad endpoint is an error here.
//
// It starts one goroutine per rank, which owns that rank's SUB and DEALER
// (zmq sockets are not goroutine-safe) and polls them together so replay
// and live batches are sequenced without locks, plus one closer goroutine.
// The rank goroutines exit when ctx is done or a socket fails; the closer
// then terminates the zmq context and closes Items. Err reports why.
func Subscribe(ctx context.Context, cfg Config) (*Subscriber, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmq context: %w", err)
	}
	s := &Subscriber{items: make(chan Item, cfg.HandoffDepth)}
	loops := make([]*rankLoop, 0, cfg.DPRanks)
	fail := func(err error) (*Subscriber, error) {
		for _, l := range loops {
			l.close()
		}
		_ = zctx.Term() // every socket is closed with linger 0: cannot block
		return nil, err
	}
	for r := range cfg.DPRanks {
		l, err := openRank(zctx, cfg, r, s.items, &s.c, &s.restarts)
		if err != nil {
			return fail(err)
		}
		loops = append(loops, l)
		s.endpoints = append(s.endpoints, l.endpoint)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() {
			if err := l.run(ctx); err != nil {
				s.setErr(err)
				cancel() // one broken rank stops the others: the caller restarts us
			}
		})
	}
	go func() {
		wg.Wait()
		cancel()
		if err := zctx.Term(); err != nil {
			s.setErr(fmt.Errorf("zmq term: %w", err))
		}
		close(s.items)
	}()
	return s, nil
}

// Items returns the ordered output. It is closed after the subscriber stops.
func (s *Subscriber) Items() <-chan Item { return s.items }

// Stats returns the counters so far; safe to call from any goroutine.
func (s *Subscriber) Stats() Stats { return s.c.snapshot() }

// Endpoints returns the SUB endpoint of each rank; for a bound socket it is
// the address actually bound (useful with a wildcard port "tcp://host:*").
func (s *Subscriber) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// Err returns the socket error that stopped the subscriber, or nil when it
// stopped because its context was done. Valid once Items is closed.
func (s *Subscriber) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Subscriber) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// rankLoop is the socket edge of one DP rank; all fields are owned by its
// goroutine once run starts.
type rankLoop struct {
	cfg      Config
	rank     int
	zctx     *zmq.Context
	sub      *zmq.Socket
	dealer   *zmq.Socket // nil without replay
	endpoint string
	replayEP string
	poller   *zmq.Poller
	subWait  *fdWait // nil when ZMQ_FD cannot be watched: zmq_poll blocks instead
	seq      *sequencer
	out      chan<- Item
	c        *counters
	restarts *atomic.Uint64    // Subscriber.restarts
	seen     uint64            // restarts this rank has reported or expects
	lost     map[string]uint64 // topic → first seq dropped at hand-off
	deadline time.Time         // replay abandoned when no reply by then
}

func openRank(zctx *zmq.Context, cfg Config, r int, out chan<- Item, c *counters, restarts *atomic.Uint64) (*rankLoop, error) {
	ep, err := RankEndpoint(cfg.Endpoint, r)
	if err != nil {
		return nil, err
	}
	l := &rankLoop{
		cfg: cfg, rank: r, zctx: zctx, endpoint: ep, out: out, c: c, restarts: restarts,
		seq:  newSequencer(r, cfg.Topic, cfg.ReplayEndpoint != "", cfg.ReplayHoldBatches),
		lost: make(map[string]uint64),
	}
	if l.sub, err = l.socket(zmq.SUB); err != nil {
		return nil, err
	}
	if err := l.sub.SetRcvhwm(cfg.RcvHWM); err != nil {
		l.close()
		return nil, fmt.Errorf("sub rcvhwm: %w", err)
	}
	if err := l.sub.SetSubscribe(cfg.Topic); err != nil {
		l.close()
		return nil, fmt.Errorf("sub subscribe: %w", err)
	}
	if cfg.Bind {
		if err := l.sub.Bind(ep); err != nil {
			l.close()
			return nil, fmt.Errorf("bind %s: %w", ep, err)
		}
		if l.endpoint, err = l.sub.GetLastEndpoint(); err != nil {
			l.close()
			return nil, fmt.Errorf("bound endpoint: %w", err)
		}
	} else if err := l.sub.Connect(ep); err != nil {
		l.close()
		return nil, fmt.Errorf("connect %s: %w", ep, err)
	}
	if cfg.ReplayEndpoint != "" {
		if l.replayEP, err = RankEndpoint(cfg.ReplayEndpoint, r); err != nil {
			l.close()
			return nil, err
		}
		if err := l.openDealer(); err != nil {
			l.close()
			return nil, err
		}
	}
	l.resetPoller()
	if l.subWait, err = newFDWait(l.sub); err != nil {
		l.subWait = nil // correct without it, only slower to yield the CPU
	}
	return l, nil
}

// socket creates a socket with the options every socket here shares.
func (l *rankLoop) socket(t zmq.Type) (*zmq.Socket, error) {
	so, err := l.zctx.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("new %v socket: %w", t, err)
	}
	// Linger 0: pending messages must never hold up Term at shutdown.
	opts := []error{so.SetLinger(0), so.SetReconnectIvl(l.cfg.ReconnectIvl), so.SetReconnectIvlMax(l.cfg.ReconnectIvlMax)}
	if hb := l.cfg.Heartbeat; hb > 0 {
		opts = append(opts, so.SetHeartbeatIvl(hb), so.SetHeartbeatTimeout(3*hb))
	}
	if err := errors.Join(opts...); err != nil {
		_ = so.Close()
		return nil, fmt.Errorf("%v socket options: %w", t, err)
	}
	return so, nil
}

// openDealer (re)creates the replay socket; a fresh socket guarantees that
// no late reply to an abandoned replay is read as part of the next one.
func (l *rankLoop) openDealer() error {
	if l.dealer != nil {
		_ = l.dealer.Close()
		l.dealer = nil
	}
	d, err := l.socket(zmq.DEALER)
	if err != nil {
		return err
	}
	if err := d.Connect(l.replayEP); err != nil {
		_ = d.Close()
		return fmt.Errorf("connect replay %s: %w", l.replayEP, err)
	}
	l.dealer = d
	return nil
}

func (l *rankLoop) resetPoller() {
	l.poller = zmq.NewPoller()
	l.poller.Add(l.sub, zmq.POLLIN)
	if l.dealer != nil {
		l.poller.Add(l.dealer, zmq.POLLIN)
	}
}

func (l *rankLoop) close() {
	if l.subWait != nil {
		l.subWait.close()
	}
	if l.sub != nil {
		_ = l.sub.Close()
	}
	if l.dealer != nil {
		_ = l.dealer.Close()
	}
}

// drainMax bounds the messages read from one socket per poll, so a flood
// on SUB cannot starve the replay socket (or the other way round).
const drainMax = 512

// run is the rank's loop; it returns nil when ctx is done, or the socket
// error that stopped it. It closes the rank's sockets before returning.
func (l *rankLoop) run(ctx context.Context) error {
	defer l.close()
	if err := l.apply(l.seq.start()); err != nil {
		return err
	}
	for ctx.Err() == nil {
		wait := l.cfg.PollInterval
		if l.seq.replaying() {
			left := time.Until(l.deadline)
			if left <= 0 {
				l.c.replayFailures.Add(1)
				if err := l.apply(l.seq.replayFailed()); err != nil {
					return err
				}
				continue
			}
			wait = min(wait, left)
		}
		polled, err := l.poll(ctx, wait)
		if err != nil {
			if zmq.AsErrno(err) == zmq.ETERM {
				return nil
			}
			return fmt.Errorf("poll rank %d: %w", l.rank, err)
		}
		for _, p := range polled {
			switch p.Socket {
			case l.sub:
				err = l.drainSub()
			case l.dealer:
				err = l.drainDealer()
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// poll returns the sockets with messages, waiting up to d for one. Outside
// a replay it waits on Go's netpoller for SUB (fdWait says why); during
// one, when the dealer's replies matter too, in zmq_poll.
func (l *rankLoop) poll(ctx context.Context, d time.Duration) ([]zmq.Polled, error) {
	if l.subWait == nil || l.seq.replaying() {
		return l.poller.Poll(d)
	}
	if polled, err := l.poller.Poll(0); err != nil || len(polled) > 0 {
		return polled, err
	}
	if err := l.subWait.wait(ctx, d); err != nil {
		return nil, fmt.Errorf("wait rank %d: %w", l.rank, err)
	}
	return l.poller.Poll(0)
}

func (l *rankLoop) drainSub() error {
	for range drainMax {
		frames, err := l.sub.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				return nil
			}
			return fmt.Errorf("recv rank %d: %w", l.rank, err)
		}
		l.c.received.Add(1)
		m, err := parseLive(frames)
		if err != nil {
			var topic string
			if len(frames) > 0 {
				topic = string(frames[0])
			}
			l.c.decodeErrors.Add(1)
			l.deliver(errorItem(Stream{Topic: topic, Rank: l.rank}, 0, err))
			continue
		}
		if m.err != nil {
			l.c.decodeErrors.Add(1)
		}
		if n := l.restarts.Load(); n != l.seen {
			l.seen = n
			l.seq.expectRestart() // another rank restarted: so does this one
		}
		if err := l.apply(l.seq.live(m)); err != nil {
			return err
		}
	}
	return nil
}

func (l *rankLoop) drainDealer() error {
	for range drainMax {
		if l.dealer == nil {
			return nil
		}
		frames, err := l.dealer.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				return nil
			}
			return fmt.Errorf("recv replay rank %d: %w", l.rank, err)
		}
		m, topicSent, end, err := parseReply(frames)
		switch {
		case err != nil:
			l.c.decodeErrors.Add(1) // no seq: nothing to sequence
			continue
		case end:
			err = l.apply(l.seq.replayDone())
		default:
			l.c.replayed.Add(1)
			if m.err != nil {
				l.c.decodeErrors.Add(1)
			}
			l.deadline = time.Now().Add(l.cfg.ReplayTimeout)
			err = l.apply(l.seq.replayed(m, topicSent))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// apply carries out a sequencer step: deliver, then abandon or request a
// replay.
func (l *rankLoop) apply(s step) error {
	for _, it := range s.items {
		switch it.Kind {
		case KindGap:
			l.c.gaps.Add(1)
		case KindRestart:
			l.c.restarts.Add(1)
			l.seen = l.restarts.Add(1)
		}
		l.deliver(it)
	}
	l.c.duplicates.Add(uint64(s.dups))
	if s.abort {
		if err := l.openDealer(); err != nil {
			return err
		}
		l.resetPoller()
	}
	if !s.replay {
		return nil
	}
	l.c.replays.Add(1)
	l.deadline = time.Now().Add(l.cfg.ReplayTimeout)
	// Without ZMQ_IMMEDIATE a DEALER queues for a peer still connecting, so
	// this does not block; a refusal is a failed replay, not a fatal error.
	if _, err := l.dealer.SendMessageDontwait(replayRequest(s.replayFrom)); err != nil {
		l.c.replayFailures.Add(1)
		return l.apply(l.seq.replayFailed())
	}
	return nil
}

// deliver hands an item to the consumer without ever blocking. A dropped
// batch is remembered so that the stream's next delivered batch is
// preceded by a Gap: the consumer always learns that it missed something.
func (l *rankLoop) deliver(it Item) {
	topic := it.Stream.Topic
	var seq uint64
	switch it.Kind {
	case KindBatch:
		seq = it.Batch.Seq
	case KindDecodeError:
		seq = it.Seq
	case KindRestart:
		delete(l.lost, topic) // the old numbering is gone
	}
	hasSeq := it.Kind == KindBatch || (it.Kind == KindDecodeError && !errors.Is(it.Err, ErrFrames))
	if first, ok := l.lost[topic]; ok && hasSeq {
		if !l.send(gapItem(it.Stream, first, seq)) {
			l.c.dropped.Add(1)
			return
		}
		l.c.gaps.Add(1)
		delete(l.lost, topic)
	}
	if l.send(it) {
		return
	}
	l.c.dropped.Add(1)
	if hasSeq {
		l.lost[topic] = seq
	}
}

func (l *rankLoop) send(it Item) bool {
	select {
	case l.out <- it:
		return true
	default:
		return false
	}
}
