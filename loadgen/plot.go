package loadgen

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// SweepPoint is one offered load of a sweep and every policy's result at it.
type SweepPoint struct {
	Rate     float64        `json:"rate"`
	Policies []PolicyResult `json:"policies"`
}

// palette gives each policy a stable, distinguishable colour by position.
var palette = []color.RGBA{
	{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, {R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

func addLine(p *plot.Plot, i int, name string, xy plotter.XYs, points bool) error {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return fmt.Errorf("plot %s: %w", name, err)
	}
	l.Color = palette[i%len(palette)]
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	if points {
		s, err := plotter.NewScatter(xy)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		s.Color = l.Color
		p.Add(s)
	}
	return nil
}

// PlotCDF writes a PNG of each policy's TTFT CDF to path.
func PlotCDF(path, title string, res []PolicyResult) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "TTFT (simulated s)"
	p.Y.Label.Text = "fraction of requests"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	for i, r := range res {
		if len(r.TTFTs) == 0 {
			continue
		}
		xy := make(plotter.XYs, len(r.TTFTs))
		for k, v := range r.TTFTs {
			xy[k] = plotter.XY{X: v, Y: float64(k+1) / float64(len(r.TTFTs))}
		}
		if err := addLine(p, i, r.Name, xy, false); err != nil {
			return err
		}
	}
	return save(p, path)
}

// PlotSweep writes hit rate and TTFT p90 against offered load, one line per
// policy, as hit-rate-vs-load.png and ttft-p90-vs-load.png in dir, and
// returns their paths.
func PlotSweep(dir, title string, pts []SweepPoint) ([]string, error) {
	if len(pts) == 0 {
		return nil, nil
	}
	names := []string{}
	for _, r := range pts[0].Policies {
		names = append(names, r.Name)
	}
	charts := []struct {
		file, ylabel string
		value        func(PolicyResult) float64
	}{
		{"hit-rate-vs-load.png", "prefix-cache hit rate (token-weighted)", func(r PolicyResult) float64 { return r.HitRate }},
		{"ttft-p90-vs-load.png", "TTFT p90 (simulated s)", func(r PolicyResult) float64 { return r.TTFTP90 }},
	}
	var out []string
	for _, c := range charts {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "offered load (requests/s)"
		p.Y.Label.Text = c.ylabel
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
		top := 0.0
		for i, name := range names {
			var xy plotter.XYs
			for _, pt := range pts {
				for _, r := range pt.Policies {
					if r.Name == name {
						xy = append(xy, plotter.XY{X: pt.Rate, Y: c.value(r)})
						top = max(top, c.value(r))
					}
				}
			}
			if len(xy) == 0 {
				continue
			}
			if err := addLine(p, i, name, xy, true); err != nil {
				return out, err
			}
		}
		// From zero, with headroom above the lines for the legend.
		p.Y.Min, p.Y.Max = 0, max(top, 1e-3)*1.35
		path := filepath.Join(dir, c.file)
		if err := save(p, path); err != nil {
			return out, err
		}
		out = append(out, path)
	}
	return out, nil
}

func save(p *plot.Plot, path string) error {
	if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("save plot %s: %w", path, err)
	}
	return nil
}
