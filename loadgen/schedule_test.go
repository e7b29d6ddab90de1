package loadgen

import (
	"testing"
	"time"
)

func TestStretched(t *testing.T) {
	s := Schedule{Workload: "agentic", Sessions: []Session{
		{ID: "a", At: time.Second, Turns: []Turn{
			{Think: 0},
			{Think: 300 * time.Millisecond, Spawn: []Session{{ID: "a.sub", Turns: []Turn{{Think: 0}, {Think: 50 * time.Millisecond}}}}},
		}},
		{ID: "b", At: 2500 * time.Millisecond, Turns: []Turn{{}}},
	}}
	got := s.Stretched(2)
	if got.Sessions[0].At != 2*time.Second || got.Sessions[1].At != 5*time.Second {
		t.Errorf("arrivals %v, %v; want 2s, 5s", got.Sessions[0].At, got.Sessions[1].At)
	}
	if th := got.Sessions[0].Turns[1].Think; th != 600*time.Millisecond {
		t.Errorf("think %v; want 600ms", th)
	}
	if th := got.Sessions[0].Turns[1].Spawn[0].Turns[1].Think; th != 100*time.Millisecond {
		t.Errorf("a sub-agent's think %v; want 100ms", th)
	}
	// The original is untouched: every policy of a run stretches the same schedule.
	if s.Sessions[0].At != time.Second || s.Sessions[0].Turns[1].Think != 300*time.Millisecond ||
		s.Sessions[0].Turns[1].Spawn[0].Turns[1].Think != 50*time.Millisecond {
		t.Errorf("Stretched changed its receiver: %+v", s.Sessions[0])
	}
	if got.Requests() != s.Requests() {
		t.Errorf("%d requests; want %d", got.Requests(), s.Requests())
	}
	if one := s.Stretched(1); one.Sessions[0].At != time.Second {
		t.Errorf("k=1 changed the schedule")
	}
}
