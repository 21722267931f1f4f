package load

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// stats collects the answers of the load phase. Each worker appends to its own shard,
// so recording takes no shared lock; the progress line reads two atomic counters.
type stats struct {
	requests atomic.Int64
	errors   atomic.Int64
	shards   []shard
}

type shard struct {
	mu        sync.Mutex // taken by its one worker, and once by summary
	latencies []time.Duration
	status    map[string]int64
	codes     map[string]int64 // error codes of 409s
	replayed  int64
	_         [64]byte // keeps shards on separate cache lines
}

func newStats(workers int) *stats {
	s := &stats{shards: make([]shard, workers)}
	for i := range s.shards {
		s.shards[i].status = map[string]int64{}
		s.shards[i].codes = map[string]int64{}
	}
	return s
}

// isError reports whether a counts as an error: a transport error or a 5xx.
func (a answer) isError() bool { return a.status == 0 || a.status >= 500 }

func (s *stats) add(w int, lat time.Duration, a answer) {
	s.requests.Add(1)
	if a.isError() {
		s.errors.Add(1)
	}
	sh := &s.shards[w]
	sh.mu.Lock()
	sh.latencies = append(sh.latencies, lat)
	key := "error"
	if a.status != 0 {
		key = strconv.Itoa(a.status)
	}
	sh.status[key]++
	if a.status == 409 {
		code := a.code
		if code == "" {
			code = "(none)"
		}
		sh.codes[code]++
	}
	if a.replayed {
		sh.replayed++
	}
	sh.mu.Unlock()
}

// Latency holds latency percentiles in milliseconds.
type Latency struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// Summary holds the figures of a run. Verify fills Verification.
type Summary struct {
	Endpoint    string  `json:"endpoint"`
	URL         string  `json:"url"`
	Concurrency int     `json:"concurrency"`
	Keyed       bool    `json:"keyed"`
	ElapsedSecs float64 `json:"elapsed_s"`
	Requests    int64   `json:"requests"`
	Errors      int64   `json:"errors"`
	Throughput  float64 `json:"requests_per_second"`
	Latency
	Replayed      int64            `json:"replayed"`
	Status        map[string]int64 `json:"status"`
	ConflictCodes map[string]int64 `json:"conflict_codes,omitempty"`
	Verification  *Verification    `json:"verification,omitempty"`
}

func (s *stats) summary(elapsed time.Duration) Summary {
	out := Summary{Status: map[string]int64{}, ConflictCodes: map[string]int64{}, ElapsedSecs: elapsed.Seconds()}
	var all []time.Duration
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		all = append(all, sh.latencies...)
		for k, v := range sh.status {
			out.Status[k] += v
		}
		for k, v := range sh.codes {
			out.ConflictCodes[k] += v
		}
		out.Replayed += sh.replayed
		sh.mu.Unlock()
	}
	out.Requests = int64(len(all))
	out.Errors = s.errors.Load()
	if elapsed > 0 {
		out.Throughput = float64(out.Requests) / elapsed.Seconds()
	}
	out.Latency = percentiles(all)
	return out
}

func (s *Summary) fill(cfg *Config) {
	s.Endpoint, s.URL, s.Concurrency, s.Keyed = string(cfg.Endpoint), cfg.URL, cfg.Concurrency, !cfg.NoKey
}

// percentiles returns exact percentiles of samples (nearest rank), sorting samples.
func percentiles(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	return Latency{
		P50: ms(rank(samples, 0.50)),
		P90: ms(rank(samples, 0.90)),
		P99: ms(rank(samples, 0.99)),
		Max: ms(samples[len(samples)-1]),
	}
}

// rank returns the nearest-rank p-quantile of sorted: the smallest sample such that at
// least p of the samples are at most it.
func rank(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// progress writes the progress line every interval until the returned func is called.
func (r *runner) progress(start time.Time) (stop func()) {
	w := r.cfg.Progress
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(r.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r.progressLine(w, start, "")
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		if r.cfg.ProgressTTY {
			r.progressLine(w, start, "\n")
		}
	}
}

func (r *runner) progressLine(w interface{ Write([]byte) (int, error) }, start time.Time, end string) {
	el := time.Since(start)
	n, e := r.stats.requests.Load(), r.stats.errors.Load()
	line := fmt.Sprintf("%6.1fs  %9d requests  %9.0f req/s  %6d errors", el.Seconds(), n, float64(n)/el.Seconds(), e)
	if r.cfg.ProgressTTY {
		fmt.Fprintf(w, "\r%s\x1b[K%s", line, end)
		return
	}
	fmt.Fprintln(w, line)
}
