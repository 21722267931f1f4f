package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// minimal runs the minimal handler's workloads side by side: it makes a database, starts
// `benchtool serve` on it as a child process (the load generator is this process, as wrk
// would be), prepares the keys that replays resend, and runs each pair of a baseline and
// an idempotent workload interleaved (A then B in odd rounds, B then A in even ones).
// With --records it then fills the store to that many records and runs the pairs
// marked atScale again.

// pair is one comparison: the idempotent workload against its baseline.
type pair struct {
	Name    string `json:"name"`
	Group   string `json:"group"`
	Base    string `json:"baseline"`
	Target  string `json:"target"`
	baseArg []string
	idemArg []string
	atScale bool
}

// pairs are the minimal handler's comparisons, with their targets: issue 21's for new
// keys and a ClaimInHandler route's replays, issue 13's for the rest.
func pairs(keys int64) []pair {
	k := fmt.Sprint(keys)
	return []pair{
		{Name: "new key, Respond on a ClaimInHandler route (the README's path)", Group: "new", Base: "plain INSERT", Target: "0.60",
			baseArg: []string{"--path", "/plain"}, idemArg: []string{"--path", "/respond"}, atScale: true},
		{Name: "new key, lease path: claim, then Respond", Group: "new", Base: "plain INSERT", Target: "0.40",
			baseArg: []string{"--path", "/plain"}, idemArg: []string{"--path", "/lease"}},
		{Name: "new key, lease path: claim, then InTx", Group: "new", Base: "plain INSERT", Target: "0.40",
			baseArg: []string{"--path", "/plain"}, idemArg: []string{"--path", "/intx"}},
		{Name: "replay of 1 key (lease route)", Group: "replay", Base: "GET of 1 id", Target: "0.90",
			baseArg: []string{"--get", "--keys", "1", "--prefix", "respond-1"}, idemArg: []string{"--path", "/lease", "--keys", "1", "--prefix", "lease-1"}},
		{Name: "replay across " + k + " keys (lease route)", Group: "replay", Base: "GET of " + k + " ids", Target: "0.90",
			baseArg: []string{"--get", "--keys", k, "--prefix", "respond-n"}, idemArg: []string{"--path", "/lease", "--keys", k, "--prefix", "lease-n"}, atScale: true},
		{Name: "replay of 1 key (ClaimInHandler route)", Group: "replay", Base: "GET of 1 id", Target: "0.80",
			baseArg: []string{"--get", "--keys", "1", "--prefix", "respond-1"}, idemArg: []string{"--path", "/respond", "--keys", "1", "--prefix", "respond-1"}},
		{Name: "replay across " + k + " keys (ClaimInHandler route)", Group: "replay", Base: "GET of " + k + " ids", Target: "0.80",
			baseArg: []string{"--get", "--keys", k, "--prefix", "respond-n"}, idemArg: []string{"--path", "/respond", "--keys", k, "--prefix", "respond-n"}, atScale: true},
		{Name: "replay of 1 key from the replay cache", Group: "replay", Base: "GET of 1 id", Target: "2",
			baseArg: []string{"--get", "--keys", "1", "--prefix", "respond-1"}, idemArg: []string{"--path", "/cached", "--keys", "1", "--prefix", "cached-1"}},
	}
}

// pairResult is a pair's figures: each side's mean over the rounds.
type pairResult struct {
	pair
	Records int64    `json:"records"`
	Base    *summary `json:"base"`
	Idem    *summary `json:"idem"`
	Ratio   float64  `json:"ratio"`
}

// minimalResults is the JSON that minimal writes.
type minimalResults struct {
	Concurrency int          `json:"concurrency"`
	Duration    string       `json:"duration"`
	Rounds      int          `json:"rounds"`
	Pairs       []pairResult `json:"pairs"`
}

func runMinimal(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("minimal", flag.ContinueOnError)
	server := fs.String("postgres", "postgres://postgres@127.0.0.1:5432", "PostgreSQL server URL without a database: minimal makes its own and drops it")
	d := fs.Duration("duration", 10*time.Second, "duration of each run")
	rounds := fs.Int("rounds", 2, "rounds of interleaved runs")
	concurrency := fs.Int("concurrency", 32, "concurrent workers of each run")
	keys := fs.Int64("keys", 10000, "keys the replays across many keys draw from")
	records := fs.Int64("records", 10_000_000, "then fill the store to this many records and run the pairs at scale again (0: skip)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	db := fmt.Sprintf("idem_bench_min_%d", os.Getpid())
	dbURL, err := withDatabase(*server, db)
	if err != nil {
		return err
	}
	admin, err := pgx.Connect(ctx, mustDatabase(*server, "postgres"))
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return err
	}
	defer func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
	}()
	base, stop, err := startServer(ctx, dbURL, *concurrency)
	if err != nil {
		return err
	}
	defer stop()
	cm := &meter{admin: admin, db: db, base: base}
	logf("server on %s, database %s", base, db)
	for _, p := range []struct {
		path, prefix string
		n            int64
	}{{"/respond", "respond-1", 1}, {"/respond", "respond-n", *keys}, {"/lease", "lease-1", 1}, {"/lease", "lease-n", *keys}, {"/cached", "cached-1", 1}} {
		f := loadFlags{url: base, path: p.path, prefix: p.prefix, token: "tok_bench", keys: p.n, concurrency: 32}
		if err := f.prepare(ctx); err != nil {
			return err
		}
	}
	res := &minimalResults{Concurrency: *concurrency, Duration: d.String(), Rounds: *rounds}
	run := func(ps []pair, n int64) error {
		// Warm every path up, unmeasured: connections, prepared statements, pages.
		for _, p := range ps {
			for _, a := range [][]string{p.baseArg, p.idemArg} {
				if _, err := measure(ctx, base, a, *concurrency, time.Second); err != nil {
					return err
				}
			}
		}
		sums, err := interleave(ps, *rounds, func(r int, p pair, side int, args []string) (*summary, error) {
			s, err := cm.measure(ctx, args, *concurrency, *d)
			if err == nil {
				logf("round %d, %s, %s: %.0f req/s, p99 %.2f ms, %.2f commits, %.2f WAL records, %.2f WAL syncs per request",
					r, p.Name, []string{"baseline", "idem"}[side], s.RequestsPerSecond, s.P99, s.Cost.Commits, s.Cost.WALRecords, s.Cost.WALSyncs)
			}
			return s, err
		})
		if err != nil {
			return err
		}
		for i, p := range ps {
			b, m := mean(sums[i][0]), mean(sums[i][1])
			res.Pairs = append(res.Pairs, pairResult{pair: p, Records: n, Base: b, Idem: m, Ratio: m.RequestsPerSecond / b.RequestsPerSecond})
		}
		return nil
	}
	n, err := countRecords(ctx, dbURL)
	if err != nil {
		return err
	}
	if err := run(pairs(*keys), n); err != nil {
		return err
	}
	if *records > 0 {
		st, err := openScaleStore(ctx, dbURL, false)
		if err != nil {
			return err
		}
		n, err := countRecords(ctx, dbURL)
		if err == nil && n < *records {
			logf("filling the store to %d records", *records)
			err = st.fill(ctx, 0, *records-n, false)
		}
		st.close()
		if err != nil {
			return err
		}
		var at []pair
		for _, p := range pairs(*keys) {
			if p.atScale {
				at = append(at, p)
			}
		}
		if n, err = countRecords(ctx, dbURL); err != nil {
			return err
		}
		if err := run(at, n); err != nil {
			return err
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// interleave runs each pair's baseline and idempotent side rounds times, A then B in
// odd rounds and B then A in even ones, and returns each side's runs by pair.
func interleave(ps []pair, rounds int, run func(round int, p pair, side int, args []string) (*summary, error)) ([][2][]*summary, error) {
	sums := make([][2][]*summary, len(ps))
	for r := 1; r <= rounds; r++ {
		for i, p := range ps {
			order := []int{0, 1}
			if r%2 == 0 {
				order = []int{1, 0}
			}
			for _, side := range order {
				args := p.baseArg
				if side == 1 {
					args = p.idemArg
				}
				s, err := run(r, p, side, args)
				if err != nil {
					return nil, err
				}
				sums[i][side] = append(sums[i][side], s)
			}
		}
	}
	return sums, nil
}

// measure is one run of the load against base.
func measure(ctx context.Context, base string, args []string, concurrency int, d time.Duration) (*summary, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	var f loadFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	f.url, f.concurrency, f.duration = base, concurrency, d
	s, err := f.run(ctx)
	if err == nil && s.Errors > 0 {
		err = fmt.Errorf("%s: %d of %d requests failed (%v)", strings.Join(args, " "), s.Errors, s.Requests, s.Statuses)
	}
	return s, err
}

// mean is the runs' mean: of their rates and of their percentiles.
func mean(ss []*summary) *summary {
	m := &summary{Path: ss[0].Path, Keys: ss[0].Keys, Concurrency: ss[0].Concurrency}
	for _, s := range ss {
		m.Requests += s.Requests
		m.Seconds += s.Seconds
		m.RequestsPerSecond += s.RequestsPerSecond / float64(len(ss))
		m.P50 += s.P50 / float64(len(ss))
		m.P90 += s.P90 / float64(len(ss))
		m.P99 += s.P99 / float64(len(ss))
		m.Max = max(m.Max, s.Max)
		m.Replayed += s.Replayed
	}
	m.Cost = meanCost(ss)
	return m
}

// startServer starts `benchtool serve` on dbURL and returns its base URL.
func startServer(ctx context.Context, dbURL string, pool int) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	base, stop, _, err := startProgram(ctx, "serve", self, "serve", "--db", dbURL, "--pool", fmt.Sprint(pool))
	return base, stop, err
}

// startProgram starts the server bin with args, whose stderr names where it listens
// ("… listening addr=HOST:PORT"), and returns its base URL and its process id; the rest
// of its stderr is copied to ours, each line led by name.
func startProgram(ctx context.Context, name, bin string, args ...string) (string, func(), int, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, 0, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if _, addr, ok := strings.Cut(sc.Text(), " listening addr="); ok {
			go func() {
				for sc.Scan() {
					fmt.Fprintln(os.Stderr, name+":", sc.Text())
				}
			}()
			return "http://" + addr, stop, cmd.Process.Pid, nil
		}
		fmt.Fprintln(os.Stderr, name+":", sc.Text())
	}
	stop()
	return "", nil, 0, fmt.Errorf("%s did not start", bin)
}

// prepare sends each of f's keys once (benchtool prepare).
func (f *loadFlags) prepare(ctx context.Context) error {
	return prepareKeys(ctx, f)
}

func countRecords(ctx context.Context, dbURL string) (int64, error) {
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	var n int64
	err = c.QueryRow(ctx, `SELECT count(*) FROM idem_records`).Scan(&n)
	return n, err
}

// withDatabase is the server URL with its database set to db.
func withDatabase(server, db string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", fmt.Errorf("--postgres: %w", err)
	}
	u.Path = "/" + db
	return u.String(), nil
}

func mustDatabase(server, db string) string {
	s, err := withDatabase(server, db)
	if err != nil {
		panic(err)
	}
	return s
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchtool: "+format+"\n", args...)
}
