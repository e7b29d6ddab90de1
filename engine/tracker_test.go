package engine

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/route"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// TestTracker walks the state machine through each input, step by step.
func TestTracker(t *testing.T) {
	type step struct {
		probe     Probe
		failed    bool          // Failed instead of Observe
		at        time.Duration // Failed's request time, from t0
		want      route.Engine
		moved     bool
		restarted bool
		hung      bool // a move to down by a hang
		resumed   bool // back from a hang with nothing refused meanwhile
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"starting stays starting while vLLM loads", []step{
			{probe: ProbeFailed, want: route.EngineStarting},
			{probe: ProbeTimeout, want: route.EngineStarting},
			{probe: ProbeOK, want: route.EngineServing, moved: true},
		}},
		{"a refused probe is down at once, and back is a restart", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{probe: ProbeFailed, want: route.EngineDown, moved: true},
			{probe: ProbeFailed, want: route.EngineDown},
			{probe: ProbeOK, want: route.EngineServing, moved: true, restarted: true},
		}},
		{"one timeout is a slow answer, two are a hang", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{probe: ProbeTimeout, want: route.EngineServing},
			{probe: ProbeOK, want: route.EngineServing},
			{probe: ProbeTimeout, want: route.EngineServing},
			{probe: ProbeTimeout, want: route.EngineDown, moved: true, hung: true},
			{probe: ProbeOK, want: route.EngineServing, moved: true, restarted: true, resumed: true},
		}},
		{"a hang then a refused probe is a restart, not a resumption", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{probe: ProbeTimeout, want: route.EngineServing},
			{probe: ProbeTimeout, want: route.EngineDown, moved: true, hung: true},
			{probe: ProbeFailed, want: route.EngineDown},
			{probe: ProbeTimeout, want: route.EngineDown},
			{probe: ProbeOK, want: route.EngineServing, moved: true, restarted: true},
		}},
		{"a hang then a refused request is a restart too", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{probe: ProbeTimeout, want: route.EngineServing},
			{probe: ProbeTimeout, want: route.EngineDown, moved: true, hung: true},
			{failed: true, at: time.Second, want: route.EngineDown},
			{probe: ProbeOK, want: route.EngineServing, moved: true, restarted: true},
		}},
		{"a second hang after a resumption is one again", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{probe: ProbeFailed, want: route.EngineDown, moved: true},
			{probe: ProbeOK, want: route.EngineServing, moved: true, restarted: true},
			{probe: ProbeTimeout, want: route.EngineServing},
			{probe: ProbeTimeout, want: route.EngineDown, moved: true, hung: true},
			{probe: ProbeOK, want: route.EngineServing, moved: true, restarted: true, resumed: true},
		}},
		{"a refused request is down at once", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{failed: true, at: time.Second, want: route.EngineDown, moved: true},
			{failed: true, at: time.Second, want: route.EngineDown},
		}},
		{"a refusal older than the last good probe is stale", []step{
			{probe: ProbeOK, want: route.EngineServing, moved: true},
			{failed: true, at: -time.Second, want: route.EngineServing},
		}},
		{"a refused request while starting changes nothing", []step{
			{failed: true, at: time.Second, want: route.EngineStarting},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := NewTracker(2, 0)
			for i, s := range tt.steps {
				var tr Transition
				var moved bool
				if s.failed {
					tr, moved = tk.Failed("refused", t0.Add(s.at))
				} else {
					tr, moved = tk.Observe(s.probe, "x", t0)
				}
				if tk.State() != s.want || moved != s.moved || tr.Restarted != s.restarted || tr.Hung != s.hung || tr.Resumed != s.resumed {
					t.Fatalf("step %d: state %v moved %v restarted %v hung %v resumed %v; want %v %v %v %v %v",
						i, tk.State(), moved, tr.Restarted, tr.Hung, tr.Resumed, s.want, s.moved, s.restarted, s.hung, s.resumed)
				}
				if moved && tr.To != s.want {
					t.Fatalf("step %d: transition to %v; want %v", i, tr.To, s.want)
				}
			}
		})
	}
}

// TestTrackerBusyIsNotHung: timeouts make the engine down only once it
// has also shown no progress for quietFor. Times are ms from t0.
func TestTrackerBusyIsNotHung(t *testing.T) {
	const quiet = 750 * time.Millisecond
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type step struct {
		progress bool // Progress at at, instead of a probe
		probe    Probe
		at       int
		want     route.Engine
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a saturated engine: late answers, work going on", []step{
			{probe: ProbeOK, at: 0, want: route.EngineServing},
			{progress: true, at: 400},
			{probe: ProbeTimeout, at: 750, want: route.EngineServing},
			{progress: true, at: 900},
			{probe: ProbeTimeout, at: 1250, want: route.EngineServing},
			{progress: true, at: 1600},
			{probe: ProbeTimeout, at: 1750, want: route.EngineServing},
			{probe: ProbeTimeout, at: 2250, want: route.EngineServing}, // 650 ms quiet
		}},
		{"work stops: hung at the next timeout past quietFor", []step{
			{probe: ProbeOK, at: 0, want: route.EngineServing},
			{progress: true, at: 400},
			{probe: ProbeTimeout, at: 750, want: route.EngineServing},
			{probe: ProbeTimeout, at: 1100, want: route.EngineServing}, // 700 ms quiet
			{probe: ProbeTimeout, at: 1150, want: route.EngineDown},    // 750 ms
		}},
		{"events in flight as it froze do not delay the hang", []step{
			{probe: ProbeOK, at: 0, want: route.EngineServing},
			{progress: true, at: 105}, // froze at 100
			{probe: ProbeTimeout, at: 600, want: route.EngineServing},
			{probe: ProbeTimeout, at: 1100, want: route.EngineDown},
		}},
		{"an idle engine never showed progress: timeouts alone", []step{
			{probe: ProbeOK, at: 0, want: route.EngineServing},
			{probe: ProbeTimeout, at: 500, want: route.EngineServing},
			{probe: ProbeTimeout, at: 1000, want: route.EngineDown},
		}},
		{"progress out of order counts its newest", []step{
			{probe: ProbeOK, at: 0, want: route.EngineServing},
			{progress: true, at: 900},
			{progress: true, at: 100},
			{probe: ProbeTimeout, at: 1000, want: route.EngineServing},
			{probe: ProbeTimeout, at: 1500, want: route.EngineServing},
			{probe: ProbeTimeout, at: 1700, want: route.EngineDown},
		}},
		{"progress does not hold off a refused probe", []step{
			{probe: ProbeOK, at: 0, want: route.EngineServing},
			{progress: true, at: 100},
			{probe: ProbeFailed, at: 200, want: route.EngineDown},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := NewTracker(2, quiet)
			for i, s := range tt.steps {
				if s.progress {
					tk.Progress(ms(s.at))
					continue
				}
				tk.Observe(s.probe, "x", ms(s.at))
				if got := tk.State(); got != s.want {
					t.Fatalf("step %d (probe %d at %d ms): state %v; want %v", i, s.probe, s.at, got, s.want)
				}
			}
		})
	}
	// Without quietFor, progress is not considered.
	tk := NewTracker(2, 0)
	tk.Observe(ProbeOK, "", ms(0))
	tk.Progress(ms(900))
	tk.Observe(ProbeTimeout, "x", ms(950))
	if tk.Observe(ProbeTimeout, "x", ms(1000)); tk.State() != route.EngineDown {
		t.Errorf("quietFor 0: state %v after two timeouts; want down", tk.State())
	}
}

func TestSilence(t *testing.T) {
	const window = 10 * time.Second
	s := NewSilence(window, 16)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(step string, total float64, d time.Duration, want, wantChanged bool) {
		t.Helper()
		if got, changed := s.Tokens(total, at(d)); got != want || changed != wantChanged {
			t.Errorf("%s: Tokens(%v, +%v) = %v, %v; want %v, %v", step, total, d, got, changed, want, wantChanged)
		}
	}
	check("first sight of an engine that served before us", 1000, 0, false, false)
	check("less than a block since", 1010, 20*time.Second, false, false)
	check("a block's worth: the window starts", 1016, 21*time.Second, false, false)
	check("within the window", 5000, 30*time.Second, false, false)
	check("window over, no event", 5000, 31*time.Second, true, true)
	check("still silent", 6000, 40*time.Second, true, false)
	s.Event()
	if s.Silent() {
		t.Errorf("after an event: silent")
	}
	check("an event proves the path for good", 9000, time.Hour, false, false)
	s.Reset()
	check("after a restart the path proves itself again", 0, time.Hour, false, false)
	check("counter restarted lower: new base", 20, time.Hour+time.Second, false, false)
	check("the restarted engine serves", 40, time.Hour+2*time.Second, false, false)
	check("and stays silent", 40, time.Hour+12*time.Second, true, true)
}
