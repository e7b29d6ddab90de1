package vllmclient

import "sync/atomic"

// Stats are a Subscriber's counters since it started, for export as
// metrics (kvroute_events_*_total).
type Stats struct {
	// Received counts messages read from the SUB sockets.
	Received uint64
	// Replayed counts batches read from the replay sockets.
	Replayed uint64
	// DecodeErrors counts messages whose frames or payload did not decode.
	DecodeErrors uint64
	// Gaps counts Gap items produced: holes that replay could not fill,
	// including those left by hand-off drops.
	Gaps uint64
	// Restarts counts Restart items produced (a publisher's seq went back).
	Restarts uint64
	// Replays counts replay requests sent, ReplayFailures those abandoned
	// (timeout, socket error, hold overflow).
	Replays        uint64
	ReplayFailures uint64
	// Duplicates counts messages dropped because their seq was delivered.
	Duplicates uint64
	// Dropped counts items dropped because the hand-off channel was full.
	Dropped uint64
}

type counters struct {
	received, replayed, decodeErrors, gaps, restarts atomic.Uint64
	replays, replayFailures, duplicates, dropped     atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Received:       c.received.Load(),
		Replayed:       c.replayed.Load(),
		DecodeErrors:   c.decodeErrors.Load(),
		Gaps:           c.gaps.Load(),
		Restarts:       c.restarts.Load(),
		Replays:        c.replays.Load(),
		ReplayFailures: c.replayFailures.Load(),
		Duplicates:     c.duplicates.Load(),
		Dropped:        c.dropped.Load(),
	}
}
