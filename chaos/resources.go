package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Resource use of the sidecars over a run. A leak (memory, goroutines,
// file descriptors) shows only over time and only under faults, which is
// what a chaos run has; Sampler records it, CheckFlat judges it.
//
//	s := chaos.StartSampler(c, 5*time.Second) // every sidecar of cluster c
//	defer s.Stop()
//	// ... load and faults ...
//	s.Stop()
//	peak, series := s.Peak(), s.Series()

// Measures a ResourceSample holds, as CheckFlat and the plots name them.
const (
	MeasureRSS        = "rss"
	MeasureGoroutines = "goroutines"
	MeasureFDs        = "fds"
)

// Measures lists them in the order reports show them.
var Measures = []string{MeasureRSS, MeasureGoroutines, MeasureFDs}

// ResourceSample is one read of one sidecar process, AtS seconds after the
// sampler started. Goroutines is -1 when the sidecar's /metrics did not
// answer (RSS and FDs come from /proc and need no answer).
type ResourceSample struct {
	AtS        float64 `json:"at_s"`
	RSSBytes   int64   `json:"rss_bytes"`
	Goroutines int     `json:"goroutines"`
	FDs        int     `json:"fds"`
}

// value returns the sample's measure; false when it was not read.
func (s ResourceSample) value(measure string) (float64, bool) {
	switch measure {
	case MeasureRSS:
		return float64(s.RSSBytes), true
	case MeasureGoroutines:
		return float64(s.Goroutines), s.Goroutines >= 0
	case MeasureFDs:
		return float64(s.FDs), true
	}
	return 0, false
}

// ResourceSeries is the samples of one sidecar process, in time order. A
// restarted sidecar is a new process and starts a series of its own, so a
// restart never reads as a drop in memory.
type ResourceSeries struct {
	Pod     string           `json:"pod"`
	PID     int              `json:"pid"`
	Samples []ResourceSample `json:"samples"`
}

// ResourcePeak is the largest value of each measure over every sidecar,
// with the pod it was seen on.
type ResourcePeak struct {
	RSSBytes      int64  `json:"rss_bytes"`
	RSSPod        string `json:"rss_pod,omitempty"`
	Goroutines    int    `json:"goroutines"`
	GoroutinesPod string `json:"goroutines_pod,omitempty"`
	FDs           int    `json:"fds"`
	FDsPod        string `json:"fds_pod,omitempty"`
}

// sampleTarget is one process to read: its pod, its pid, and its
// /metrics URL ("" to skip the goroutine count).
type sampleTarget struct {
	pod     string
	pid     int
	metrics string
}

// Sampler reads every sidecar's resident memory (/proc/PID/status VmRSS),
// goroutines (go_goroutines on its admin port's /metrics) and open file
// descriptors (/proc/PID/fd) every interval, from its own goroutine, which
// exits on Stop. Its methods are safe for concurrent use.
type Sampler struct {
	every   time.Duration
	start   time.Time
	targets func() []sampleTarget
	client  *http.Client
	stop    context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex
	series []ResourceSeries
	byPID  map[int]int // pid → index in series
	peak   ResourcePeak
}

// StartSampler starts sampling every live sidecar of c every interval
// (values below 100 ms mean 5 s), the first read at once. Times are from
// the call.
func StartSampler(c *Cluster, every time.Duration) *Sampler {
	return startSampler(c.sidecarTargets, every, time.Now())
}

func startSampler(targets func() []sampleTarget, every time.Duration, start time.Time) *Sampler {
	if every < 100*time.Millisecond {
		every = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sampler{every: every, start: start, targets: targets, stop: cancel, done: make(chan struct{}),
		byPID: map[int]int{},
		// A sidecar busy with requests answers /metrics late; a read that
		// waits longer than the interval would skew the series' times.
		client: &http.Client{Timeout: min(every, 2*time.Second), Transport: &http.Transport{DisableKeepAlives: true}}}
	go s.run(ctx)
	return s
}

// Stop ends the sampling and returns once the goroutine has exited. It
// is safe to call more than once.
func (s *Sampler) Stop() {
	s.stop()
	<-s.done
}

func (s *Sampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		s.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample reads every target once. A process gone between the listing and
// the read (a fault just killed it) gives no sample.
func (s *Sampler) sample(ctx context.Context) {
	at := time.Since(s.start).Seconds()
	for _, tg := range s.targets() {
		rss, err := readRSS(tg.pid)
		if err != nil {
			continue
		}
		fds, err := countFDs(tg.pid)
		if err != nil {
			continue
		}
		g := -1
		if tg.metrics != "" {
			g = s.goroutines(ctx, tg.metrics)
		}
		s.add(tg, ResourceSample{AtS: at, RSSBytes: rss, Goroutines: g, FDs: fds})
	}
}

func (s *Sampler) add(tg sampleTarget, x ResourceSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.byPID[tg.pid]
	if !ok || s.series[k].Pod != tg.pod { // a reused pid is another process
		k = len(s.series)
		s.series = append(s.series, ResourceSeries{Pod: tg.pod, PID: tg.pid})
		s.byPID[tg.pid] = k
	}
	s.series[k].Samples = append(s.series[k].Samples, x)
	p := &s.peak
	if x.RSSBytes > p.RSSBytes {
		p.RSSBytes, p.RSSPod = x.RSSBytes, tg.pod
	}
	if x.Goroutines > p.Goroutines {
		p.Goroutines, p.GoroutinesPod = x.Goroutines, tg.pod
	}
	if x.FDs > p.FDs {
		p.FDs, p.FDsPod = x.FDs, tg.pod
	}
}

// goroutines reads go_goroutines from a /metrics page; -1 when it cannot.
func (s *Sampler) goroutines(ctx context.Context, url string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return -1
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "\ngo_goroutines ") {
		return -1
	}
	return int(metricSum(string(b), "go_goroutines"))
}

// Series returns a copy of every series so far, in the order their
// processes were first seen.
func (s *Sampler) Series() []ResourceSeries {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ResourceSeries, len(s.series))
	for k, x := range s.series {
		out[k] = ResourceSeries{Pod: x.Pod, PID: x.PID, Samples: slices.Clone(x.Samples)}
	}
	return out
}

// Peak returns the largest value of each measure seen so far.
func (s *Sampler) Peak() ResourcePeak {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// sidecarTargets are the cluster's live sidecar processes. A process is
// read only once it runs the sidecar binary: in netns mode or when pinned
// it starts as ip(8) or taskset(1), which exec it in place.
func (c *Cluster) sidecarTargets() []sampleTarget {
	var out []sampleTarget
	for i, p := range c.Pods() {
		_, sc := c.procs(i)
		if sc == nil || sc.exited() {
			continue
		}
		pid := sc.cmd.Process.Pid
		if comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); err != nil ||
			strings.TrimSpace(string(comm)) != SidecarBinary {
			continue
		}
		out = append(out, sampleTarget{pod: p.Name, pid: pid, metrics: "http://" + p.Admin + "/metrics"})
	}
	return out
}

// readRSS is /proc/PID/status's VmRSS in bytes.
func readRSS(pid int) (int64, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseRSS(f)
}

// parseRSS reads the VmRSS line of a /proc/PID/status ("VmRSS:  1234 kB").
func parseRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: VmRSS %q", rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, fmt.Errorf("status: VmRSS %q", rest)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("status: no VmRSS (a zombie?)")
}

// countFDs counts /proc/PID/fd's entries: the process's open descriptors.
func countFDs(pid int) (int, error) {
	es, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return 0, err
	}
	return len(es), nil
}

// FlatConfig defines "flat". A series' level is the median of a Window of
// its samples; its base is the level of the Window right after WarmUp,
// its end the level of its last Window, and it is flat when the end is
// within Tolerance of the base. Medians, not single samples: goroutines
// and descriptors rise and fall with the requests in flight, and a hung
// engine holds a few seconds of them.
type FlatConfig struct {
	// WarmUp is left out from a series' start: caches, pools and the Go
	// heap grow to their working size. Default 5 min.
	WarmUp time.Duration
	// Window is what each level is the median of. Default 5 min. A series
	// shorter than WarmUp plus two Windows (15 min by default; a sidecar
	// restarted late in the run) is not judged.
	Window time.Duration
	// Tolerance is the largest change of the end from the base, as a
	// fraction of the base. Default 0.10.
	Tolerance float64
}

// DefaultFlatConfig returns the defaults documented on FlatConfig.
func DefaultFlatConfig() FlatConfig {
	return FlatConfig{WarmUp: 5 * time.Minute, Window: 5 * time.Minute, Tolerance: 0.10}
}

// FlatCheck is one measure of one series, judged.
type FlatCheck struct {
	Pod     string  `json:"pod"`
	PID     int     `json:"pid"`
	Measure string  `json:"measure"`
	SpanS   float64 `json:"span_s"` // first to last sample
	// Judged is false for a series too short to have a base and an end
	// that do not overlap; the other figures are then 0.
	Judged bool    `json:"judged"`
	Base   float64 `json:"base"`
	End    float64 `json:"end"`
	// Change is (End-Base)/Base; OK is |Change| <= Tolerance.
	Change float64 `json:"change"`
	OK     bool    `json:"ok"`
}

// CheckFlat judges every measure of every series (see FlatConfig; zero
// fields take its defaults). It is pure: the same series give the same
// checks.
func CheckFlat(series []ResourceSeries, cfg FlatConfig) []FlatCheck {
	d := DefaultFlatConfig()
	if cfg.WarmUp <= 0 {
		cfg.WarmUp = d.WarmUp
	}
	if cfg.Window <= 0 {
		cfg.Window = d.Window
	}
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = d.Tolerance
	}
	warm, win := cfg.WarmUp.Seconds(), cfg.Window.Seconds()
	var out []FlatCheck
	for _, s := range series {
		if len(s.Samples) == 0 {
			continue
		}
		first, last := s.Samples[0].AtS, s.Samples[len(s.Samples)-1].AtS
		for _, m := range Measures {
			fc := FlatCheck{Pod: s.Pod, PID: s.PID, Measure: m, SpanS: last - first}
			if last-first >= warm+2*win {
				base := levelOf(s.Samples, m, first+warm, first+warm+win)
				end := levelOf(s.Samples, m, last-win, last+1)
				if base > 0 && end >= 0 {
					fc.Judged, fc.Base, fc.End = true, base, end
					fc.Change = (end - base) / base
					fc.OK = fc.Change <= cfg.Tolerance && fc.Change >= -cfg.Tolerance
				}
			}
			out = append(out, fc)
		}
	}
	return out
}

// levelOf is the median of measure m over the samples at from <= t < to;
// -1 when none was read.
func levelOf(xs []ResourceSample, m string, from, to float64) float64 {
	var vs []float64
	for _, x := range xs {
		if x.AtS >= from && x.AtS < to {
			if v, ok := x.value(m); ok {
				vs = append(vs, v)
			}
		}
	}
	if len(vs) == 0 {
		return -1
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

// flatRule says in words what CheckFlat judged with cfg.
func flatRule(cfg FlatConfig) string {
	d := DefaultFlatConfig()
	if cfg.WarmUp <= 0 {
		cfg.WarmUp = d.WarmUp
	}
	if cfg.Window <= 0 {
		cfg.Window = d.Window
	}
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = d.Tolerance
	}
	return fmt.Sprintf("per sidecar process (a restarted sidecar starts a new series): the median of its last %v "+
		"within %.0f%% of the median of the %v after its first %v; a series shorter than %v is not judged",
		cfg.Window, 100*cfg.Tolerance, cfg.Window, cfg.WarmUp, cfg.WarmUp+2*cfg.Window)
}

// FlatFailures counts the judged checks that are not flat, and Judged the
// judged ones.
func (r *Result) FlatFailures() (failed, judged int) {
	for _, c := range r.Flat {
		if c.Judged {
			judged++
			if !c.OK {
				failed++
			}
		}
	}
	return failed, judged
}

// resourceMarkdown is the report's resources section: the peaks, and one
// row per sidecar process with each measure's base and end.
func (r *Result) resourceMarkdown() string {
	if len(r.Resources) == 0 {
		return ""
	}
	var b strings.Builder
	p := r.ResourcePeak
	fmt.Fprintf(&b, "\nsidecar resources: peak RSS %.1f MiB (%s), goroutines %d (%s), open fds %d (%s)\n",
		float64(p.RSSBytes)/(1<<20), p.RSSPod, p.Goroutines, p.GoroutinesPod, p.FDs, p.FDsPod)
	failed, judged := r.FlatFailures()
	fmt.Fprintf(&b, "\nflat: %d of %d judged measures not flat; rule: %s\n", failed, judged, r.FlatRule)
	b.WriteString("\n| pod | pid | span (min) | RSS base → end (MiB) | goroutines base → end | open fds base → end | flat |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|---|\n")
	for _, s := range r.Resources {
		var cells []string
		span, judgedAll, okAll := 0.0, true, true
		for _, m := range Measures {
			k := slices.IndexFunc(r.Flat, func(c FlatCheck) bool { return c.PID == s.PID && c.Pod == s.Pod && c.Measure == m })
			if k < 0 {
				cells = append(cells, "-")
				judgedAll = false
				continue
			}
			c := r.Flat[k]
			span = c.SpanS
			if !c.Judged {
				cells = append(cells, "-")
				judgedAll = false
				continue
			}
			okAll = okAll && c.OK
			scale := 1.0
			if m == MeasureRSS {
				scale = 1 << 20
			}
			cells = append(cells, fmt.Sprintf("%.1f → %.1f (%+.1f%%)", c.Base/scale, c.End/scale, 100*c.Change))
		}
		verdict := "too short"
		switch {
		case judgedAll && okAll:
			verdict = "yes"
		case !okAll:
			verdict = "**no**"
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %s | %s |\n", s.Pod, s.PID, span/60, strings.Join(cells, " | "), verdict)
	}
	return b.String()
}
