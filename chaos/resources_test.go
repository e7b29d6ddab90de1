package chaos

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseRSS(t *testing.T) {
	tests := []struct {
		name, in string
		want     int64
		err      bool
	}{
		{"kernel's layout", "Name:\tsidecar\nVmPeak:\t  900 kB\nVmRSS:\t   51234 kB\nThreads:\t7\n", 51234 << 10, false},
		{"no VmRSS (a zombie)", "Name:\tsidecar\nState:\tZ (zombie)\n", 0, true},
		{"another unit", "VmRSS:\t 12 MB\n", 0, true},
		{"not a number", "VmRSS:\t x kB\n", 0, true},
		{"negative", "VmRSS:\t -4 kB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRSS(strings.NewReader(tt.in))
			if got != tt.want || (err != nil) != tt.err {
				t.Errorf("parseRSS(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
			}
		})
	}
}

// series makes a series of one sample every 5 s over span seconds, whose
// every measure is f(t).
func series(pod string, span float64, f func(t float64) float64) ResourceSeries {
	s := ResourceSeries{Pod: pod, PID: 100}
	for at := 0.0; at <= span; at += 5 {
		v := f(at)
		s.Samples = append(s.Samples, ResourceSample{AtS: at, RSSBytes: int64(v), Goroutines: int(v), FDs: int(v)})
	}
	return s
}

func TestCheckFlat(t *testing.T) {
	const min = 60.0
	tests := []struct {
		name   string
		s      ResourceSeries
		judged bool
		ok     bool
		change float64
	}{
		{"flat after a steep warm-up", series("a", 30*min, func(t float64) float64 {
			if t < 5*min {
				return 100 + t
			}
			return 1000
		}), true, true, 0},
		{"a slow leak: 1 a minute from 1000 over 30 min is 2.2%", series("b", 30*min, func(t float64) float64 {
			return 1000 + t/min
		}), true, true, 0.02},
		{"a leak of 1% a minute", series("c", 30*min, func(t float64) float64 {
			return 1000 * (1 + 0.01*t/min)
		}), true, false, 0.18},
		{"noise around the level: medians ignore spikes", series("d", 20*min, func(t float64) float64 {
			if int(t)%60 == 0 {
				return 5000 // one sample a minute five times the level
			}
			return 1000
		}), true, true, 0},
		{"falling by more than the tolerance also fails", series("e", 20*min, func(t float64) float64 {
			if t < 14*min {
				return 1000
			}
			return 800
		}), true, false, -0.2},
		{"a restarted sidecar's short series is not judged", series("f", 14*min, func(float64) float64 { return 1 }), false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := CheckFlat([]ResourceSeries{tt.s}, FlatConfig{})
			if len(cs) != len(Measures) {
				t.Fatalf("CheckFlat gave %d checks; want %d", len(cs), len(Measures))
			}
			for _, c := range cs {
				if c.Judged != tt.judged || c.OK != tt.ok {
					t.Errorf("%s: judged %v ok %v (base %v end %v change %.3f); want judged %v ok %v",
						c.Measure, c.Judged, c.OK, c.Base, c.End, c.Change, tt.judged, tt.ok)
				}
				if d := c.Change - tt.change; tt.judged && (d > 0.01 || d < -0.01) {
					t.Errorf("%s: change %.3f; want about %.3f", c.Measure, c.Change, tt.change)
				}
			}
		})
	}
}

// TestCheckFlatGoroutinesUnread leaves a measure that was never read
// unjudged instead of calling it flat.
func TestCheckFlatGoroutinesUnread(t *testing.T) {
	s := series("a", 20*60, func(float64) float64 { return 10 })
	for k := range s.Samples {
		s.Samples[k].Goroutines = -1
	}
	for _, c := range CheckFlat([]ResourceSeries{s}, FlatConfig{}) {
		if want := c.Measure != MeasureGoroutines; c.Judged != want {
			t.Errorf("%s: judged %v; want %v", c.Measure, c.Judged, want)
		}
	}
}

// TestSamplerReadsAProcess samples this test process, whose /metrics is a
// stand-in, and then a process that is gone.
func TestSamplerReadsAProcess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# TYPE go_goroutines gauge\ngo_goroutines %d\ngo_goroutines_other 7\n", 42)
	}))
	defer srv.Close()
	targets := []sampleTarget{{pod: "pod1", pid: os.Getpid(), metrics: srv.URL}}
	s := startSampler(func() []sampleTarget { return targets }, 100*time.Millisecond, time.Now())
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Series()) == 0 || len(s.Series()[0].Samples) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no two samples within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	s.Stop() // twice is fine
	got := s.Series()
	if len(got) != 1 || got[0].Pod != "pod1" || got[0].PID != os.Getpid() {
		t.Fatalf("Series() = %+v; want one series of pod1, pid %d", got, os.Getpid())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for _, x := range got[0].Samples {
		// The heap in use is resident, and stdin, stdout, stderr are open.
		if x.RSSBytes < int64(ms.HeapInuse)/2 || x.Goroutines != 42 || x.FDs < 3 {
			t.Errorf("sample %+v; want RSS over %d bytes, 42 goroutines, 3 or more fds", x, ms.HeapInuse/2)
		}
	}
	p := s.Peak()
	if p.RSSBytes == 0 || p.RSSPod != "pod1" || p.Goroutines != 42 || p.FDs < 3 {
		t.Errorf("Peak() = %+v", p)
	}
	n := len(got[0].Samples)
	if len(s.Series()[0].Samples) != n {
		t.Error("samples were added after Stop")
	}

	// A pid that no longer exists, and a /metrics that does not answer.
	srv.Close()
	dead := startSampler(func() []sampleTarget {
		return []sampleTarget{{pod: "gone", pid: 1 << 30}, {pod: "mute", pid: os.Getpid(), metrics: srv.URL}}
	}, time.Second, time.Now())
	deadline = time.Now().Add(10 * time.Second)
	for len(dead.Series()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no sample within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	dead.Stop()
	got = dead.Series()
	if len(got) != 1 || got[0].Pod != "mute" || got[0].Samples[0].Goroutines != -1 {
		t.Errorf("Series() = %+v; want only mute's, with goroutines -1", got)
	}
}
