package loadgen

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A grid is many kvbench runs read back and put side by side: one cell per
// workload (or trace and time scale), pod count and offered load, each
// seed's run a sample, and per cell the median over seeds of what issue
// 26 judges kvroute by, against the central routers of the same runs.
// Ratios are taken per seed, between policies of one run (same schedule,
// same machine minutes), and the median of those is shown.

// Cell is one point of the grid.
type Cell struct {
	Workload  string // the workload, or the trace's file name
	TimeScale float64
	// SidecarArgs are the kvroute sidecars' extra flags, space-separated:
	// runs of other flags are other cells.
	SidecarArgs string
	// ClientRetry: the clients retried as the OpenAI SDKs do
	// (Report.ClientRetry); runs without are other cells.
	ClientRetry bool
	Pods        int
	// Level is the point's rank among its run's offered loads (0: the
	// lightest; always 0 for a run of one load).
	Level int
	// Load is the median offered load, requests/s.
	Load float64
	// Runs holds one report per seed.
	Runs []Report
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case b:
		return -1
	}
	return 1
}

func (c Cell) name() string {
	w := c.Workload
	if c.TimeScale > 0 && c.TimeScale != 1 {
		w += fmt.Sprintf(" ×%g", c.TimeScale)
	}
	if c.SidecarArgs != "" {
		w += " (" + c.SidecarArgs + ")"
	}
	if c.ClientRetry {
		w += " [client retries]"
	}
	return w
}

// ReadGrid reads every results.json and sweep.json under the roots (a
// directory with a sweep.json is read from it, its results.json being the
// sweep's last point) and groups them into cells, ordered by workload,
// pods and load.
func ReadGrid(roots []string) ([]Cell, error) {
	var reports [][]Report // one slice per run, in load order
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "clusters" {
				return filepath.SkipDir
			}
			rs, err := readRun(path)
			if err != nil {
				return err
			}
			if len(rs) > 0 {
				reports = append(reports, rs)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(reports) == 0 {
		return nil, fmt.Errorf("no results.json or sweep.json under %s", strings.Join(roots, ", "))
	}
	type key struct {
		workload  string
		scale     float64
		args      string
		retry     bool
		pods      int
		level     int
		sweepSize int
	}
	cells := map[key]*Cell{}
	for _, run := range reports {
		for i, r := range run {
			w := r.Workload
			if r.Trace != "" {
				w = r.Trace
			}
			args := strings.Join(r.SidecarArgs, " ")
			k := key{w, r.TimeScale, args, r.ClientRetry, r.Pods, i, len(run)}
			c := cells[k]
			if c == nil {
				c = &Cell{Workload: w, TimeScale: r.TimeScale, SidecarArgs: args, ClientRetry: r.ClientRetry, Pods: r.Pods, Level: i}
				cells[k] = c
			}
			c.add(r)
		}
	}
	out := make([]Cell, 0, len(cells))
	for _, c := range cells {
		loads := make([]float64, 0, len(c.Runs))
		for _, r := range c.Runs {
			loads = append(loads, r.OfferedLoad)
		}
		c.Load = median(loads)
		slices.SortFunc(c.Runs, func(a, b Report) int { return cmp.Compare(a.Seed, b.Seed) })
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Cell) int {
		return cmp.Or(strings.Compare(a.Workload, b.Workload), cmp.Compare(a.TimeScale, b.TimeScale),
			strings.Compare(a.SidecarArgs, b.SidecarArgs), compareBool(a.ClientRetry, b.ClientRetry), cmp.Compare(a.Pods, b.Pods), cmp.Compare(a.Load, b.Load))
	})
	return out, nil
}

// add adds r to c's runs: a run of a seed c has already (policies run
// apart, as kvroute-requests after the others) adds the policies that run
// lacks, so that a seed counts once and its ratios pair across runs.
func (c *Cell) add(r Report) {
	i := slices.IndexFunc(c.Runs, func(o Report) bool { return o.Seed == r.Seed })
	if i < 0 {
		c.Runs = append(c.Runs, r)
		return
	}
	o := &c.Runs[i]
	for _, p := range r.Policies {
		if _, ok := o.policy(p.Name); !ok {
			o.Policies = append(slices.Clip(o.Policies), p)
		}
	}
}

// readRun returns dir's run, its points in load order; none when dir holds
// no results.
func readRun(dir string) ([]Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, "sweep.json"))
	if errors.Is(err, fs.ErrNotExist) {
		b, err = os.ReadFile(filepath.Join(dir, "results.json"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		return []Report{r}, nil
	}
	if err != nil {
		return nil, err
	}
	var rs []Report
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	slices.SortFunc(rs, func(a, b Report) int { return cmp.Compare(a.OfferedLoad, b.OfferedLoad) })
	return rs, nil
}

// policy returns r's result of the named policy.
func (r Report) policy(name string) (PolicyResult, bool) {
	i := slices.IndexFunc(r.Policies, func(p PolicyResult) bool { return p.Name == name })
	if i < 0 {
		return PolicyResult{}, false
	}
	return r.Policies[i], true
}

// ratio is the median over c's seeds of f(of) / f(to), over the seeds
// whose runs have both policies; ok is false when none has.
func (c Cell) ratio(of, to string, f func(PolicyResult) float64) (float64, bool) {
	var rs []float64
	for _, r := range c.Runs {
		a, okA := r.policy(of)
		b, okB := r.policy(to)
		if okA && okB && f(b) > 0 {
			rs = append(rs, f(a)/f(b))
		}
	}
	return median(rs), len(rs) > 0
}

// value is the median over c's seeds of f(policy).
func (c Cell) value(name string, f func(PolicyResult) float64) (float64, bool) {
	var vs []float64
	for _, r := range c.Runs {
		if p, ok := r.policy(name); ok {
			vs = append(vs, f(p))
		}
	}
	return median(vs), len(vs) > 0
}

// predicted is a policy's predicted over actual cached tokens, over every
// API it served; 0 when no sidecar reported them.
func predicted(p PolicyResult) float64 {
	var pred, act float64
	for _, a := range p.ByAPI {
		if a.PredictedCached != nil && a.ActualCached != nil {
			pred += *a.PredictedCached
			act += *a.ActualCached
		}
	}
	if act == 0 {
		return 0
	}
	return pred / act
}

func ttftP90(p PolicyResult) float64     { return p.TTFTP90 }
func hitRate(p PolicyResult) float64     { return p.HitRate }
func maxMeanLoad(p PolicyResult) float64 { return p.MaxMeanLoad }
func failed(p PolicyResult) float64      { return float64(p.Requests) * (1 - p.SuccessRate) }

// GridMarkdown renders the cells as one table: per cell the seeds, the
// median offered load, kvroute's TTFT p90 and hit rate, its ratios to
// central-precise, lmetric and the request-count kvroute (medians of the
// per-seed ratios), its max/mean requests per pod, its predicted over
// actual cached tokens, and the failures of every policy, with how many
// of them were refused with 429 (PolicyResult.Refused). A column whose
// policy did not run is "–".
func GridMarkdown(cells []Cell) string {
	var b strings.Builder
	b.WriteString("| workload | pods | req/s | seeds | kvroute TTFT p90 | ÷ central-precise | ÷ lmetric | ÷ by request count | hit rate | ÷ central-precise | max/mean | predicted ÷ actual cached | failures |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	num := func(v float64, ok bool, format string) string {
		if !ok {
			return "–"
		}
		return fmt.Sprintf(format, v)
	}
	for _, c := range cells {
		p90, okP := c.value("kvroute", ttftP90)
		hit, okH := c.value("kvroute", hitRate)
		mm, okM := c.value("kvroute", maxMeanLoad)
		pred, okPr := c.value("kvroute", predicted)
		okPr = okPr && pred > 0
		vsCP, okCP := c.ratio("kvroute", "central-precise", ttftP90)
		vsLM, okLM := c.ratio("kvroute", "lmetric", ttftP90)
		vsRC, okRC := c.ratio("kvroute", "kvroute-requests", ttftP90)
		hitCP, okHC := c.ratio("kvroute", "central-precise", hitRate)
		var fails float64
		refused := 0
		for _, r := range c.Runs {
			for _, p := range r.Policies {
				fails += failed(p)
				refused += p.Refused
			}
		}
		failures := fmt.Sprintf("%.0f", fails)
		if refused > 0 {
			failures += fmt.Sprintf(" (%d refused)", refused)
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			c.name(), c.Pods, c.Load, len(c.Runs), num(p90, okP, "%.3f"), num(vsCP, okCP, "%.2f"), num(vsLM, okLM, "%.2f"),
			num(vsRC, okRC, "%.2f"), num(100*hit, okH, "%.1f%%"), num(hitCP, okHC, "%.3f"), num(mm, okM, "%.2f"),
			num(pred, okPr, "%.3f"), failures)
	}
	return b.String()
}

// median of vs (the mean of the middle two for an even count); 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
