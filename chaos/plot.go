package chaos

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	lineColor  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	faultColor = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	undoColor  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
)

// PlotTimeline writes the run's timeline to path as a PNG: success rate,
// hit rate and TTFT p99 per second of send time, one panel each, with a red
// marker at every fault (labelled in the top panel) and a green one where
// it was undone.
func (r *Result) PlotTimeline(path string) error {
	panels := []struct {
		ylabel string
		value  func(Second) (float64, bool)
		fixed  bool
	}{
		{"success rate", func(s Second) (float64, bool) {
			return float64(s.OK) / float64(max(s.Requests, 1)), s.Requests > 0
		}, true},
		{"hit rate (token-weighted)", func(s Second) (float64, bool) { return s.HitRate, s.OK > 0 }, true},
		{"TTFT p99 (s)", func(s Second) (float64, bool) { return s.TTFTP99, s.OK > 0 }, false},
	}
	rows := make([][]*plot.Plot, len(panels))
	for k, pn := range panels {
		p := plot.New()
		if k == 0 {
			p.Title.Text = fmt.Sprintf("chaos %s: %d pods, %.1f req/s %s, %s mode", r.Scenario, r.Pods, r.Rate, r.Workload, r.Mode)
		}
		if k == len(panels)-1 {
			p.X.Label.Text = "time since the load started (s)"
		}
		p.Y.Label.Text = pn.ylabel
		p.X.Min, p.X.Max = 0, math.Max(r.DurationS, float64(len(r.Timeline)))
		p.Add(plotter.NewGrid())
		var xy plotter.XYs
		top := 0.0
		for _, s := range r.Timeline {
			if v, ok := pn.value(s); ok {
				xy = append(xy, plotter.XY{X: float64(s.T) + 0.5, Y: v})
				top = math.Max(top, v)
			}
		}
		ymax := 1.05
		if !pn.fixed {
			ymax = math.Max(top*1.1, 1e-3)
		}
		p.Y.Min, p.Y.Max = 0, ymax
		if len(xy) > 0 {
			l, err := plotter.NewLine(xy)
			if err != nil {
				return fmt.Errorf("plot timeline: %w", err)
			}
			l.Color, l.Width = lineColor, vg.Points(1.2)
			p.Add(l)
		}
		var labels plotter.XYLabels
		for _, f := range r.marks() {
			if err := marker(p, f.AtS, ymax, faultColor); err != nil {
				return err
			}
			if f.UndoneS > 0 {
				if err := marker(p, f.UndoneS, ymax, undoColor); err != nil {
					return err
				}
			}
			labels.XYs = append(labels.XYs, plotter.XY{X: f.AtS, Y: ymax * 0.02})
			name := f.Fault
			if f.Pod != "" && f.Fault != FaultRollingRestart {
				name += " " + f.Pod
			}
			labels.Labels = append(labels.Labels, name)
		}
		if k == 0 && len(labels.XYs) > 0 {
			lb, err := plotter.NewLabels(labels)
			if err != nil {
				return fmt.Errorf("plot labels: %w", err)
			}
			for i := range lb.TextStyle {
				lb.TextStyle[i].Rotation = math.Pi / 2
				lb.TextStyle[i].Color = faultColor
				lb.TextStyle[i].Font.Size = vg.Points(9)
			}
			p.Add(lb)
		}
		rows[k] = []*plot.Plot{p}
	}
	img := vgimg.New(vg.Points(1000), vg.Points(820))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(10)}
	canvases := plot.Align(rows, tiles, dc)
	for k := range rows {
		rows[k][0].Draw(canvases[k][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot timeline: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot timeline: %w", err)
	}
	return f.Close()
}

// marker draws a vertical line at x.
func marker(p *plot.Plot, x, ymax float64, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: ymax}})
	if err != nil {
		return fmt.Errorf("plot marker: %w", err)
	}
	l.Color = c
	l.Width = vg.Points(0.8)
	l.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
	p.Add(l)
	return nil
}

// resourcePlots are the measures' plots: file, axis label, unit.
var resourcePlots = []struct {
	measure, file, ylabel string
	scale                 float64
}{
	{MeasureRSS, "resources-rss.png", "sidecar RSS (MiB)", 1 << 20},
	{MeasureGoroutines, "resources-goroutines.png", "sidecar goroutines", 1},
	{MeasureFDs, "resources-fds.png", "sidecar open file descriptors", 1},
}

// PlotResources writes one PNG per measure of the sidecars' resource
// series into dir (resources-rss.png, resources-goroutines.png,
// resources-fds.png), one line per sidecar process, with the fault and
// undo markers of the timeline. It returns the files written; none
// without series.
func (r *Result) PlotResources(dir string) ([]string, error) {
	if len(r.Resources) == 0 {
		return nil, nil
	}
	var files []string
	for _, rp := range resourcePlots {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("chaos %s: %s per sidecar process (%d pods, %.1f req/s %s)", r.Scenario, rp.ylabel, r.Pods, r.Rate, r.Workload)
		p.X.Label.Text = "time since the load started (min)"
		p.Y.Label.Text = rp.ylabel
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		top := 0.0
		for k, s := range r.Resources {
			var xy plotter.XYs
			for _, x := range s.Samples {
				if v, ok := x.value(rp.measure); ok {
					xy = append(xy, plotter.XY{X: x.AtS / 60, Y: v / rp.scale})
					top = math.Max(top, v/rp.scale)
				}
			}
			if len(xy) == 0 {
				continue
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return files, fmt.Errorf("plot resources: %w", err)
			}
			l.Color, l.Width = plotutil.Color(k), vg.Points(1)
			l.Dashes = plotutil.Dashes(k / 7) // seven colours, then dashed
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("%s (pid %d)", s.Pod, s.PID), l)
		}
		ymax := math.Max(top*1.15, 1)
		p.X.Min, p.X.Max = 0, math.Max(r.DurationS, float64(len(r.Timeline)))/60
		p.Y.Min, p.Y.Max = 0, ymax
		for _, f := range r.Faults {
			if err := marker(p, f.AtS/60, ymax, faultColor); err != nil {
				return files, err
			}
			if f.UndoneS > 0 {
				if err := marker(p, f.UndoneS/60, ymax, undoColor); err != nil {
					return files, err
				}
			}
		}
		path := filepath.Join(dir, rp.file)
		if err := p.Save(vg.Points(1000), vg.Points(420), path); err != nil {
			return files, fmt.Errorf("plot resources: %w", err)
		}
		files = append(files, path)
	}
	return files, nil
}

// marks are the timeline's events: the faults, and a burst as a fault
// from its start to its end.
func (r *Result) marks() []FaultResult {
	if r.Overload == nil {
		return r.Faults
	}
	b := FaultResult{FaultRecord: FaultRecord{Fault: "burst", AtS: r.Overload.AtS, UndoneS: r.Overload.EndS}}
	return append(slices.Clone(r.Faults), b)
}
