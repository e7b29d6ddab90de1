package simhttp

import (
	"context"
	"encoding/json"
	"sync"
)

// store is vLLM's Responses store (OpenAIServingResponses.response_store
// and msg_store, vllm/entrypoints/openai/responses/serving.py @0001948b):
// each stored response by id, with the chat messages its request ran
// (its history included), which previous_response_id continues. It lives
// in this process's memory only, as vLLM's does: another pod has none of
// it, and a restart empties it. Unlike vLLM's it is bounded: past limit
// the oldest response goes. Safe for concurrent use.
type store struct {
	mu    sync.Mutex
	limit int
	m     map[string]*stored
	order []string // ids in the order first stored, for eviction
}

// stored is one response. resp is replaced, never changed in place, so a
// copy taken under the lock stays valid.
type stored struct {
	resp     responseObject
	messages json.RawMessage
	// cancel aborts a background response's engine request; nil for the
	// others.
	cancel context.CancelFunc
	// events are a background stream's events, for its own stream and for
	// GET ?stream=true; nil for the others.
	events *eventLog
}

func newStore(limit int) *store {
	return &store{limit: limit, m: make(map[string]*stored)}
}

// put stores e under id, evicting the oldest responses past the limit.
func (s *store) put(id string, e stored) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; !ok {
		s.order = append(s.order, id)
	}
	s.m[id] = &e
	for len(s.m) > s.limit && len(s.order) > 0 {
		old := s.order[0]
		s.order = s.order[1:]
		if o, ok := s.m[old]; ok {
			if o.cancel != nil {
				o.cancel()
			}
			delete(s.m, old)
		}
	}
}

// get returns a copy of the entry for id.
func (s *store) get(id string) (stored, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[id]
	if !ok {
		return stored{}, false
	}
	return *e, true
}

// update replaces id's response with f's result, if id is still stored;
// f sees the current one. It returns the entry after f.
func (s *store) update(id string, f func(responseObject) responseObject) (stored, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[id]
	if !ok {
		return stored{}, false
	}
	e.resp = f(e.resp)
	return *e, true
}

// reset forgets every response, as a restarted process has none, and
// aborts the background ones still running.
func (s *store) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.m {
		if e.cancel != nil {
			e.cancel()
		}
	}
	s.m, s.order = make(map[string]*stored), nil
}

// eventLog is a background stream's events as they are made (vLLM's
// event_store): readers replay them from any point and then follow.
type eventLog struct {
	mu     sync.Mutex
	events []sseEvent
	done   bool
	wake   chan struct{} // closed and replaced on every change
}

type sseEvent struct {
	name string
	data []byte
}

func newEventLog() *eventLog { return &eventLog{wake: make(chan struct{})} }

func (l *eventLog) add(e sseEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// close marks the log complete: readers stop at its end.
func (l *eventLog) close() {
	l.mu.Lock()
	if !l.done {
		l.done = true
		close(l.wake)
		l.wake = make(chan struct{})
	}
	l.mu.Unlock()
}

// from returns the events from index i on, whether the log is complete,
// and a channel closed at the next change.
func (l *eventLog) from(i int) ([]sseEvent, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i > len(l.events) {
		i = len(l.events)
	}
	return l.events[i:len(l.events):len(l.events)], l.done, l.wake
}
