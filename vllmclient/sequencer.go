package vllmclient

import (
	"strings"

	"github.com/kvroute/kvroute/kvevent"
)

// msg is one received message after frame parsing. err is set when the
// frames carried a seq but the payload did not decode.
type msg struct {
	topic string
	seq   uint64
	batch kvevent.Batch
	err   error
}

// sequencer orders one rank's messages into Items. It is pure: the socket
// loop feeds it what arrived (live, replayed, replay finished or failed)
// and carries out the step it returns. It never blocks, reads a clock or
// touches a socket, so every ordering rule is a table test.
//
// Rules, per stream (topic on this rank):
//   - seq == next: deliver.
//   - seq > next: with replay, hold live batches and ask for a replay from
//     next; without, deliver Gap{next, seq} then the batch.
//   - seq < next: deliver Restart{seq} then treat the stream as new (no
//     Restart when expectRestart said another rank reported it).
//   - A new stream starts at its first seq; with replay on, a first seq
//     above 0 asks for a replay from 0 (the start-up recipe, §1.4).
//
// While a replay runs, replayed batches are delivered in order with
// duplicates dropped and holes reported as Gaps; when it ends (or fails,
// or the hold overflows) the held live batches are released through the
// same rules, asking for another replay only if this one made progress
// (a batch lost while it ran). Replayed seqs stay in a
// window until a live seq at or past next arrives, so a live copy that was
// still queued in the SUB socket is dropped as a duplicate instead of
// being mistaken for a restart (a copy whose ts differs is a restart).
type sequencer struct {
	rank    int
	topic   string // prefix filter, and the topic of replies without one
	replay  bool
	holdMax int
	streams map[string]*seqState
	rp      *replayRun
	held    []msg
}

type seqState struct {
	next uint64
	// quiet makes the next backwards seq a silent new start instead of a
	// Restart: another rank of the same vLLM already reported it.
	quiet  bool
	window map[uint64]float64 // replayed seq → batch ts; nil when empty
}

type replayRun struct {
	topic    string // stream being repaired (sq.topic at start-up)
	startup  bool   // holds every live message, not only topic's
	from     uint64
	progress bool // delivered at least one replayed batch
}

// step is what the loop must do after one input: deliver items in order,
// then send a replay request or abandon the running replay.
type step struct {
	items      []Item
	replay     bool // send a replay request from replayFrom
	replayFrom uint64
	abort      bool // the replay was abandoned: discard its socket
	dups       int  // messages dropped as already delivered
}

// errorNoTS marks a window entry whose replayed payload did not decode.
const errorNoTS = -1

func newSequencer(rank int, topic string, replay bool, holdMax int) *sequencer {
	return &sequencer{
		rank:    rank,
		topic:   topic,
		replay:  replay,
		holdMax: holdMax,
		streams: make(map[string]*seqState),
	}
}

// start begins the start-up replay from seq 0 when replay is on.
func (sq *sequencer) start() step {
	if !sq.replay || sq.rp != nil {
		return step{}
	}
	sq.rp = &replayRun{topic: sq.topic, startup: true}
	return step{replay: true}
}

// expectRestart is told that another data-parallel rank of this vLLM
// restarted, which they do together: this rank's next seq that goes
// backwards starts its stream afresh without a Restart item (that restart
// is already reported). Batches numbered on, which the old engine sent
// before it stopped, are delivered as usual until then.
func (sq *sequencer) expectRestart() {
	for _, st := range sq.streams {
		st.quiet = true
	}
}

// replaying reports whether a replay is in flight.
func (sq *sequencer) replaying() bool { return sq.rp != nil }

// live handles a message from the SUB socket.
func (sq *sequencer) live(m msg) step {
	var s step
	sq.onLive(&s, m, true)
	return s
}

// replayed handles a replayed message. topicSent is false for replies
// from vLLM <= v0.25, which name no topic.
func (sq *sequencer) replayed(m msg, topicSent bool) step {
	var s step
	rp := sq.rp
	if rp == nil {
		s.dups++ // a late reply to an abandoned replay
		return s
	}
	if !topicSent {
		m.topic = rp.topic
	}
	if (!rp.startup && m.topic != rp.topic) || !strings.HasPrefix(m.topic, sq.topic) {
		return s // another publisher's or filtered-out topic
	}
	st, ok := sq.streams[m.topic]
	if !ok {
		st = &seqState{next: rp.from}
		sq.streams[m.topic] = st
	}
	if m.seq < st.next {
		s.dups++
		return s
	}
	if m.seq > st.next {
		s.items = append(s.items, gapItem(sq.stream(m.topic), st.next, m.seq))
	}
	s.items = append(s.items, sq.item(m, true))
	rp.progress = true
	st.next = m.seq + 1
	if st.window == nil {
		st.window = make(map[uint64]float64)
	}
	ts := m.batch.TS
	if m.err != nil {
		ts = errorNoTS
	}
	st.window[m.seq] = ts
	return s
}

// replayDone handles the end marker, and replayFailed a timeout or socket
// error; both release the held live batches. After a replay that delivered
// something, a hole among the held batches (a batch lost while the replay
// ran) may be replayed again: each new replay needs progress, so this ends.
// So may one after the start-up replay, which asks as the subscriber
// starts: answered empty by a publisher that had sent nothing yet, it says
// nothing of a first batch lost a moment later (as a SUB that connects
// late loses it), and the one replay after it is a plain one.
func (sq *sequencer) replayDone() step {
	var s step
	sq.finish(&s, sq.rp != nil && (sq.rp.progress || sq.rp.startup))
	return s
}

func (sq *sequencer) replayFailed() step {
	var s step
	sq.finish(&s, false)
	s.abort = true
	return s
}

func (sq *sequencer) finish(s *step, mayReplay bool) {
	if sq.rp == nil {
		return
	}
	sq.rp = nil
	held := sq.held
	sq.held = nil
	for _, m := range held {
		sq.onLive(s, m, mayReplay)
	}
}

func (sq *sequencer) onLive(s *step, m msg, mayReplay bool) {
	if rp := sq.rp; rp != nil && (rp.startup || rp.topic == m.topic) {
		sq.held = append(sq.held, m)
		if len(sq.held) > sq.holdMax {
			s.abort = true
			sq.finish(s, false)
		}
		return
	}
	st, ok := sq.streams[m.topic]
	if !ok {
		if !sq.replay {
			sq.streams[m.topic] = &seqState{next: m.seq + 1}
			s.items = append(s.items, sq.item(m, false))
			return
		}
		// With replay on, the stream is complete only from seq 0.
		st = &seqState{}
		sq.streams[m.topic] = st
	}
	if st.window != nil {
		if m.seq >= st.next {
			st.window = nil // the SUB socket has caught up with the replay
		} else if ts, ok := st.window[m.seq]; ok && (ts == errorNoTS || m.err != nil || ts == m.batch.TS) {
			s.dups++
			return
		}
	}
	switch {
	case m.seq == st.next:
		s.items = append(s.items, sq.item(m, false))
		st.next++
	case m.seq > st.next:
		if sq.replay && mayReplay && sq.rp == nil {
			sq.rp = &replayRun{topic: m.topic, from: st.next}
			sq.held = append(sq.held, m)
			s.replay, s.replayFrom = true, st.next
			return
		}
		s.items = append(s.items, gapItem(sq.stream(m.topic), st.next, m.seq), sq.item(m, false))
		st.next = m.seq + 1
	default:
		if !st.quiet {
			s.items = append(s.items, restartItem(sq.stream(m.topic), m.seq))
		}
		delete(sq.streams, m.topic)
		sq.onLive(s, m, mayReplay)
	}
}

func (sq *sequencer) stream(topic string) Stream {
	return Stream{Topic: topic, Rank: sq.rank}
}

func (sq *sequencer) item(m msg, replayed bool) Item {
	if m.err != nil {
		return errorItem(sq.stream(m.topic), m.seq, m.err)
	}
	b := m.batch
	b.Topic, b.Seq = m.topic, m.seq
	return batchItem(sq.stream(m.topic), b, replayed)
}
