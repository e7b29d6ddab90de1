package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/kvroute/kvroute/scale"
)

// plotTraffic writes traffic per node against N to path as a PNG: the
// measured points, the fitted line out to 1000 pods and the 1 MB/s target.
func plotTraffic(results []scale.Result, m []verdict, blocksPerSecond float64, path string) error {
	var v *verdict
	for i := range m {
		if m[i].Measure == measures[0].name {
			v = &m[i]
		}
	}
	if v == nil || len(v.N) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "kvroute cache-state traffic per node (sent + received)"
	p.X.Label.Text = "pods (N)"
	p.Y.Label.Text = "KiB/s per node"
	p.Add(plotter.NewGrid())
	var pts plotter.XYs
	top := targetTrafficBps / 1024
	for i := range v.N {
		pts = append(pts, plotter.XY{X: v.N[i], Y: v.Measured[i]})
		top = max(top, v.Measured[i])
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return fmt.Errorf("plot traffic: %w", err)
	}
	sc.GlyphStyle.Shape = draw.CircleGlyph{}
	sc.GlyphStyle.Radius = vg.Points(3.5)
	sc.GlyphStyle.Color = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	fit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: v.Fit.At(0)}, {X: 1000, Y: v.Fit.At(1000)}})
	if err != nil {
		return fmt.Errorf("plot traffic: %w", err)
	}
	fit.Color = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	fit.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	top = max(top, v.Fit.At(1000))
	tgt, err := plotter.NewLine(plotter.XYs{{X: 0, Y: targetTrafficBps / 1024}, {X: 1000, Y: targetTrafficBps / 1024}})
	if err != nil {
		return fmt.Errorf("plot traffic: %w", err)
	}
	tgt.Color = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	tgt.Width = vg.Points(1.2)
	p.Add(fit, tgt, sc)
	p.Legend.Add("measured", sc)
	var satPts plotter.XYs
	for _, r := range results {
		if saturated(r, blocksPerSecond) {
			y := measures[0].value(r)
			satPts = append(satPts, plotter.XY{X: float64(r.N), Y: y})
			top = max(top, y)
		}
	}
	if len(satPts) > 0 {
		ss, err := plotter.NewScatter(satPts)
		if err != nil {
			return fmt.Errorf("plot traffic: %w", err)
		}
		ss.GlyphStyle.Shape = draw.CrossGlyph{}
		ss.GlyphStyle.Radius = vg.Points(4)
		ss.GlyphStyle.Color = color.Gray{Y: 0x80}
		p.Add(ss)
		p.Legend.Add("saturated run (not fitted)", ss)
	}
	p.Legend.Add(fmt.Sprintf("fit %.1f + %.2f·N KiB/s", v.Fit.A, v.Fit.B), fit)
	p.Legend.Add("target 1 MB/s (976.6 KiB/s)", tgt)
	p.Legend.Top, p.Legend.Left = true, true
	p.X.Min, p.X.Max = 0, 1000
	p.Y.Min, p.Y.Max = 0, top*1.08
	img := vgimg.New(vg.Points(720), vg.Points(450))
	p.Draw(draw.New(img))
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot traffic: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot traffic: %w", err)
	}
	return f.Close()
}
