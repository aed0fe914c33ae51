package main

import (
	"fmt"
	"math"
	"strings"
)

// sweepSVG charts a sweep: fan-out rollback speedup over the inline
// rollback against workers, with the ideal (speedup = workers), both axes
// logarithmic so the ideal is a straight line and a bend shows as a
// flattening.
func sweepSVG(r *sweepReport) string {
	const (
		width, height        = 640, 420
		left, right, top, bt = 64, 24, 48, 56
	)
	maxX, maxY := 1.0, 1.0
	for _, p := range r.Points {
		maxX = max(maxX, float64(p.Workers))
		maxY = max(maxY, p.Ideal, p.Speedup)
	}
	lx, ly := math.Log10, math.Log10
	x := func(v float64) float64 { return left + (width-left-right)*lx(v)/lx(maxX*1.15) }
	y := func(v float64) float64 {
		return float64(height-bt) - (height-top-bt)*(ly(math.Max(v, 0.8))-ly(0.8))/(ly(maxY*1.25)-ly(0.8))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">Fan-out rollback speedup over inline (%d elements, %g ms undo, batch %d)</text>`+"\n",
		left-40, r.Elements, r.UndoLatencyMS, r.BatchSize)
	fmt.Fprintf(&b, `<text x="%d" y="36" fill="#555">inline rollback %.1f s; %d worker process(es); both axes logarithmic</text>`+"\n", left-40, r.InlineSeconds, r.Procs)

	// Grid and ticks.
	for _, t := range []float64{1, 2, 5, 10, 20, 50, 100, 200, 500} {
		if t <= maxX*1.15 {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(t), top, x(t), height-bt)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g</text>`+"\n", x(t), height-bt+16, t)
		}
		if t <= maxY*1.25 {
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(t), width-right, y(t))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%gx</text>`+"\n", left-6, y(t)+4, t)
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, height-bt, width-right, height-bt)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, height-bt)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">workers (total concurrency)</text>`+"\n", (left+width-right)/2, height-bt+36)
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">speedup (inline time / fan-out time)</text>`+"\n", (top+height-bt)/2)

	line := func(pts [][2]float64, style string) {
		var path strings.Builder
		for i, p := range pts {
			cmd := "L"
			if i == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f ", cmd, x(p[0]), y(p[1]))
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" %s/>`+"\n", strings.TrimSpace(path.String()), style)
	}
	var ideal, got [][2]float64
	for _, p := range r.Points {
		ideal = append(ideal, [2]float64{float64(p.Workers), p.Ideal})
		got = append(got, [2]float64{float64(p.Workers), p.Speedup})
	}
	line(ideal, `stroke="#999" stroke-width="2" stroke-dasharray="6 4"`)
	line(got, `stroke="#1f77b4" stroke-width="2.5"`)
	for _, p := range r.Points {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="#1f77b4"/>`+"\n", x(float64(p.Workers)), y(p.Speedup))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#1f77b4">%.1fx</text>`+"\n", x(float64(p.Workers)), y(p.Speedup)+18, p.Speedup)
	}
	// Legend.
	lx0, ly0 := left+16, top+12
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999" stroke-width="2" stroke-dasharray="6 4"/>`+"\n", lx0, ly0, lx0+28, ly0)
	fmt.Fprintf(&b, `<text x="%d" y="%d">ideal (speedup = workers)</text>`+"\n", lx0+36, ly0+4)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#1f77b4" stroke-width="2.5"/>`+"\n", lx0, ly0+18, lx0+28, ly0+18)
	fmt.Fprintf(&b, `<text x="%d" y="%d">measured</text>`+"\n", lx0+36, ly0+22)
	b.WriteString("</svg>\n")
	return b.String()
}
