package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// chart draws the results of a scripts/bench run as one SVG, written by hand (no
// dependency): the idempotent paths' throughput as a share of their baselines', with
// their targets, and the stores' claim and lookup latency by table size.

func runChart(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("chart", flag.ContinueOnError)
	minimal := fs.String("minimal", "", "JSON of benchtool minimal")
	scale := fs.String("scale", "", "JSON lines of benchtool scale, one file or several separated by commas")
	out := fs.String("out", "", "the SVG to write (default: standard output)")
	title := fs.String("title", "What idempotency costs", "the chart's title")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m, steps, _, err := readResults(*minimal, *scale, "")
	if err != nil {
		return err
	}
	if len(m.Pairs) == 0 && len(steps) == 0 {
		return errors.New("nothing to draw: give --minimal or --scale")
	}
	w := io.Writer(os.Stdout)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	return drawChart(w, *title, m, steps)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func readSteps(path string) ([]step, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var steps []step
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var s step
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		steps = append(steps, s)
	}
	return steps, sc.Err()
}

// svg accumulates the drawing.
type svg struct{ strings.Builder }

func (s *svg) f(format string, args ...any) { fmt.Fprintf(&s.Builder, format, args...) }

func (s *svg) text(x, y float64, anchor, class, t string) {
	s.f(`<text x="%.1f" y="%.1f" text-anchor="%s" class="%s">%s</text>`+"\n", x, y, anchor, class, html.EscapeString(t))
}

// chartWidth is the chart's width, unless the labels of the bars need more.
const (
	chartWidth = 960.0
	colNew     = "#2f6db5"
	colReplay  = "#3a9a5b"
	colTarget  = "#c0392b"
)

func drawChart(w io.Writer, title string, m minimalResults, steps []step) error {
	var s svg
	y := 40.0
	body := &svg{}
	width := chartWidth
	if len(m.Pairs) > 0 {
		y, width = drawRatios(body, y, m)
		y = drawCosts(body, y+20, width, m)
	}
	if len(steps) > 0 {
		y = drawScale(body, y+20, width, steps)
	}
	s.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="system-ui, -apple-system, 'Segoe UI', sans-serif">`+"\n",
		width, y+20, width, y+20)
	s.WriteString(`<style>
text { font-size: 12px; fill: #222; }
.title { font-size: 18px; font-weight: 600; }
.head { font-size: 14px; font-weight: 600; }
.note { font-size: 11px; fill: #555; }
.value { font-size: 11px; font-weight: 600; }
.target { font-size: 10px; fill: ` + colTarget + `; }
.axis { stroke: #888; stroke-width: 1; }
.grid { stroke: #ddd; stroke-width: 1; }
</style>
<rect width="100%" height="100%" fill="white"/>
`)
	s.text(width/2, 26, "middle", "title", title)
	s.WriteString(body.String())
	s.f("</svg>\n")
	_, err := io.WriteString(w, s.String())
	return err
}

// drawRatios draws one bar per pair: idempotent req/s over the baseline's, with the
// target as a red tick. It returns the y below it and the width the labels needed.
func drawRatios(s *svg, y float64, m minimalResults) (float64, float64) {
	s.text(20, y+8, "start", "head", "Throughput of each idempotent path, as a share of its baseline (PostgreSQL, the same run, interleaved)")
	s.text(20, y+24, "start", "note", fmt.Sprintf("%d concurrent clients, %s runs, %d rounds; the minimal handler INSERTs one row and answers 201; replays against GET by primary key",
		m.Concurrency, m.Duration, m.Rounds))
	y += 40
	// A pair run again once the store was filled says at how many records; the others
	// ran on the records the replays needed.
	fewest := int64(math.MaxInt64)
	for _, p := range m.Pairs {
		fewest = min(fewest, p.Records)
	}
	labels := make([]string, len(m.Pairs))
	longest := 0
	for i, p := range m.Pairs {
		labels[i] = p.Name
		if p.Records > fewest {
			labels[i] += fmt.Sprintf(", at %s records", human(p.Records))
		}
		longest = max(longest, len([]rune(labels[i])))
	}
	// About 6.5 px a character at 12 px: the labels end where the bars start.
	left := math.Max(300, 20+6.5*float64(longest)+8)
	width := math.Max(chartWidth, left+560)
	right := width - 70
	maxRatio := 1.0
	for _, p := range m.Pairs {
		t, _ := strconv.ParseFloat(p.Target, 64)
		maxRatio = math.Max(maxRatio, math.Max(p.Ratio, t))
	}
	maxRatio = math.Ceil(maxRatio*2) / 2
	scale := (right - left) / maxRatio
	const rowH = 24.0
	top := y
	for i, p := range m.Pairs {
		ry := y + float64(i)*rowH
		s.text(left-8, ry+15, "end", "", labels[i])
		col := colNew
		if p.Group == "replay" {
			col = colReplay
		}
		s.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" rx="2"/>`+"\n", left, ry+4, math.Max(p.Ratio*scale, 1), rowH-8, col)
		end := left + p.Ratio*scale
		if t, err := strconv.ParseFloat(p.Target, 64); err == nil {
			tx := left + t*scale
			s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"/>`+"\n", tx, ry+1, tx, ry+rowH-1, colTarget)
			// The value goes right of the tick when the bar ends near it.
			if tx > end-4 && tx < end+44 {
				end = tx
			}
		}
		s.text(end+6, ry+16, "start", "value", fmt.Sprintf("%.2f×", p.Ratio))
	}
	bottom := y + float64(len(m.Pairs))*rowH
	for v := 0.0; v <= maxRatio+1e-9; v += 0.5 {
		x := left + v*scale
		s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`+"\n", x, top, x, bottom)
		s.text(x, bottom+14, "middle", "note", fmt.Sprintf("%.1f×", v))
	}
	s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="axis"/>`+"\n", left, top, left, bottom)
	ly := bottom + 32
	legend := []struct{ col, text string }{{colNew, "new keys, vs a plain INSERT"}, {colReplay, "replays, vs GET by id"}, {colTarget, "target (issues 13, 21)"}}
	x := left
	for _, l := range legend {
		s.f(`<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`+"\n", x, ly-10, l.col)
		s.text(x+18, ly, "start", "note", l.text)
		x += 190
	}
	return ly + 10, width
}

// drawCosts draws what a new key costs PostgreSQL per request on each path, against the
// plain INSERT: WAL records as bars, commits and WAL syncs beside them. It draws
// nothing for a run without costs.
func drawCosts(s *svg, y, width float64, m minimalResults) float64 {
	type row struct {
		label string
		c     *cost
	}
	var rows []row
	for _, p := range m.Pairs {
		if p.Group != "new" || p.Base.Cost == nil || p.Idem.Cost == nil || p.Records > m.Pairs[0].Records {
			continue
		}
		if len(rows) == 0 {
			rows = append(rows, row{"plain INSERT (baseline)", p.Base.Cost})
		}
		rows = append(rows, row{p.Name, p.Idem.Cost})
	}
	if len(rows) == 0 {
		return y
	}
	s.text(20, y+8, "start", "head", "What a new key costs PostgreSQL per request (its own counters, the same run)")
	s.text(20, y+24, "start", "note", "bars: WAL records (pg_stat_wal); beside them commits (pg_stat_database) and WAL syncs; benchtool wal names each record")
	y += 40
	longest := 0
	maxWAL := 1.0
	for _, r := range rows {
		longest = max(longest, len([]rune(r.label)))
		maxWAL = math.Max(maxWAL, r.c.WALRecords)
	}
	left := math.Max(300, 20+6.5*float64(longest)+8)
	right := width - 260
	scale := (right - left) / math.Ceil(maxWAL)
	const rowH = 24.0
	for i, r := range rows {
		ry := y + float64(i)*rowH
		s.text(left-8, ry+15, "end", "", r.label)
		col := colNew
		if i == 0 {
			col = "#999"
		}
		s.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" rx="2"/>`+"\n", left, ry+4, math.Max(r.c.WALRecords*scale, 1), rowH-8, col)
		s.text(left+r.c.WALRecords*scale+6, ry+16, "start", "value",
			fmt.Sprintf("%.1f WAL records, %.2f commits, %.2f syncs", r.c.WALRecords, r.c.Commits, r.c.WALSyncs))
	}
	return y + float64(len(rows))*rowH + 10
}

// drawScale draws claim and lookup latency (p50 and p99) against the table's size, one
// panel per store, on logarithmic axes.
func drawScale(s *svg, y, width float64, steps []step) float64 {
	s.text(20, y+8, "start", "head", "Claim and lookup latency by table size (log scales)")
	s.text(20, y+24, "start", "note", "the store's own calls, 8 workers; a lookup is a replay's claim of a random stored key, a claim a new key's claim and completion")
	y += 60
	stores := []string{}
	for _, st := range steps {
		if !contains(stores, st.Store) {
			stores = append(stores, st.Store)
		}
	}
	const panelH, gap = 240.0, 40.0
	panelW := (width - 80 - gap*float64(len(stores)-1)) / float64(len(stores))
	minMS, maxMS := math.Inf(1), 0.0
	minN, maxN := math.Inf(1), 0.0
	for _, st := range steps {
		for _, v := range []float64{st.Lookup.P50, st.Lookup.P99, st.Claim.P50, st.Claim.P99} {
			if v > 0 {
				minMS, maxMS = math.Min(minMS, v), math.Max(maxMS, v)
			}
		}
		minN, maxN = math.Min(minN, float64(st.Records)), math.Max(maxN, float64(st.Records))
	}
	lo, hi := math.Floor(math.Log10(minMS)), math.Ceil(math.Log10(maxMS))
	nlo, nhi := math.Floor(math.Log10(minN)), math.Ceil(math.Log10(maxN))
	if nhi == nlo {
		nhi++
	}
	series := []struct {
		name string
		col  string
		dash string
		get  func(st step) float64
	}{
		{"lookup p50", colReplay, "", func(st step) float64 { return st.Lookup.P50 }},
		{"lookup p99", colReplay, "5,3", func(st step) float64 { return st.Lookup.P99 }},
		{"claim p50", colNew, "", func(st step) float64 { return st.Claim.P50 }},
		{"claim p99", colNew, "5,3", func(st step) float64 { return st.Claim.P99 }},
	}
	for i, name := range stores {
		x0 := 60 + float64(i)*(panelW+gap)
		px := func(n float64) float64 { return x0 + (math.Log10(n)-nlo)/(nhi-nlo)*panelW }
		py := func(ms float64) float64 { return y + panelH - (math.Log10(ms)-lo)/(hi-lo)*panelH }
		title := map[string]string{"postgres": "PostgreSQL", "sqlite": "SQLite"}[name]
		s.text(x0+panelW/2, y-2, "middle", "head", title)
		for e := lo; e <= hi; e++ {
			yy := py(math.Pow(10, e))
			s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`+"\n", x0, yy, x0+panelW, yy)
			s.text(x0-6, yy+4, "end", "note", msLabel(math.Pow(10, e)))
		}
		for e := nlo; e <= nhi; e++ {
			xx := px(math.Pow(10, e))
			s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`+"\n", xx, y, xx, y+panelH)
			s.text(xx, y+panelH+14, "middle", "note", human(int64(math.Pow(10, e))))
		}
		s.text(x0+panelW/2, y+panelH+30, "middle", "note", "records in the table")
		for _, se := range series {
			var pts []string
			for _, st := range steps {
				if st.Store != name || se.get(st) <= 0 {
					continue
				}
				xx, yy := px(float64(st.Records)), py(se.get(st))
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xx, yy))
				s.f(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xx, yy, se.col)
			}
			if len(pts) > 1 {
				s.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`+"\n", strings.Join(pts, " "), se.col, se.dash)
			}
		}
	}
	ly := y + panelH + 52
	x := 60.0
	for _, se := range series {
		s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`+"\n", x, ly-4, x+24, ly-4, se.col, se.dash)
		s.text(x+30, ly, "start", "note", se.name)
		x += 140
	}
	return ly + 10
}

func msLabel(ms float64) string {
	if ms < 1 {
		return strconv.FormatFloat(ms, 'f', -1, 64) + " ms"
	}
	return strconv.FormatFloat(ms, 'f', 0, 64) + " ms"
}

// human writes n as 10k, 1M: the sizes of the steps.
func human(n int64) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.FormatInt(n/1_000_000, 10) + "M"
	case n >= 1_000_000:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.FormatInt(n/1000, 10) + "k"
	case n >= 1000:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatInt(n, 10)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
