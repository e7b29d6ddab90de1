package main

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/kvevent"
)

func TestBindsPub(t *testing.T) {
	tests := []struct {
		endpoint string
		want     bool
	}{
		{"tcp://*:5557", true},
		{"tcp://127.0.0.1:*", true},
		{"tcp://[::]:5557", true},
		{"ipc:///tmp/kv.sock", true},
		{"inproc://kv", true},
		{"tcp://127.0.0.1:5557", false},
		{"tcp://indexer:5557", false},
	}
	for _, tt := range tests {
		if got := bindsPub(tt.endpoint); got != tt.want {
			t.Errorf("bindsPub(%q) = %v; want %v", tt.endpoint, got, tt.want)
		}
	}
}

// testPublisher starts a publisher that is stopped when the test ends.
func testPublisher(t *testing.T, cfg pubConfig) *publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := startPublisher(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("startPublisher: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := p.Wait(); err != nil {
			t.Errorf("publisher exit: %v", err)
		}
	})
	return p
}

func localPubConfig() pubConfig {
	c := defaultPubConfig()
	c.Endpoint = "tcp://127.0.0.1:*"
	c.ReplayEndpoint = "tcp://127.0.0.1:*"
	c.Topic = "kv@test"
	c.ReplayPoll = time.Millisecond
	return c
}

// batchEvents makes a recognisable one-event batch: hash i.
func batchEvents(i uint64) []kvevent.Event {
	return []kvevent.Event{{Kind: kvevent.BlockStored, BlockHashes: []uint64{i}, TokenIDs: make([]uint32, 16), BlockSize: 16}}
}

type frame struct {
	topic string
	seq   uint64
	hash  uint64 // the first event's first hash
}

func decodeLive(t *testing.T, msg [][]byte) frame {
	t.Helper()
	b, err := kvevent.DecodeFrames(msg)
	if err != nil {
		t.Fatalf("DecodeFrames: %v", err)
	}
	if len(b.Events) == 0 || len(b.Events[0].BlockHashes) == 0 {
		t.Fatalf("batch seq %d has no hash: %+v", b.Seq, b)
	}
	return frame{topic: b.Topic, seq: b.Seq, hash: b.Events[0].BlockHashes[0]}
}

type sub struct {
	ctx *zmq.Context
	s   *zmq.Socket
}

func newSub(t *testing.T) *sub {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(0)
	s.SetRcvtimeo(50 * time.Millisecond)
	s.SetSubscribe("")
	t.Cleanup(func() { s.Close(); zctx.Term() })
	return &sub{ctx: zctx, s: s}
}

// recv returns the next live message, or false at the deadline.
func (s *sub) recv(t *testing.T, deadline time.Time) ([][]byte, bool) {
	for time.Now().Before(deadline) {
		msg, err := s.s.RecvMessageBytes(0)
		if err == nil {
			return msg, true
		}
	}
	return nil, false
}

// join works around the PUB/SUB slow joiner: it publishes probe batches
// (hash 1<<40 + n) until one arrives, and returns the next seq to expect.
func join(t *testing.T, p *publisher, s *sub) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := uint64(0); time.Now().Before(deadline); n++ {
		p.Sink(1, batchEvents(1<<40+n))
		msg, ok := s.recv(t, time.Now().Add(50*time.Millisecond))
		if !ok {
			continue
		}
		f := decodeLive(t, msg)
		// Drain probes already in flight so the caller starts clean.
		if err := p.flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		last := f.seq
		for {
			msg, ok := s.recv(t, time.Now().Add(100*time.Millisecond))
			if !ok {
				return last + 1
			}
			last = decodeLive(t, msg).seq
		}
	}
	t.Fatal("subscriber never joined")
	return 0
}

func TestPublisherLiveFrames(t *testing.T) {
	for _, mode := range []string{"bind", "connect"} {
		t.Run(mode, func(t *testing.T) {
			cfg := localPubConfig()
			s := newSub(t)
			if mode == "connect" {
				// The subscriber binds and the publisher dials it (vLLM's
				// connect mode: no '*', '::', ipc or inproc).
				if err := s.s.Bind("tcp://127.0.0.1:*"); err != nil {
					t.Fatal(err)
				}
				ep, _ := s.s.GetLastEndpoint()
				cfg.Endpoint = ep
			}
			p := testPublisher(t, cfg)
			if mode == "bind" {
				ep, _ := p.Endpoints()
				if err := s.s.Connect(ep); err != nil {
					t.Fatal(err)
				}
			}
			next := join(t, p, s)
			for i := uint64(0); i < 5; i++ {
				p.Sink(2, batchEvents(100+i))
			}
			for i := uint64(0); i < 5; i++ {
				msg, ok := s.recv(t, time.Now().Add(5*time.Second))
				if !ok {
					t.Fatalf("batch %d not received", i)
				}
				if len(msg) != 3 || len(msg[1]) != 8 {
					t.Fatalf("frames = %d, seq frame %d bytes; want 3 frames, 8-byte seq", len(msg), len(msg[1]))
				}
				got := decodeLive(t, msg)
				want := frame{topic: "kv@test", seq: next + i, hash: 100 + i}
				if got != want {
					t.Errorf("message %d = %+v; want %+v", i, got, want)
				}
			}
		})
	}
}

type dealer struct {
	ctx *zmq.Context
	s   *zmq.Socket
}

func newDealer(t *testing.T, endpoint string) *dealer {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(0)
	s.SetRcvtimeo(5 * time.Second)
	if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); zctx.Term() })
	return &dealer{ctx: zctx, s: s}
}

// replay asks for every batch from start and returns them, checking the
// v0.26 framing and the end marker.
func (d *dealer) replay(t *testing.T, start uint64) []frame {
	t.Helper()
	if _, err := d.s.SendMessage("", seqBytes(start)); err != nil {
		t.Fatal(err)
	}
	var out []frame
	for {
		msg, err := d.s.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay from %d: %v after %d batches", start, err, len(out))
		}
		if len(msg) != 4 || len(msg[0]) != 0 {
			t.Fatalf("replay frames = %q; want [\"\", topic, seq, payload]", msg)
		}
		if string(msg[1]) == "" && binary.BigEndian.Uint64(msg[2]) == ^uint64(0) && len(msg[3]) == 0 {
			return out
		}
		out = append(out, decodeLive(t, msg[1:]))
	}
}

func seqs(fs []frame) []uint64 {
	out := make([]uint64, len(fs))
	for i, f := range fs {
		out[i] = f.seq
	}
	return out
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReplayRangeAndEndMarker(t *testing.T) {
	cfg := localPubConfig()
	cfg.Endpoint = "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	cfg.BufferSteps = 4
	p := testPublisher(t, cfg)
	for i := uint64(0); i < 6; i++ {
		p.Sink(1, batchEvents(100+i))
	}
	if err := p.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, ep := p.Endpoints()
	d := newDealer(t, ep)
	// A malformed request (no start seq) is ignored, as vLLM does.
	if _, err := d.s.SendMessage(""); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		start uint64
		want  []uint64
	}{
		{4, []uint64{4, 5}},
		{0, []uint64{2, 3, 4, 5}}, // older than the buffer: starts at the oldest
		{5, []uint64{5}},
		{6, nil},
	}
	for _, tt := range tests {
		got := d.replay(t, tt.start)
		if !equalSeqs(seqs(got), tt.want) {
			t.Errorf("replay(%d) seqs = %v; want %v", tt.start, seqs(got), tt.want)
		}
		for _, f := range got {
			if f.hash != 100+f.seq || f.topic != cfg.Topic {
				t.Errorf("replay(%d): seq %d carries hash %d topic %q; want %d %q", tt.start, f.seq, f.hash, f.topic, 100+f.seq, cfg.Topic)
			}
		}
	}
}

func TestDropInjectionGapsFilledByReplay(t *testing.T) {
	p := testPublisher(t, localPubConfig())
	s := newSub(t)
	ep, replayEP := p.Endpoints()
	if err := s.s.Connect(ep); err != nil {
		t.Fatal(err)
	}
	first := join(t, p, s)
	if err := p.SetDropRate(0.5); err != nil {
		t.Fatal(err)
	}
	before := p.Stats()
	const n = 40
	for i := uint64(0); i < n; i++ {
		p.Sink(1, batchEvents(1000+i))
	}
	if err := p.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := p.Stats()
	sent, dropped := after.Sent-before.Sent, after.Dropped-before.Dropped
	if sent+dropped != n || dropped == 0 || sent == 0 {
		t.Fatalf("sent %d dropped %d of %d; want both > 0, summing to %d", sent, dropped, n, n)
	}
	live := map[uint64]bool{}
	for len(live) < int(sent) {
		msg, ok := s.recv(t, time.Now().Add(5*time.Second))
		if !ok {
			t.Fatalf("received %d live batches; want %d", len(live), sent)
		}
		live[decodeLive(t, msg).seq] = true
	}
	replayed := newDealer(t, replayEP).replay(t, first)
	if len(replayed) != n {
		t.Fatalf("replay from %d returned %d batches; want %d", first, len(replayed), n)
	}
	for i, f := range replayed {
		if f.seq != first+uint64(i) || f.hash != 1000+uint64(i) {
			t.Errorf("replayed[%d] = seq %d hash %d; want seq %d hash %d", i, f.seq, f.hash, first+uint64(i), 1000+i)
		}
		live[f.seq] = true
	}
	if len(live) != n {
		t.Errorf("live ∪ replay covers %d seqs; want %d", len(live), n)
	}
}

func TestRestartResetsSeqAndBuffer(t *testing.T) {
	p := testPublisher(t, localPubConfig())
	s := newSub(t)
	ep, replayEP := p.Endpoints()
	if err := s.s.Connect(ep); err != nil {
		t.Fatal(err)
	}
	next := join(t, p, s)
	if next == 0 {
		t.Fatal("join consumed no seq")
	}
	ctx := context.Background()
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	p.Sink(1, batchEvents(7))
	msg, ok := s.recv(t, time.Now().Add(5*time.Second))
	if !ok {
		t.Fatal("no batch after restart")
	}
	if got := decodeLive(t, msg); got.seq != 0 || got.hash != 7 {
		t.Errorf("first batch after restart = %+v; want seq 0 hash 7", got)
	}
	if err := p.flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := newDealer(t, replayEP).replay(t, 0)
	if len(got) != 1 || got[0].seq != 0 || got[0].hash != 7 {
		t.Errorf("replay(0) after restart = %+v; want only seq 0 hash 7", got)
	}
}

func TestSinkQueueFullDropsWithoutBlocking(t *testing.T) {
	// No run goroutine: the queue is never drained.
	p := &publisher{cfg: defaultPubConfig(), q: make(chan pubItem, 1)}
	p.Sink(1, batchEvents(1))
	p.Sink(1, batchEvents(2))
	p.Sink(1, nil) // empty steps publish nothing
	if got := p.Stats().QueueFull; got != 1 {
		t.Errorf("QueueFull = %d; want 1", got)
	}
	if len(p.q) != 1 {
		t.Errorf("queued %d; want 1", len(p.q))
	}
}

func TestSetDropRateRejectsOutOfRange(t *testing.T) {
	p := &publisher{}
	for _, r := range []float64{-0.1, 1.1} {
		if err := p.SetDropRate(r); err == nil {
			t.Errorf("SetDropRate(%v) = nil; want error", r)
		}
	}
	if err := p.SetDropRate(0.25); err != nil || p.DropRate() != 0.25 {
		t.Errorf("SetDropRate(0.25) = %v, DropRate() = %v; want nil, 0.25", err, p.DropRate())
	}
}
