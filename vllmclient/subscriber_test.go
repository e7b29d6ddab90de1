package vllmclient

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevent"
	zmq "github.com/pebbe/zmq4"
)

func testBatch(topic string, seq uint64) kvevent.Batch {
	rank := int64(0)
	return kvevent.Batch{
		Topic: topic, Seq: seq, TS: 1700000000 + float64(seq), DPRank: &rank,
		Events: []kvevent.Event{{
			Kind: kvevent.BlockStored, Tag: "BlockStored",
			BlockHashes: []uint64{1000 + seq}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4,
		}},
	}
}

func frames(t testing.TB, b kvevent.Batch, enc kvevent.Encoding) [][]byte {
	t.Helper()
	f, err := kvevent.EncodeFrames(b, enc)
	if err != nil {
		t.Fatalf("EncodeFrames: %v", err)
	}
	return f
}

func send(t testing.TB, s *zmq.Socket, parts [][]byte) {
	t.Helper()
	args := make([]any, len(parts))
	for i, p := range parts {
		args[i] = p
	}
	if _, err := s.SendMessage(args...); err != nil {
		t.Errorf("send: %v", err)
	}
}

func bound(t testing.TB, zctx *zmq.Context, typ zmq.Type) (*zmq.Socket, string) {
	t.Helper()
	s, err := zctx.NewSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(0)
	s.SetSndhwm(100_000)
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	return s, ep
}

// next returns the subscriber's next item, failing after a deadline.
func next(t *testing.T, sub *Subscriber, d time.Duration) Item {
	t.Helper()
	select {
	case it, ok := <-sub.Items():
		if !ok {
			t.Fatalf("items closed early: %v", sub.Err())
		}
		return it
	case <-time.After(d):
		t.Fatalf("no item within %v; stats %+v", d, sub.Stats())
	}
	return Item{}
}

// stop cancels the subscriber, waits (bounded) for Items to close and
// returns the items still queued.
func stop(t *testing.T, cancel context.CancelFunc, sub *Subscriber) []Item {
	t.Helper()
	cancel()
	deadline := time.After(5 * time.Second)
	var rest []Item
	for {
		select {
		case it, ok := <-sub.Items():
			if !ok {
				if err := sub.Err(); err != nil {
					t.Errorf("subscriber error: %v", err)
				}
				return rest
			}
			rest = append(rest, it)
		case <-deadline:
			t.Fatal("subscriber did not stop")
			return nil
		}
	}
}

// replayer is a fake vLLM publisher: one goroutine owns a PUB and a ROUTER,
// publishes batches 0..n-1 (skipping drop on the live socket but keeping
// every batch for replay) and serves replay requests in vLLM's format.
type replayer struct {
	pub, router  *zmq.Socket
	pubEP, repEP string
	topic        string
	enc          kvevent.Encoding
	newForm      bool // replies carry the topic (vllm#45177)
	buffer       [][]byte
	requests     []uint64
}

// serve publishes one batch per millisecond until ctx is done.
func (r *replayer) serve(ctx context.Context, t *testing.T, drop map[uint64]bool) {
	poller := zmq.NewPoller()
	poller.Add(r.router, zmq.POLLIN)
	var seq uint64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			f := frames(t, testBatch(r.topic, seq), r.enc)
			r.buffer = append(r.buffer, f[2])
			if !drop[seq] {
				send(t, r.pub, f)
			}
			seq++
		default:
		}
		polled, err := poller.Poll(time.Millisecond)
		if err != nil {
			return
		}
		if len(polled) == 0 {
			continue
		}
		req, err := r.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil || len(req) != 3 || len(req[2]) != 8 {
			continue
		}
		from := binary.BigEndian.Uint64(req[2])
		r.requests = append(r.requests, from)
		for s := from; s < uint64(len(r.buffer)); s++ {
			seq8 := binary.BigEndian.AppendUint64(nil, s)
			if r.newForm {
				send(t, r.router, [][]byte{req[0], {}, []byte(r.topic), seq8, r.buffer[s]})
			} else {
				send(t, r.router, [][]byte{req[0], {}, seq8, r.buffer[s]})
			}
		}
		end := binary.BigEndian.AppendUint64(nil, endSeq)
		if r.newForm {
			send(t, r.router, [][]byte{req[0], {}, {}, end, {}})
		} else {
			send(t, r.router, [][]byte{req[0], {}, end, {}})
		}
	}
}

func TestSubscriberReplayRepairsDrops(t *testing.T) {
	for _, tc := range []struct {
		name    string
		enc     kvevent.Encoding
		newForm bool
	}{
		{"array encoding, replies without topic", kvevent.ArrayEncoding, false},
		{"map encoding, replies with topic", kvevent.MapEncoding, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			zctx, err := zmq.NewContext()
			if err != nil {
				t.Fatal(err)
			}
			defer zctx.Term()
			r := &replayer{topic: "kv@pod@m", enc: tc.enc, newForm: tc.newForm}
			r.pub, r.pubEP = bound(t, zctx, zmq.PUB)
			r.router, r.repEP = bound(t, zctx, zmq.ROUTER)

			cfg := LocalConfig()
			cfg.Endpoint, cfg.ReplayEndpoint, cfg.Topic = r.pubEP, r.repEP, r.topic
			cfg.ReplayTimeout = 5 * time.Second // a loaded CI box must not turn replays into gaps
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			sub, err := Subscribe(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}

			const n = 200
			drop := map[uint64]bool{0: true, 5: true, 6: true, 7: true, 50: true, 120: true, 121: true}
			pctx, pcancel := context.WithCancel(context.Background())
			pdone := make(chan struct{})
			go func() {
				defer close(pdone)
				defer r.pub.Close()
				defer r.router.Close()
				r.serve(pctx, t, drop)
			}()

			replayed := 0
			for want := uint64(0); want < n; want++ {
				it := next(t, sub, 10*time.Second)
				if it.Kind != KindBatch {
					t.Fatalf("item %+v; want batch seq %d", it, want)
				}
				if it.Batch.Seq != want || it.Batch.Topic != r.topic || it.Batch.TS != 1700000000+float64(want) {
					t.Fatalf("batch seq %d topic %q ts %v; want seq %d", it.Batch.Seq, it.Batch.Topic, it.Batch.TS, want)
				}
				if it.Replayed {
					replayed++
				}
				if drop[want] && !it.Replayed {
					t.Errorf("seq %d was dropped live but not delivered as replayed", want)
				}
			}
			pcancel()
			<-pdone
			st := sub.Stats()
			for i, it := range stop(t, cancel, sub) {
				if it.Kind != KindBatch || it.Batch.Seq != n+uint64(i) {
					t.Errorf("item %+v after seq %d; want seq %d", it, n-1, n+uint64(i))
				}
			}
			if st.Gaps != 0 || st.Restarts != 0 || st.Dropped != 0 || st.DecodeErrors != 0 {
				t.Errorf("stats %+v; want no gaps, restarts, drops or decode errors", st)
			}
			if st.Replays < 2 || len(r.requests) < 2 || r.requests[0] != 0 {
				t.Errorf("replay requests %v (stats %+v); want start-up replay from 0 and gap replays", r.requests, st)
			}
			t.Logf("replayed %d of %d; requests %v; stats %+v", replayed, n, r.requests, st)
		})
	}
}

// TestSubscriberGapAndRestart runs without replay: a PUB that skips seqs and
// then starts again at 0 (as a restarted vLLM does) must produce Gap and
// Restart items around the batches. The SUB binds, as for a vLLM that
// connects out.
func TestSubscriberGapAndRestart(t *testing.T) {
	cfg := LocalConfig()
	cfg.Endpoint, cfg.Bind = "tcp://127.0.0.1:*", true
	sub, pub, cancel := subWithPub(t, cfg)

	warmUp(t, pub, sub)
	for _, s := range []uint64{10, 11, 14, 15, 0, 1} {
		send(t, pub, frames(t, testBatch("t", s), kvevent.MapEncoding))
	}
	send(t, pub, [][]byte{[]byte("t"), {1, 2}, {0x90}})                                // no seq
	send(t, pub, [][]byte{[]byte("t"), binary.BigEndian.AppendUint64(nil, 2), {0xc1}}) // bad payload

	var got []string
	for len(got) < 10 {
		it := next(t, sub, 5*time.Second)
		if it.Stream.Topic == "warm" {
			continue
		}
		switch it.Kind {
		case KindBatch:
			got = append(got, fmt.Sprintf("b %d", it.Batch.Seq))
		case KindGap:
			got = append(got, fmt.Sprintf("gap %d %d", it.Expected, it.Got))
		case KindRestart:
			got = append(got, fmt.Sprintf("restart %d", it.Seq))
		case KindDecodeError:
			got = append(got, fmt.Sprintf("err %d %v", it.Seq, errors.Is(it.Err, ErrFrames)))
		}
	}
	want := []string{"b 10", "b 11", "gap 12 14", "b 14", "b 15", "restart 0", "b 0", "b 1", "err 0 true", "err 2 false"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("items %q; want %q", got, want)
	}
	stop(t, cancel, sub)
	st := sub.Stats()
	if st.Gaps != 1 || st.Restarts != 1 || st.DecodeErrors != 2 {
		t.Errorf("stats %+v; want 1 gap, 1 restart, 2 decode errors", st)
	}
}

// subWithPub starts a Subscriber on cfg (which binds) and a PUB connected
// to it; the test's cleanup closes the PUB and its context, and cancels.
func subWithPub(t *testing.T, cfg Config) (*Subscriber, *zmq.Socket, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sub, err := Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { zctx.Term() })
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() }) // before Term: cleanups run last-in first
	pub.SetLinger(0)
	if err := pub.Connect(sub.Endpoints()[0]); err != nil {
		t.Fatal(err)
	}
	return sub, pub, cancel
}

// warmUp beats the slow-joiner problem: it publishes on topic "warm" until
// the subscriber receives, then drains every warm-up item so the hand-off
// channel is empty.
func warmUp(t *testing.T, pub *zmq.Socket, sub *Subscriber) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var i uint64 // consecutive seqs, so warm-up adds no Gap
	for ; sub.Stats().Received == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatal("subscriber never connected")
		}
		send(t, pub, frames(t, testBatch("warm", i), kvevent.ArrayEncoding))
		select {
		case it := <-sub.Items():
			_ = it // counted in Stats; drained below
		case <-time.After(10 * time.Millisecond):
		}
	}
	marker := i
	send(t, pub, frames(t, testBatch("warm", marker), kvevent.ArrayEncoding))
	for {
		it := next(t, sub, 5*time.Second)
		if it.Stream.Topic != "warm" {
			t.Fatalf("unexpected item during warm-up: %+v", it)
		}
		if it.Kind == KindBatch && it.Batch.Seq == marker {
			return
		}
	}
}

// TestSubscriberHandoffDrops fills the hand-off channel: the socket loop
// must drop (not block) and tell the consumer with a Gap before the next
// batch it manages to deliver.
func TestSubscriberHandoffDrops(t *testing.T) {
	cfg := LocalConfig()
	cfg.Endpoint, cfg.Bind, cfg.HandoffDepth = "tcp://127.0.0.1:*", true, 2
	sub, pub, cancel := subWithPub(t, cfg)
	warmUp(t, pub, sub)
	base := sub.Stats().Received
	for s := uint64(0); s < 10; s++ {
		send(t, pub, frames(t, testBatch("t", s), kvevent.ArrayEncoding))
	}
	for deadline := time.Now().Add(5 * time.Second); sub.Stats().Received < base+10; {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v; want 10 more received", sub.Stats())
		}
		time.Sleep(time.Millisecond) // polling a counter under a deadline
	}
	var got []string
	for len(got) < 4 {
		if len(got) == 2 { // channel drained: now the next batch fits, after its Gap
			send(t, pub, frames(t, testBatch("t", 10), kvevent.ArrayEncoding))
		}
		it := next(t, sub, 5*time.Second)
		switch it.Kind {
		case KindBatch:
			got = append(got, fmt.Sprintf("b %d", it.Batch.Seq))
		case KindGap:
			got = append(got, fmt.Sprintf("gap %d %d", it.Expected, it.Got))
		default:
			got = append(got, it.Kind.String())
		}
	}
	if want := "[b 0 b 1 gap 2 10 b 10]"; fmt.Sprint(got) != want {
		t.Errorf("items %v; want %s", got, want)
	}
	stop(t, cancel, sub)
	if st := sub.Stats(); st.Dropped != 8 || st.Gaps != 1 {
		t.Errorf("stats %+v; want 8 dropped, 1 gap", st)
	}
}

func TestSubscribeErrors(t *testing.T) {
	c := LocalConfig()
	c.Endpoint = "tcp://127.0.0.1:*"
	c.Bind = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := Subscribe(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, cancel, first)

	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"empty endpoint", func(c *Config) { c.Endpoint = "" }},
		{"no ranks", func(c *Config) { c.DPRanks = 0 }},
		{"port in use", func(c *Config) { c.Endpoint, c.Bind = first.Endpoints()[0], true }},
		{"bad scheme for ranks", func(c *Config) { c.Endpoint, c.DPRanks = "udp://x:1", 2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := LocalConfig()
			tt.mod(&cfg)
			if s, err := Subscribe(context.Background(), cfg); err == nil {
				t.Errorf("Subscribe(%+v) = %v, nil; want error", cfg, s)
			}
		})
	}
}

func TestRankEndpoint(t *testing.T) {
	tests := []struct {
		ep      string
		rank    int
		want    string
		wantErr bool
	}{
		{"tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557", false},
		{"tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560", false},
		{"tcp://*:5557", 1, "tcp://*:5558", false},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", false},
		{"ipc:///run/kv/events", 2, "ipc:///run/kv/events_dp2", false},
		{"inproc://kv", 1, "inproc://kv_dp1", false},
		{"tcp://127.0.0.1:*", 1, "", true},
		{"tcp://127.0.0.1:65535", 1, "", true},
		{"127.0.0.1:5557", 1, "", true},
	}
	for _, tt := range tests {
		got, err := RankEndpoint(tt.ep, tt.rank)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("RankEndpoint(%q, %d) = %q, %v; want %q (error %v)", tt.ep, tt.rank, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseReply(t *testing.T) {
	seq := func(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }
	payload := frames(t, testBatch("x", 0), kvevent.ArrayEncoding)[2]
	tests := []struct {
		name           string
		frames         [][]byte
		topic          string
		seq            uint64
		topicSent, end bool
		err, bad       bool
	}{
		{name: "old form", frames: [][]byte{{}, seq(4), payload}, seq: 4},
		{name: "new form", frames: [][]byte{{}, []byte("kv"), seq(4), payload}, topic: "kv", seq: 4, topicSent: true},
		{name: "old end", frames: [][]byte{{}, seq(endSeq), {}}, end: true},
		{name: "new end", frames: [][]byte{{}, {}, seq(endSeq), {}}, topicSent: true, end: true},
		{name: "empty payload ends", frames: [][]byte{{}, seq(9), {}}, end: true},
		{name: "no delimiter", frames: [][]byte{seq(1), payload, {}}, err: true},
		{name: "short seq", frames: [][]byte{{}, {1}, payload}, err: true},
		{name: "too many frames", frames: [][]byte{{}, {}, {}, {}, {}}, err: true},
		{name: "bad payload keeps seq", frames: [][]byte{{}, seq(3), {0xc1}}, seq: 3, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, topicSent, end, err := parseReply(tt.frames)
			if (err != nil) != tt.err {
				t.Fatalf("parseReply err = %v; want error %v", err, tt.err)
			}
			if err != nil {
				return
			}
			if m.topic != tt.topic || m.seq != tt.seq || topicSent != tt.topicSent || end != tt.end || (m.err != nil) != tt.bad {
				t.Errorf("parseReply = %q %d sent=%v end=%v err=%v", m.topic, m.seq, topicSent, end, m.err)
			}
		})
	}
}

func FuzzParseFrames(f *testing.F) {
	p := frames(f, testBatch("kv", 7), kvevent.MapEncoding)
	f.Add([]byte("kv"), p[1], p[2], true)
	f.Add([]byte{}, p[1], []byte{0x93, 0xcb}, false)
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte, live bool) {
		if live {
			if m, err := parseLive([][]byte{topic, seq, payload}); err == nil && m.err == nil && m.batch.Seq != m.seq {
				t.Errorf("parseLive seq %d but batch seq %d", m.seq, m.batch.Seq)
			}
			return
		}
		parseReply([][]byte{{}, topic, seq, payload})
		parseReply([][]byte{{}, seq, payload})
	})
}

// TestSubscriberDPRanks binds one SUB per rank on port+r and checks that
// each publisher's batches carry its rank.
func TestSubscriberDPRanks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sub *Subscriber
	for attempt := 0; sub == nil; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cfg := LocalConfig()
		cfg.Endpoint, cfg.Bind, cfg.DPRanks = fmt.Sprintf("tcp://127.0.0.1:%d", port), true, 2
		if sub, err = Subscribe(ctx, cfg); err != nil && attempt == 5 {
			t.Fatalf("Subscribe: %v", err)
		}
	}
	eps := sub.Endpoints()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	pubs := make([]*zmq.Socket, len(eps))
	for r, ep := range eps {
		if pubs[r], err = zctx.NewSocket(zmq.PUB); err != nil {
			t.Fatal(err)
		}
		defer pubs[r].Close()
		pubs[r].SetLinger(0)
		if err := pubs[r].Connect(ep); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int]bool{}
	deadline := time.After(5 * time.Second)
	for seq := uint64(0); len(seen) < 2; seq++ {
		for r, pub := range pubs {
			send(t, pub, frames(t, testBatch(fmt.Sprintf("r%d", r), seq), kvevent.ArrayEncoding))
		}
		select {
		case it := <-sub.Items():
			if it.Kind == KindBatch && it.Stream.Topic == fmt.Sprintf("r%d", it.Stream.Rank) {
				seen[it.Stream.Rank] = true
			} else if it.Kind == KindBatch {
				t.Fatalf("batch of topic %q on rank %d", it.Stream.Topic, it.Stream.Rank)
			}
		case <-deadline:
			t.Fatalf("ranks seen %v; want both", seen)
		case <-time.After(5 * time.Millisecond):
		}
	}
	stop(t, cancel, sub)
}

// TestSubscriberWakesOnSignal: with a poll interval far beyond the test's
// deadlines, messages arrive only if the subscriber wakes on the socket's
// signal (fdWait on Go's netpoller), not on its timeout.
func TestSubscriberWakesOnSignal(t *testing.T) {
	cfg := LocalConfig()
	cfg.PollInterval = time.Hour
	cfg.Endpoint, cfg.Bind = "tcp://127.0.0.1:*", true
	sub, pub, cancel := subWithPub(t, cfg)
	warmUp(t, pub, sub)
	for s := range uint64(20) {
		send(t, pub, frames(t, testBatch("t", s), kvevent.MapEncoding))
		if it := next(t, sub, 5*time.Second); it.Kind != KindBatch && it.Kind != KindRestart {
			t.Fatalf("batch %d: got %+v", s, it)
		}
	}
	// Stopping must not wait for the hour either: run checks ctx between waits,
	// and closing the context's sockets ends the wait.
	done := make(chan struct{})
	go func() { stop(t, cancel, sub); close(done) }() // ends with the subscriber
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber did not stop within 10s")
	}
}

func TestFDWaitTimesOut(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	s, _ := bound(t, zctx, zmq.SUB)
	defer s.Close()
	w, err := newFDWait(s)
	if err != nil {
		t.Fatalf("newFDWait: %v", err)
	}
	defer w.close()
	s.GetEvents() // consume the initial signal
	start := time.Now()
	if err := w.wait(context.Background(), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Errorf("wait returned after %v with nothing to read; want ~50ms", el)
	}
}

// TestSubscriberDPRestartOnce: the ranks of one vLLM restart together, so
// a restart seen on rank 0 is not reported again when rank 1 next
// publishes from seq 0 (which would clear what rank 0 stored since).
func TestSubscriberDPRestartOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sub *Subscriber
	for attempt := 0; sub == nil; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cfg := LocalConfig()
		cfg.Endpoint, cfg.Bind, cfg.DPRanks = fmt.Sprintf("tcp://127.0.0.1:%d", port), true, 2
		if sub, err = Subscribe(ctx, cfg); err != nil && attempt == 5 {
			t.Fatalf("Subscribe: %v", err)
		}
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	var pubs []*zmq.Socket
	for _, ep := range sub.Endpoints() {
		pub, err := zctx.NewSocket(zmq.PUB)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		pub.SetLinger(0)
		if err := pub.Connect(ep); err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, pub)
	}
	// Both ranks connected and numbering: consecutive seqs until each rank
	// delivered one (a slow joiner's first seq is a stream's start).
	seen := map[int]bool{}
	deadline := time.After(5 * time.Second)
	seq := uint64(5)
	for ; len(seen) < 2; seq++ {
		for _, pub := range pubs {
			send(t, pub, frames(t, testBatch("kv", seq), kvevent.ArrayEncoding))
		}
		select {
		case it := <-sub.Items():
			if it.Kind != KindBatch {
				t.Fatalf("warm-up: %+v", it)
			}
			seen[it.Stream.Rank] = true
		case <-deadline:
			t.Fatalf("ranks seen %v; want both", seen)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The engine restarts: rank 0 publishes first.
	send(t, pubs[0], frames(t, testBatch("kv", 0), kvevent.ArrayEncoding))
	waitItem := func(rank int) Item {
		for {
			it := next(t, sub, 5*time.Second)
			if it.Stream.Rank == rank && it.Kind != KindBatch || it.Stream.Rank == rank && it.Batch.Seq < 5 {
				return it
			}
		}
	}
	if it := waitItem(0); it.Kind != KindRestart {
		t.Fatalf("rank 0 after its seq went back: %+v; want a restart", it)
	}
	send(t, pubs[1], frames(t, testBatch("kv", 0), kvevent.ArrayEncoding))
	if it := waitItem(1); it.Kind != KindBatch || it.Batch.Seq != 0 {
		t.Errorf("rank 1's seq 0 after rank 0's restart: %+v; want batch 0, no second restart", it)
	}
	if n := sub.Stats().Restarts; n != 1 {
		t.Errorf("Stats().Restarts = %d; want 1", n)
	}
	stop(t, cancel, sub)
}
