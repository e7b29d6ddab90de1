package engine

import "time"

// Silence tells an event path that is misconfigured from one that is quiet.
// vLLM publishes a BlockStored for every full block it computes, so an
// engine that has prefilled at least a block's worth of prompt tokens and
// published nothing for Window is not connected to us: both sides connect
// (or both bind), or the topic or port is wrong. Once an event has arrived
// the path works, and a quiet one is just a cache with nothing new.
//
// Silence is pure; the caller feeds it the engine's prompt-token counter
// (vllm:prompt_tokens_total) and the events it receives.
type Silence struct {
	window    time.Duration
	minTokens float64

	seen     bool    // an event arrived since the last Reset
	base     float64 // prompt tokens at the first observation
	based    bool
	servedAt time.Time // when the engine was first seen to have served
	silent   bool
}

// NewSilence returns a detector: window is how long an engine may serve
// with no event, minTokens how many prompt tokens it must have processed
// (a block's worth: shorter prompts store no block).
func NewSilence(window time.Duration, minTokens int) *Silence {
	return &Silence{window: window, minTokens: float64(max(minTokens, 1))}
}

// Event records that a KV event arrived.
func (s *Silence) Event() {
	s.seen, s.silent = true, false
}

// Reset forgets what was seen: the engine restarted, and its event path
// must prove itself again.
func (s *Silence) Reset() {
	*s = Silence{window: s.window, minTokens: s.minTokens}
}

// Tokens records the engine's prompt-token counter at now and reports
// whether the path is silent, and whether that changed with this call.
func (s *Silence) Tokens(total float64, now time.Time) (silent, changed bool) {
	if s.seen {
		return false, false
	}
	if !s.based || total < s.base {
		s.base, s.based, s.servedAt = total, true, time.Time{}
	}
	if s.servedAt.IsZero() && total-s.base >= s.minTokens {
		s.servedAt = now
	}
	was := s.silent
	s.silent = !s.servedAt.IsZero() && now.Sub(s.servedAt) >= s.window
	return s.silent, s.silent != was
}

// Silent reports the last verdict.
func (s *Silence) Silent() bool { return s.silent }
