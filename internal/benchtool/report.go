package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// report writes the Markdown of a scripts/bench run's minimal, scale and cleanup
// results: the sections that scripts/bench appends to docs/benchmarks.md.

func runReport(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	minimal := fs.String("minimal", "", "JSON of benchtool minimal")
	scale := fs.String("scale", "", "JSON lines of benchtool scale, files separated by commas")
	cleanup := fs.String("cleanup", "", "JSON of benchtool cleanup, files separated by commas")
	chart := fs.String("chart", "", "the chart's file name, to link")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m, steps, runs, err := readResults(*minimal, *scale, *cleanup)
	if err != nil {
		return err
	}
	w := os.Stdout
	if len(m.Pairs) > 0 {
		reportMinimal(w, m, *chart)
	}
	if len(steps) > 0 {
		reportScale(w, steps)
	}
	if len(runs) > 0 {
		reportCleanup(w, runs)
	}
	if len(m.Pairs) == 0 && len(steps) == 0 && len(runs) == 0 {
		return errors.New("nothing to report")
	}
	return nil
}

// readResults reads the results of a run: benchtool minimal's JSON, scale's JSON lines
// and cleanup's JSON (the last two, files separated by commas); empty names are skipped.
func readResults(minimal, scale, cleanup string) (m minimalResults, steps []step, runs []cleanupRun, err error) {
	if minimal != "" {
		if err := readJSON(minimal, &m); err != nil {
			return m, nil, nil, err
		}
	}
	for _, f := range strings.Split(scale, ",") {
		if f == "" {
			continue
		}
		s, err := readSteps(f)
		if err != nil {
			return m, nil, nil, err
		}
		steps = append(steps, s...)
	}
	for _, f := range strings.Split(cleanup, ",") {
		if f == "" {
			continue
		}
		var c cleanupRun
		if err := readJSON(f, &c); err != nil {
			return m, nil, nil, err
		}
		runs = append(runs, c)
	}
	return m, steps, runs, nil
}

func verdict(ratio float64, target string) string {
	t, err := strconv.ParseFloat(target, 64)
	if err != nil {
		return "—"
	}
	if ratio >= t {
		return fmt.Sprintf("≥ %s× met", target)
	}
	return fmt.Sprintf("≥ %s× **missed**", target)
}

func reportMinimal(w io.Writer, m minimalResults, chart string) {
	fmt.Fprintf(w, `
## The minimal handler (issue 13)

A handler that reads {"id", "amount"}, INSERTs one row and answers 201, served by
`+"`benchtool serve`"+` on every path at once, all on one pgxpool of %d connections:
plain (no idempotency), `+"`Respond`"+` on a `+"`ClaimInHandler`"+` route (the README's path),
the lease path with `+"`Respond`"+`, the lease path with `+"`InTx`"+`; replays of keys sent
before (to one key, or drawn from %s), against GET of an item by its primary key
(scope, id) in the same table. `+"`benchtool minimal`"+` loads it from another process with
%d workers for %s, %d rounds interleaved (A then B, then B then A); each figure is the mean
over the rounds. The rows "records" ran again after the store was filled with that many
records (server-side INSERT … SELECT generate_series).
`, m.Concurrency, "10,000 keys", m.Concurrency, m.Duration, m.Rounds)
	if chart != "" {
		fmt.Fprintf(w, "\n![Throughput of each path as a share of its baseline, and latency by table size](%s)\n", chart)
	}
	fmt.Fprintf(w, "\n| workload | records | baseline | base req/s | base p99 ms | idem req/s | idem p50 ms | idem p99 ms | ratio | target |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range m.Pairs {
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.2f | %.0f | %.2f | %.2f | **%.2f×** | %s |\n",
			p.Name, human(p.Records), p.pair.Base, p.Base.RequestsPerSecond, p.Base.P99,
			p.Idem.RequestsPerSecond, p.Idem.P50, p.Idem.P99, p.Ratio, verdict(p.Ratio, p.Target))
	}
	reportCosts(w, m)
}

// reportCosts writes what each path cost PostgreSQL per request, when the run measured
// it: its commits (pg_stat_database), WAL records, full-page images, bytes and syncs
// (pg_stat_wal), each side of each pair, means over the rounds.
func reportCosts(w io.Writer, m minimalResults) {
	if len(m.Pairs) == 0 || m.Pairs[0].Base.Cost == nil {
		return
	}
	fmt.Fprintf(w, `
### What each request costs PostgreSQL

Per request, from the server's own counters around each run (`+"`pg_stat_database`"+` for the
commits of the benchmark's database, `+"`pg_stat_wal`"+` for the WAL, the whole server's: it ran
nothing else), means over the rounds. `+"`benchtool wal`"+` below names each WAL record.

| workload | side | commits | WAL records | full-page images | WAL bytes | WAL syncs |
|---|---|---|---|---|---|---|
`)
	seen := map[string]bool{}
	for _, p := range m.Pairs {
		for _, side := range []struct {
			name string
			s    *summary
			what string
		}{{p.pair.Base, p.Base, "baseline"}, {p.Name, p.Idem, "idem"}} {
			key := side.name + human(p.Records)
			if side.s.Cost == nil || seen[key] {
				continue
			}
			seen[key] = true
			c := side.s.Cost
			name := side.name
			if p.Records > m.Pairs[0].Records {
				name += ", at " + human(p.Records) + " records"
			}
			fmt.Fprintf(w, "| %s | %s | %.2f | %.2f | %.2f | %.0f | %.2f |\n", name, side.what, c.Commits, c.WALRecords, c.WALFPI, c.WALBytes, c.WALSyncs)
		}
	}
}

func mb(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }

func reportScale(w io.Writer, steps []step) {
	fmt.Fprintf(w, `
## Claim and lookup latency by table size

`+"`benchtool scale`"+` fills the store with completed records on the server (one
INSERT … SELECT per million, principals and keys of realistic width, the payments API's
~250-byte charge as the body), then, at each size, runs the store's own calls from 8
workers, three 5-s phases of each kind alternating (the one of median p99 kept): a lookup claims a random stored key (a replay), a claim claims a new
key and completes it. Sizes after VACUUM ANALYZE; "rows" counts the claims the
measurements added.

| store | records | rows | heap MB | primary key MB | expires_at MB | all indexes MB | lookup/s | lookup p50 ms | lookup p99 ms | claims/s | claim p50 ms | claim p99 ms |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
`)
	base := map[string]step{}
	for _, s := range steps {
		if _, ok := base[s.Store]; !ok {
			base[s.Store] = s
		}
		name := map[string]string{"postgres": "PostgreSQL", "sqlite": "SQLite"}[s.Store]
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %.0f | %.3f | %.3f | %.0f | %.2f | %.2f |\n", name, human(s.Records), s.Rows,
			mb(s.Sizes.Heap), mb(s.Sizes.PrimayKey), mb(s.Sizes.ExpiresAt), mb(s.Sizes.Indexes),
			s.Lookup.Rate, s.Lookup.P50, s.Lookup.P99, s.Claim.Rate, s.Claim.P50, s.Claim.P99)
	}
	fmt.Fprintf(w, "\nTarget: claim and replay (lookup) p99 at the largest size within 1.5× of its value at the smallest.\n\n")
	for _, name := range []string{"postgres", "sqlite"} {
		b, ok := base[name]
		if !ok {
			continue
		}
		last := b
		for _, s := range steps {
			if s.Store == name {
				last = s
			}
		}
		fmt.Fprintf(w, "- %s, %s against %s records: lookup p99 %.2f×, claim p99 %.2f×.\n",
			map[string]string{"postgres": "PostgreSQL", "sqlite": "SQLite"}[name], human(last.Records), human(b.Records),
			last.Lookup.P99/b.Lookup.P99, last.Claim.P99/b.Claim.P99)
	}
}

func reportCleanup(w io.Writer, runs []cleanupRun) {
	fmt.Fprintf(w, `
## Cleanup at scale

`+"`benchtool cleanup`"+` fills an empty store with expired records and live ones, measures
requests (half replays of live records, half new keys, 8 workers) before, while and after
the cleaner deletes every expired record, batch after batch as a pass of
`+"`idem.Cleaner`"+` does, and the table's size before, after, and after VACUUM. Each
period's p50 and p99 are those of all its requests; requests are timed in windows of 5 s,
and the worst window is the one of the highest p99.

| store | expired | deleted/s | cleaner s | longest batch ms | p50 / p99 ms before | p50 / p99 ms during | p50 / p99 ms after | p99 during / before | worst window p99 ms before · during · after | heap MB before → after → vacuumed | indexes MB before → after → vacuumed | dead rows after |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
`)
	for _, r := range runs {
		name := map[string]string{"postgres": "PostgreSQL", "sqlite": "SQLite"}[r.Store]
		fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %.0f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f× | %.2f · %.2f · %.2f | %s → %s → %s | %s → %s → %s | %d |\n",
			name, human(r.Expired), r.DeletedPerSec, r.Seconds, r.LongestBatchMS,
			r.Before.P50, r.Before.P99, r.During.P50, r.During.P99, r.After.P50, r.After.P99,
			r.During.P99/r.Before.P99, r.WorstBefore.P99, r.WorstDuring.P99, r.WorstAfter.P99,
			mb(r.SizesBefore.Heap), mb(r.SizesAfter.Heap), mb(r.SizesVacuumed.Heap),
			mb(r.SizesBefore.Indexes), mb(r.SizesAfter.Indexes), mb(r.SizesVacuumed.Indexes), r.SizesAfter.DeadRows)
	}
}
