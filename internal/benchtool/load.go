package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// A closed-loop load of the minimal handler: concurrency workers, each sending its next
// request when the previous one answered, for a duration. Request i sends item
// prefix-i under key prefix-key-i (i in 16 digits) with the same body every time, so that a key's repeat is
// a replay: with --keys 0 every request is a new i; with --keys N, i is drawn uniformly
// from [0, N) (run prepare first); with --get, GET /items/prefix-i.

// loadFlags are the flags of load and prepare.
type loadFlags struct {
	url, path, prefix, token string
	keys                     int64
	concurrency              int
	duration                 time.Duration
	get                      bool
}

func (f *loadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", "", "base URL of benchtool serve (required)")
	fs.StringVar(&f.path, "path", "/respond", "path of the POSTs: /plain, /respond, /lease, /intx or /cached")
	fs.StringVar(&f.prefix, "prefix", "it", "prefix of the items' ids and keys")
	fs.StringVar(&f.token, "token", "tok_bench", "bearer token (the principal)")
	fs.Int64Var(&f.keys, "keys", 0, "draw from this many keys (or ids, with --get) made by prepare; 0: a new key per request")
	fs.IntVar(&f.concurrency, "concurrency", 32, "concurrent workers")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long to send requests")
	fs.BoolVar(&f.get, "get", false, "GET /items/{id} instead of POSTs")
}

// summary is the JSON of one run; scripts/bench reads its top-level numbers.
type summary struct {
	Path              string  `json:"path"`
	Keys              int64   `json:"keys"`
	Concurrency       int     `json:"concurrency"`
	Requests          int64   `json:"requests"`
	Errors            int64   `json:"errors"`
	Replayed          int64   `json:"replayed"`
	Seconds           float64 `json:"seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	P50               float64 `json:"p50_ms"`
	P90               float64 `json:"p90_ms"`
	P99               float64 `json:"p99_ms"`
	Max               float64 `json:"max_ms"`
	// Statuses counts the answers by status ("error": no answer).
	Statuses map[string]int64 `json:"statuses"`
	// Cost is what the run cost PostgreSQL per request (benchtool minimal), or nil.
	Cost *cost `json:"cost,omitempty"`
}

func runLoad(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	var f loadFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.url == "" {
		return errors.New("--url is required")
	}
	s, err := f.run(ctx)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

func runPrepare(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prepare", flag.ContinueOnError)
	var f loadFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.url == "" || f.keys <= 0 {
		return errors.New("--url and --keys are required")
	}
	return prepareKeys(ctx, &f)
}

// prepareKeys sends each of f's keys once, concurrently, expecting 201: any other
// answer to a key sent once is a defect, and stops the run (a 409 here found that a
// slow disk answered fresh keys 409 on PostgreSQL's ClaimInHandler path).
func prepareKeys(ctx context.Context, f *loadFlags) error {
	c := newClient(f.concurrency)
	var next atomic.Int64
	errc := make(chan error, f.concurrency)
	var wg sync.WaitGroup
	for range f.concurrency {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < f.keys; i = next.Add(1) - 1 {
				status, _, err := f.send(ctx, c, i)
				if err == nil && status != http.StatusCreated {
					err = fmt.Errorf("POST %s of key %d answered %d", f.path, i, status)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

func newClient(concurrency int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2 * concurrency,
		MaxIdleConnsPerHost: 2 * concurrency,
		DisableCompression:  true,
	}}
}

// send sends request i and reports its status and whether it was a replay.
func (f *loadFlags) send(ctx context.Context, c *http.Client, i int64) (int, bool, error) {
	id := f.prefix + "-" + strconv.FormatInt(i, 10)
	var req *http.Request
	var err error
	if f.get {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/items/"+id, nil)
	} else {
		body := `{"id":"` + id + `","amount":2000}`
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, f.url+f.path, bytes.NewReader([]byte(body)))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-key-%016d", f.prefix, i))
		}
	}
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

// run is one measured run.
func (f *loadFlags) run(ctx context.Context) (*summary, error) {
	c := newClient(f.concurrency)
	want := http.StatusCreated
	if f.get {
		want = http.StatusOK
	}
	// Fresh keys continue where an earlier run of the same prefix stopped: the
	// time in microseconds, far above any earlier run's count.
	var next atomic.Int64
	next.Store(time.Now().UnixMicro())
	lat := make([][]time.Duration, f.concurrency)
	statuses := make([]map[string]int64, f.concurrency)
	var requests, errs, replayed atomic.Int64
	deadline := time.Now().Add(f.duration)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range f.concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			statuses[w] = map[string]int64{}
			for time.Now().Before(deadline) && ctx.Err() == nil {
				i := next.Add(1)
				if f.keys > 0 {
					i = rng.Int64N(f.keys)
				}
				t0 := time.Now()
				status, rep, err := f.send(ctx, c, i)
				lat[w] = append(lat[w], time.Since(t0))
				requests.Add(1)
				if err != nil || status != want {
					errs.Add(1)
				}
				if err != nil {
					statuses[w]["error"]++
				} else {
					statuses[w][strconv.Itoa(status)]++
				}
				if rep {
					replayed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start).Seconds()
	all := slices.Concat(lat...)
	slices.Sort(all)
	s := &summary{Path: f.path, Keys: f.keys, Concurrency: f.concurrency, Requests: requests.Load(),
		Errors: errs.Load(), Replayed: replayed.Load(), Seconds: took,
		RequestsPerSecond: float64(requests.Load()) / took,
		P50:               percentile(all, 0.50), P90: percentile(all, 0.90), P99: percentile(all, 0.99), Max: percentile(all, 1)}
	if f.get {
		s.Path = "GET /items/{id}"
	}
	s.Statuses = map[string]int64{}
	for _, m := range statuses {
		for k, n := range m {
			s.Statuses[k] += n
		}
	}
	return s, nil
}

// percentile is the nearest-rank percentile p of sorted, in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i].Microseconds()) / 1000
}
