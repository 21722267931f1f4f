package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ab measures the minimal handler (internal/abserve) built against the previous release
// and against the current tree, side by side on one PostgreSQL server (scripts/bench-ab
// builds both): the README's path, the lease path and replays, each in rounds that
// interleave the two builds (previous then current in odd rounds, current then previous
// in even ones), and, beside the current build's lease path in each round, the
// hand-written floor of a new key (two transactions, and pipelined). It prints a
// Markdown report, and fails (errRegression) when the current build is slower on a
// workload than the rounds' own spread allows (slower).

// abWorkload is one workload that both builds serve.
type abWorkload struct {
	name string
	args []string
}

// abWorkloads are the A/B's comparisons.
func abWorkloads(keys int64) []abWorkload {
	k := fmt.Sprint(keys)
	return []abWorkload{
		{"new key, Respond on a ClaimInHandler route (the README's path)", []string{"--path", "/respond"}},
		{"new key, lease path: claim, then InTx", []string{"--path", "/intx"}},
		{"new key, lease path: claim, then Respond", []string{"--path", "/lease"}},
		{"replay across " + k + " keys (ClaimInHandler route)", []string{"--path", "/respond", "--keys", k, "--prefix", "replay"}},
	}
}

// abFloors are the hand-written floors, each measured beside the current build's lease
// path that sends as many round trips' worth of interaction (abFloorOf): InTx, whose
// handler's statements are interactive, beside the floor of two interactive
// transactions; Respond, whose statements go in one batch, beside the pipelined floor.
var abFloors = []abWorkload{
	{"floor: two transactions", []string{"--path", "/floor"}},
	{"floor: two transactions, the second pipelined", []string{"--path", "/floor-pipelined"}},
}

// abFloorOf is the index in abWorkloads of the lease path that each floor is measured
// beside.
var abFloorOf = []int{1, 2}

// errRegression is ab's error when the current build is slower.
var errRegression = errors.New("the current build is slower than the previous release (see the report)")

// abResult is the JSON of an A/B run (--json).
type abResult struct {
	Previous    string     `json:"previous"`
	Current     string     `json:"current"`
	Rounds      int        `json:"rounds"`
	Duration    string     `json:"duration"`
	Concurrency int        `json:"concurrency"`
	Workloads   []abSeries `json:"workloads"`
	Floors      []abSeries `json:"floors"`
	Regressions []string   `json:"regressions"`
}

// abSeries is one comparison's runs, round by round: B against A. The CPU times are
// µs per request.
type abSeries struct {
	Name      string    `json:"name"`
	A         []float64 `json:"a"` // req/s per round: the previous build, or the floor
	B         []float64 `json:"b"` // the current build
	ServerA   []float64 `json:"server_cpu_a"`
	ServerB   []float64 `json:"server_cpu_b"`
	PostgresA []float64 `json:"postgres_cpu_a"`
	PostgresB []float64 `json:"postgres_cpu_b"`
	Ratios    []float64 `json:"ratios"`
	Median    float64   `json:"median"`
	Spread    float64   `json:"spread"`
	Slower    bool      `json:"slower"`
}

// abRun is one run's rate and CPU times per request.
type abRun struct{ rate, server, postgres float64 }

func (s *abSeries) addA(r abRun) {
	s.A, s.ServerA, s.PostgresA = append(s.A, r.rate), append(s.ServerA, r.server), append(s.PostgresA, r.postgres)
}

func (s *abSeries) addB(r abRun) {
	s.B, s.ServerB, s.PostgresB = append(s.B, r.rate), append(s.ServerB, r.server), append(s.PostgresB, r.postgres)
}

// compare fills s's verdict from its rates (compare).
func (s *abSeries) compare(name string) {
	c := compare(name, s.A, s.B)
	s.Name, s.Ratios, s.Median, s.Spread, s.Slower = c.Name, c.Ratios, c.Median, c.Spread, c.Slower
}

func runAB(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ab", flag.ContinueOnError)
	prev := fs.String("previous", "", "the handler built against the previous release (required)")
	cur := fs.String("current", "", "the handler built against the current tree (required)")
	prevName := fs.String("previous-name", "previous", "what the report calls the previous build")
	curName := fs.String("current-name", "current", "what the report calls the current build")
	server := fs.String("postgres", "postgres://postgres@127.0.0.1:5432", "PostgreSQL server URL without a database: ab makes one per build and drops them")
	d := fs.Duration("duration", 6*time.Second, "duration of each run")
	rounds := fs.Int("rounds", 5, "rounds of interleaved runs")
	concurrency := fs.Int("concurrency", 32, "concurrent workers of each run, and connections of each build's pool")
	keys := fs.Int64("keys", 10000, "keys the replays draw from")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prev == "" || *cur == "" {
		return errors.New("--previous and --current are required")
	}
	admin, err := pgx.Connect(ctx, mustDatabase(*server, "postgres"))
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	bases := make([]string, 2)
	meters := make([]*cpuMeter, 2)
	for i, bin := range []string{*prev, *cur} {
		db := fmt.Sprintf("idem_bench_ab_%d_%d", i, os.Getpid())
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			return err
		}
		defer func() {
			_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		}()
		base, stop, pid, err := startProgram(ctx, []string{"previous", "current"}[i], bin, "--db", mustDatabase(*server, db), "--pool", fmt.Sprint(*concurrency))
		if err != nil {
			return err
		}
		defer stop()
		bases[i], meters[i] = base, &cpuMeter{admin: admin, db: db, pid: pid}
		f := loadFlags{url: base, path: "/respond", prefix: "replay", token: "tok_bench", keys: *keys, concurrency: *concurrency}
		if err := f.prepare(ctx); err != nil {
			return err
		}
	}
	ws := abWorkloads(*keys)
	// run is one measured run against build i: its rate, and its CPU time per request.
	run := func(i int, a []string) (abRun, error) {
		before, err := meters[i].read(ctx)
		if err != nil {
			return abRun{}, err
		}
		s, err := measure(ctx, bases[i], a, *concurrency, *d)
		if err != nil {
			return abRun{}, err
		}
		after, err := meters[i].read(ctx)
		if err != nil {
			return abRun{}, err
		}
		r := abRun{rate: s.RequestsPerSecond}
		r.server, r.postgres = perRequest(before, after, s.Requests)
		return r, nil
	}
	// Warm both builds up, unmeasured: connections, prepared statements, pages.
	for _, w := range append(slices.Clone(ws), abFloors...) {
		for _, base := range bases {
			if _, err := measure(ctx, base, w.args, *concurrency, time.Second); err != nil && !strings.HasPrefix(w.args[1], "/floor") {
				return err
			}
		}
	}
	series := make([]abSeries, len(ws))
	floors := make([]abSeries, len(abFloors))
	for r := 1; r <= *rounds; r++ {
		for i, w := range ws {
			// The runs of this workload in this round: each build, and the floors
			// beside the lease path; reversed in even rounds.
			type cell struct {
				build int
				args  []string
				put   func(abRun)
			}
			cells := []cell{
				{0, w.args, series[i].addA},
				{1, w.args, series[i].addB},
			}
			for j, f := range abFloors {
				if abFloorOf[j] == i {
					cells = append(cells, cell{1, f.args, floors[j].addA})
				}
			}
			if r%2 == 0 {
				slices.Reverse(cells)
			}
			for _, c := range cells {
				v, err := run(c.build, c.args)
				if err != nil {
					return err
				}
				c.put(v)
			}
			logf("round %d, %s: previous %.0f, current %.0f req/s", r, w.name, series[i].A[r-1], series[i].B[r-1])
		}
	}
	res := &abResult{Previous: *prevName, Current: *curName, Rounds: *rounds, Duration: d.String(), Concurrency: *concurrency}
	for i, w := range ws {
		s := series[i]
		s.compare(w.name)
		if s.Slower {
			res.Regressions = append(res.Regressions, w.name)
		}
		res.Workloads = append(res.Workloads, s)
	}
	for j, f := range abFloors {
		s := floors[j]
		lease := series[abFloorOf[j]]
		s.B, s.ServerB, s.PostgresB = lease.B, lease.ServerB, lease.PostgresB
		s.compare(f.name)
		res.Floors = append(res.Floors, s)
	}
	writeABReport(os.Stdout, res)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if len(res.Regressions) > 0 {
		return errRegression
	}
	return nil
}

// slowerBelow is the median ratio under which a workload can count as slower: smaller
// differences are within what the same build measures from one day to the next.
const slowerBelow = 0.97

// compare is b against a, round by round: the ratios b/a of each round, their median,
// and their spread, the median absolute deviation of the ratios from their median
// (the rounds' own noise, which one wild round does not widen). b is slower when its
// median ratio is under slowerBelow and under 1 by more than the spread: a median of
// 0.91 whose rounds agree within ±0.09 is slower; one whose rounds scatter over ±0.1
// is not known to be.
func compare(name string, a, b []float64) abSeries {
	s := abSeries{Name: name, A: a, B: b}
	for i := range min(len(a), len(b)) {
		s.Ratios = append(s.Ratios, b[i]/a[i])
	}
	s.Median = median(s.Ratios)
	dev := make([]float64, len(s.Ratios))
	for i, r := range s.Ratios {
		dev[i] = math.Abs(r - s.Median)
	}
	s.Spread = median(dev)
	s.Slower = s.Median < slowerBelow && 1-s.Median > s.Spread
	return s
}

// median is the median of v (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Sorted(slices.Values(v))
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// rangeOf is "min–max" of v, formatted with format.
func rangeOf(v []float64, format string) string {
	if len(v) == 0 {
		return ""
	}
	return fmt.Sprintf(format+"–"+format, slices.Min(v), slices.Max(v))
}

// writeABReport writes res as Markdown: medians and ranges, benchstat-style.
func writeABReport(w io.Writer, res *abResult) {
	fmt.Fprintf(w, "| workload | %s req/s: median (range) | %s req/s: median (range) | %s / %s per round | median | spread | verdict |\n",
		res.Previous, res.Current, res.Current, res.Previous)
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|\n")
	for _, s := range res.Workloads {
		verdict := "not slower"
		if s.Slower {
			verdict = "**slower**"
		}
		fmt.Fprintf(w, "| %s | %.0f (%s) | %.0f (%s) | %s | **%.3f** | ±%.3f | %s |\n", s.Name,
			median(s.A), rangeOf(s.A, "%.0f"), median(s.B), rangeOf(s.B, "%.0f"), ratios(s.Ratios), s.Median, s.Spread, verdict)
	}
	fmt.Fprintf(w, "\n| %s's lease path, new keys | against the hand-written | floor req/s: median (range) | per round | median | range |\n", res.Current)
	fmt.Fprintf(w, "|---|---|---|---|---|---|\n")
	for j, s := range res.Floors {
		fmt.Fprintf(w, "| %s | %s | %.0f (%s) | %s | **%.3f** | %s |\n", res.Workloads[abFloorOf[j]].Name, s.Name,
			median(s.A), rangeOf(s.A, "%.0f"), ratios(s.Ratios), s.Median, rangeOf(s.Ratios, "%.2f"))
	}
	fmt.Fprintf(w, "\n| CPU time per request, µs: median (range) | %s's server | %s's server | %s's PostgreSQL | %s's PostgreSQL |\n",
		res.Previous, res.Current, res.Previous, res.Current)
	fmt.Fprintf(w, "|---|---|---|---|---|\n")
	for _, s := range res.Workloads {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", s.Name, cpu(s.ServerA), cpu(s.ServerB), cpu(s.PostgresA), cpu(s.PostgresB))
	}
	for _, s := range res.Floors {
		fmt.Fprintf(w, "| %s (on %s's build) | | %s | | %s |\n", s.Name, res.Current, cpu(s.ServerA), cpu(s.PostgresA))
	}
	fmt.Fprintf(w, "\n%d interleaved rounds of %s per run, %d clients, one pool of %d connections per build.\n",
		res.Rounds, res.Duration, res.Concurrency, res.Concurrency)
	if len(res.Regressions) > 0 {
		fmt.Fprintf(w, "\n**Slower than %s:** %s.\n", res.Previous, strings.Join(res.Regressions, "; "))
	}
}

// ratios is the per-round ratios, " · "-separated.
func ratios(v []float64) string {
	s := make([]string, len(v))
	for i, r := range v {
		s[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(s, " · ")
}

// cpuMeter reads the CPU time that one build has used: its server process's (from
// /proc, all threads) and its PostgreSQL backends' (the sessions of its database, from
// /proc/PID/schedstat: the benchmark runs on the database's machine). On a machine that
// others share, CPU time per request moves less than requests per second.
type cpuMeter struct {
	admin *pgx.Conn
	db    string
	pid   int
}

// cpuTimes are a build's CPU times so far, in seconds, per PostgreSQL backend.
type cpuTimes struct {
	server   float64
	backends map[int]float64
}

func (m *cpuMeter) read(ctx context.Context) (cpuTimes, error) {
	t := cpuTimes{backends: map[int]float64{}}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.pid))
	if err != nil {
		return t, err
	}
	// The fields after the command's closing parenthesis: utime and stime are the
	// 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ut, st float64
	if _, err := fmt.Sscan(f[11]+" "+f[12], &ut, &st); err != nil {
		return t, err
	}
	t.server = (ut + st) / 100
	rows, err := m.admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`, m.db)
	if err != nil {
		return t, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return t, err
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			continue // gone, or not on this machine
		}
		var ns float64
		if _, err := fmt.Sscan(string(b), &ns); err == nil {
			t.backends[int(pid)] = ns / 1e9
		}
	}
	return t, nil
}

// perRequest is the CPU time per request between before and after, in µs: the
// server's, and its backends' (those that exited in between are not counted).
func perRequest(before, after cpuTimes, requests int64) (server, backends float64) {
	if requests == 0 {
		return 0, 0
	}
	var pg float64
	for pid, t := range after.backends {
		pg += t - before.backends[pid]
	}
	n := float64(requests)
	return (after.server - before.server) * 1e6 / n, pg * 1e6 / n
}

// cpu is "median (min–max)" of CPU times.
func cpu(v []float64) string {
	if len(v) == 0 {
		return ""
	}
	return fmt.Sprintf("%.0f (%s)", median(v), rangeOf(v, "%.0f"))
}
