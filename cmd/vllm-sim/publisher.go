package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/simhttp"
)

// endSeq is the replay end marker, (-1).to_bytes(8, "big", signed=True).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// pubConfig configures the KV-event publisher. Field names and defaults
// follow vLLM's KVEventsConfig (vllm/config/kv_events.py).
type pubConfig struct {
	// Endpoint is the PUB socket address; bound or connected by bindsPub.
	Endpoint string
	// ReplayEndpoint is the ROUTER address, always bound; "" disables replay.
	ReplayEndpoint string
	Topic          string
	// BufferSteps is how many past batches replay can serve (vLLM 10000).
	BufferSteps int
	// HWM is the PUB send high-water mark in messages (vLLM 100000).
	HWM int
	// MaxQueueSize bounds the queue between the engine's step loop and the
	// socket goroutine (vLLM 100000). When it is full a batch is dropped and
	// counted rather than blocking the engine; no seq is consumed for it.
	MaxQueueSize int
	Encoding     kvevent.Encoding
	// DropRate is the probability that a batch is not sent live (it still
	// consumes a seq and enters the replay buffer), as a full HWM would.
	DropRate float64
	// Rank is the data-parallel rank sent in every batch (0 without DP).
	Rank int64
	// Seed seeds the drop decisions so a test run is reproducible.
	Seed int64
	// ReplayPoll is how often an idle loop checks the ROUTER; it bounds the
	// replay latency, not the live latency (vLLM polls its queue at 100 ms).
	ReplayPoll time.Duration
}

func defaultPubConfig() pubConfig {
	return pubConfig{
		Endpoint:     "tcp://*:5557",
		BufferSteps:  10000,
		HWM:          100000,
		MaxQueueSize: 100000,
		Encoding:     kvevent.MapEncoding,
		ReplayPoll:   10 * time.Millisecond,
	}
}

// bindsPub is vLLM's rule (ZmqEventPublisher._socket_setup): bind when the
// endpoint names a wildcard or a local transport, else connect.
func bindsPub(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// pubItem is one queued unit of work for the socket goroutine: an encoded
// batch payload, or a control item whose ack is closed once every earlier
// item is handled (after resetting seq and the buffer when restart is set).
type pubItem struct {
	payload []byte
	ack     chan struct{}
	restart bool
}

type buffered struct {
	seq     uint64
	payload []byte
}

// publisher sends the engine's KV events as vLLM's ZmqEventPublisher does.
// Sink and the setters are safe for concurrent use; the sockets belong to
// the goroutine started by startPublisher.
type publisher struct {
	cfg        pubConfig
	q          chan pubItem
	dropRate   atomic.Uint64 // math.Float64bits
	pubAddr    string
	replayAddr string
	done       chan struct{}
	err        error // set before done is closed

	sent, dropped, queueFull, encodeErrors, replays atomic.Uint64

	// Owned by the run goroutine.
	zctx   *zmq.Context
	pub    *zmq.Socket
	router *zmq.Socket
	seq    uint64
	buf    ring
	rng    *rand.Rand
}

// startPublisher opens the sockets (so bind errors surface here) and starts
// the socket goroutine, which exits and closes them when ctx is done; wait
// for that with Wait.
func startPublisher(ctx context.Context, cfg pubConfig) (*publisher, error) {
	if cfg.BufferSteps <= 0 || cfg.HWM < 0 || cfg.MaxQueueSize <= 0 {
		return nil, fmt.Errorf("kv events config: buffer_steps and max_queue_size must be positive, hwm non-negative")
	}
	if cfg.ReplayPoll <= 0 {
		cfg.ReplayPoll = defaultPubConfig().ReplayPoll
	}
	p := &publisher{
		cfg:  cfg,
		q:    make(chan pubItem, cfg.MaxQueueSize),
		done: make(chan struct{}),
		rng:  rand.New(rand.NewSource(cfg.Seed)),
	}
	if err := p.SetDropRate(cfg.DropRate); err != nil {
		return nil, err
	}
	if err := p.open(); err != nil {
		p.close()
		return nil, err
	}
	go p.run(ctx)
	return p, nil
}

func (p *publisher) open() error {
	var err error
	if p.zctx, err = zmq.NewContext(); err != nil {
		return fmt.Errorf("zmq context: %w", err)
	}
	if p.pub, err = p.zctx.NewSocket(zmq.PUB); err != nil {
		return fmt.Errorf("zmq pub socket: %w", err)
	}
	if err = p.pub.SetLinger(0); err != nil {
		return fmt.Errorf("pub linger: %w", err)
	}
	if err = p.pub.SetSndhwm(p.cfg.HWM); err != nil {
		return fmt.Errorf("pub sndhwm: %w", err)
	}
	if bindsPub(p.cfg.Endpoint) {
		if err = p.pub.Bind(p.cfg.Endpoint); err != nil {
			return fmt.Errorf("bind pub %s: %w", p.cfg.Endpoint, err)
		}
		p.pubAddr, _ = p.pub.GetLastEndpoint()
	} else {
		if err = p.pub.Connect(p.cfg.Endpoint); err != nil {
			return fmt.Errorf("connect pub %s: %w", p.cfg.Endpoint, err)
		}
		p.pubAddr = p.cfg.Endpoint
	}
	if p.cfg.ReplayEndpoint == "" {
		return nil
	}
	if p.router, err = p.zctx.NewSocket(zmq.ROUTER); err != nil {
		return fmt.Errorf("zmq router socket: %w", err)
	}
	if err = p.router.SetLinger(0); err != nil {
		return fmt.Errorf("router linger: %w", err)
	}
	// A ROUTER drops at its HWM too; one full replay must fit.
	if err = p.router.SetSndhwm(2*p.cfg.BufferSteps + 2); err != nil {
		return fmt.Errorf("router sndhwm: %w", err)
	}
	if err = p.router.Bind(p.cfg.ReplayEndpoint); err != nil {
		return fmt.Errorf("bind replay %s: %w", p.cfg.ReplayEndpoint, err)
	}
	p.replayAddr, _ = p.router.GetLastEndpoint()
	return nil
}

func (p *publisher) close() {
	for _, s := range []*zmq.Socket{p.pub, p.router} {
		if s != nil {
			s.Close()
		}
	}
	if p.zctx != nil {
		p.zctx.Term()
	}
}

// Endpoints returns the resolved PUB and ROUTER addresses (a bound
// "tcp://127.0.0.1:*" becomes its OS-chosen port; replay is "" when off).
func (p *publisher) Endpoints() (pub, replay string) { return p.pubAddr, p.replayAddr }

// Sink is the engine's EventSink. It encodes on the caller's goroutine, so
// the engine may reuse events after Sink returns, and never blocks.
func (p *publisher) Sink(ts float64, events []kvevent.Event) {
	if len(events) == 0 {
		return
	}
	rank := p.cfg.Rank
	payload, err := kvevent.Encode(kvevent.Batch{TS: ts, Events: events, DPRank: &rank}, p.cfg.Encoding)
	if err != nil {
		p.encodeErrors.Add(1)
		return
	}
	select {
	case p.q <- pubItem{payload: payload}:
	default:
		p.queueFull.Add(1)
	}
}

// Restart makes the publisher behave like a new vLLM process: the next
// batch has seq 0 and the replay buffer is empty. Batches queued before the
// call keep their old numbering. It blocks until applied or ctx is done.
func (p *publisher) Restart(ctx context.Context) error { return p.control(ctx, true) }

// flush returns once every batch queued before the call has been handled.
func (p *publisher) flush(ctx context.Context) error { return p.control(ctx, false) }

func (p *publisher) control(ctx context.Context, restart bool) error {
	ack := make(chan struct{})
	select {
	case p.q <- pubItem{ack: ack, restart: restart}:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.done:
		return errors.New("publisher stopped")
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.done:
		return errors.New("publisher stopped")
	}
}

// SetDropRate changes the live drop probability; r must be in [0, 1].
func (p *publisher) SetDropRate(r float64) error {
	if math.IsNaN(r) || r < 0 || r > 1 {
		return fmt.Errorf("drop rate %v outside [0, 1]", r)
	}
	p.dropRate.Store(math.Float64bits(r))
	return nil
}

// DropRate returns the current live drop probability.
func (p *publisher) DropRate() float64 { return math.Float64frombits(p.dropRate.Load()) }

// Wait blocks until the socket goroutine has closed its sockets and
// returns the error that stopped it, if any.
func (p *publisher) Wait() error {
	<-p.done
	return p.err
}

// run owns the sockets. Live batches go out as soon as they are queued; the
// ROUTER is polled without blocking between batches and at least every
// ReplayPoll, as vLLM's publisher thread does. It exits when ctx is done,
// after closing the sockets.
func (p *publisher) run(ctx context.Context) {
	defer close(p.done)
	defer p.close()
	var poller *zmq.Poller
	if p.router != nil {
		poller = zmq.NewPoller()
		poller.Add(p.router, zmq.POLLIN)
	}
	tick := time.NewTicker(p.cfg.ReplayPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-p.q:
			if it.ack != nil {
				if it.restart {
					p.seq = 0
					p.buf.reset()
				}
				close(it.ack)
			} else if err := p.publish(it.payload); err != nil {
				p.err = err
				return
			}
		case <-tick.C:
		}
		if poller == nil {
			continue
		}
		if err := p.serveReplays(poller); err != nil {
			p.err = err
			return
		}
	}
}

func (p *publisher) publish(payload []byte) error {
	seq := p.seq
	p.seq++
	p.buf.push(buffered{seq: seq, payload: payload}, p.cfg.BufferSteps)
	if r := p.DropRate(); r > 0 && p.rng.Float64() < r {
		p.dropped.Add(1)
		return nil
	}
	if _, err := p.pub.SendMessage(p.cfg.Topic, seqBytes(seq), payload); err != nil {
		// PUB never blocks at HWM, so only a closed context gets here.
		return fmt.Errorf("send seq %d: %w", seq, err)
	}
	p.sent.Add(1)
	return nil
}

// serveReplays answers every pending replay request without blocking.
func (p *publisher) serveReplays(poller *zmq.Poller) error {
	for {
		polled, err := poller.Poll(0)
		if err != nil {
			return fmt.Errorf("poll replay: %w", err)
		}
		if len(polled) == 0 {
			return nil
		}
		frames, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(zmq.ETERM) {
				return err
			}
			continue
		}
		// vLLM ignores anything but [identity, "", start_seq].
		if len(frames) != 3 || len(frames[2]) != 8 {
			continue
		}
		p.replays.Add(1)
		id := frames[0]
		start := binary.BigEndian.Uint64(frames[2])
		p.buf.each(func(b buffered) {
			if b.seq >= start {
				// A ROUTER drops silently when the peer is gone; nothing to do.
				p.router.SendMessageDontwait(id, "", p.cfg.Topic, seqBytes(b.seq), b.payload)
			}
		})
		p.router.SendMessageDontwait(id, "", "", endSeq, "")
	}
}

// ring keeps the newest batches, oldest first, without moving memory.
type ring struct {
	items []buffered
	head  int // index of the oldest item once items is full
}

func (r *ring) push(b buffered, capacity int) {
	if len(r.items) < capacity {
		r.items = append(r.items, b)
		return
	}
	r.items[r.head] = b
	r.head = (r.head + 1) % len(r.items)
}

func (r *ring) each(f func(buffered)) {
	for i := range r.items {
		f(r.items[(r.head+i)%len(r.items)])
	}
}

func (r *ring) reset() {
	clear(r.items)
	r.items = r.items[:0]
	r.head = 0
}

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}

// pubStats is a snapshot of the publisher counters for /metrics.
type pubStats struct {
	Sent, Dropped, QueueFull, EncodeErrors, Replays uint64
}

func (p *publisher) Stats() pubStats {
	return pubStats{
		Sent: p.sent.Load(), Dropped: p.dropped.Load(), QueueFull: p.queueFull.Load(),
		EncodeErrors: p.encodeErrors.Load(), Replays: p.replays.Load(),
	}
}

// registerPublisherMetrics exports the publishers' counters on the
// simulator's /metrics.
func registerPublisherMetrics(m *simhttp.Metrics, stats func() pubStats) {
	c := func(name, help string, f func(pubStats) uint64) {
		m.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(stats())) }))
	}
	c("vllm_sim_kv_batches_sent_total", "KV-event batches sent live.", func(s pubStats) uint64 { return s.Sent })
	c("vllm_sim_kv_batches_dropped_total", "KV-event batches dropped by --sim-drop-rate (seq consumed, kept for replay).", func(s pubStats) uint64 { return s.Dropped })
	c("vllm_sim_kv_batches_queue_full_total", "KV-event batches lost because the publisher queue was full (no seq consumed).", func(s pubStats) uint64 { return s.QueueFull })
	c("vllm_sim_kv_encode_errors_total", "KV-event batches that failed to encode.", func(s pubStats) uint64 { return s.EncodeErrors })
	c("vllm_sim_kv_replay_requests_total", "Replay requests served.", func(s pubStats) uint64 { return s.Replays })
}
