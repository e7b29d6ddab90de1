package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Rolling upgrades with two versions in one mesh: pods start with an
// earlier sidecar (Scenario.SidecarFrom, ClusterConfig.SidecarBins) and
// the upgrade-sidecar fault moves them, one at a time, to this tree's
// (docs/compat.md).

// SidecarBin returns the sidecar binary pod i runs, or runs next when it
// is started.
func (c *Cluster) SidecarBin(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sidecar[i]
}

// UpgradeSidecar replaces pod i's sidecar with this tree's (BinDir's), as
// a sidecar container whose image is updated in place: the old one drains
// (POST /drain: it leaves the mesh, refuses new forwards and waits for its
// requests in flight), is stopped (SIGTERM), and the new one starts
// beside the same engine, whose cache stays. It returns once every sidecar
// sees the full mesh again. The caller takes the pod out of its Service
// first, as the endpoints controller does for a terminating container.
func (c *Cluster) UpgradeSidecar(ctx context.Context, i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	if !c.cfg.Sidecars {
		return fmt.Errorf("upgrade sidecar: %w: cluster runs without sidecars", ErrConfig)
	}
	from := c.SidecarBin(i)
	if err := c.Drain(ctx, i); err != nil {
		return fmt.Errorf("upgrade sidecar: %w", err)
	}
	if err := c.StopSidecar(i); err != nil {
		return fmt.Errorf("upgrade sidecar: %w", err)
	}
	c.mu.Lock()
	c.sidecar[i] = filepath.Join(c.bin, SidecarBinary)
	to := c.sidecar[i]
	c.mu.Unlock()
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sidecar %s -> %s\n", c.Pod(i).Name, from, to)
	return c.RestartSidecar(ctx, i)
}

// upgrade is the upgrade-sidecar fault on slot i: out of the Service,
// UpgradeSidecar, back in it as a new endpoint that the readiness probe
// admits. rec.UndoneS is when the Service has it ready again.
func (r *runState) upgrade(ctx context.Context, i int, rec *FaultRecord) error {
	name := r.c.Pod(i).Name
	r.svc.Terminate(name)
	if err := r.c.UpgradeSidecar(ctx, i); err != nil {
		return err
	}
	// A terminated endpoint stays out until the Service forgets it; the
	// container that comes back is admitted by its probe as a new one.
	var rest []Endpoint
	for _, e := range endpoints(r.c) {
		if e.Name != name {
			rest = append(rest, e)
		}
	}
	r.svc.SetEndpoints(rest)
	r.svc.SetEndpoints(endpoints(r.c))
	if err := r.waitReady(ctx, name); err != nil {
		return err
	}
	rec.UndoneS = r.since()
	r.logf("upgraded %s's sidecar", name)
	return nil
}

// commitRef is what a scenario's sidecar_from may name: a commit hash,
// abbreviated or full.
var commitRef = regexp.MustCompile(`^[0-9a-f]{7,40}$`)

// versionOf is the release name stamped into a build of commit: the
// previous release's for its commit, none for any other.
func versionOf(commit string) string {
	if len(commit) >= 7 && PreviousRelease[:len(commit)] == commit {
		return PreviousVersion
	}
	return ""
}

// WindowHit is the token-weighted hit rate of one window of send time.
type WindowHit struct {
	FromS   float64 `json:"from_s"`
	ToS     float64 `json:"to_s"`
	HitRate float64 `json:"hit_rate"`
}

// hitWindow is the width of a window hitWindows cuts: about 150 requests
// at 15 req/s, where a per-second rate is noise (recoveryWindow).
const hitWindow = recoveryWindow

// hitWindows cuts the timeline from `from` to `to` into windows of w
// seconds and returns each one's hit rate, and the lowest of them over
// steady as a ratio (1 when steady is 0 or no window has traffic). A last
// window shorter than half of w is folded into the one before: a few
// seconds' rate is noise.
func hitWindows(secs []Second, from, to, w, steady float64) ([]WindowHit, float64) {
	var out []WindowHit
	low := 1.0
	for t := from; t < to; t += w {
		end := min(t+w, to)
		if to-end < w/2 {
			end = to
		}
		if p, _ := windowTokens(secs, t, end); p > 0 {
			h := windowHit(secs, t, end)
			out = append(out, WindowHit{FromS: t, ToS: end, HitRate: h})
			if steady > 0 {
				low = min(low, h/steady)
			}
		}
		if end == to {
			break
		}
	}
	return out, low
}

// windowTokens is the prompt and cached tokens sent in [from, to).
func windowTokens(secs []Second, from, to float64) (prompt, cached int) {
	for _, s := range secs {
		if float64(s.T) >= from && float64(s.T) < to {
			prompt += s.prompt
			cached += s.cached
		}
	}
	return prompt, cached
}

// windowMarkdown is the report's line of window hit rates, "" without
// windows.
func (r *Result) windowMarkdown() string {
	if len(r.HitRateWindows) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nHit rate per %d s window from the first fault (lowest %.0f%% of the steady %.1f%%):", hitWindow, 100*r.HitRateLowRatio, 100*r.HitRateSteady)
	for _, w := range r.HitRateWindows {
		fmt.Fprintf(&b, " %.0f-%.0f s %.1f%%;", w.FromS, w.ToS, 100*w.HitRate)
	}
	return strings.TrimSuffix(b.String(), ";") + "\n"
}
