package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idem-go/idem/internal/load"
)

const loadSynopsis = `--url URL [--concurrency 32] [--duration 10s | --requests N]
                 [--duplicate-ratio F] [--concurrent-duplicates K]
                 [--endpoint charges|orders|replay|get] [--no-key] [--unkeyed-api]
                 [--token T] [--json]

Loads the payments API at --url, then verifies exactly-once. Workers send POST
/v1/charges or POST /v1/orders with a fresh random bearer token (one principal per run)
and a new Idempotency-Key (a UUID v4) per logical request. A progress line on stderr
shows elapsed time, requests, req/s and errors (5xx and connection errors).

At the end it prints throughput, p50/p90/p99/max latency and a count per status (and
per error code of the 409s). Then it retries every logical request that has no final
answer (same key, same body; on connection errors, 409 request_in_progress honouring
Retry-After, 429 and 5xx) until --retry-deadline, lists the principal's charges and
matches them with the keys answered 201: every such key has exactly one charge, the
one it was answered, and no other charge exists. Orders cannot be listed: each 201'd
order is read back with GET /v1/orders/{id} instead. It prints "exactly-once: ok" or
the discrepancy and exits 1 on a discrepancy or when requests stay unresolved.

Endpoints replay and get measure replays: both create one charge first; replay then
sends its key and body again with every request (each answer is a stored replay), get
reads it with GET /v1/charges/{id}.

With --no-key (for 'idem payments --disable-idempotency') exactly-once cannot be
checked: only counts are reported. With --unkeyed-api (for 'idem proxy' in front of
'idem payments --disable-idempotency', which records no key on its charges) each charge
is matched with the request whose 201s named it: a charge that no answer named is an
execution no client was answered, and fails the check.`

// loadFlags are the flags of `idem load`.
type loadFlags struct {
	url, endpoint, token          string
	concurrency, dupConcurrent    int
	requests                      int64
	duration, timeout, retryLimit time.Duration
	dupRatio                      float64
	noKey, unkeyedAPI, json       bool
}

func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem load"
	var f loadFlags
	fs := newFlagSet("load", loadSynopsis)
	fs.StringVar(&f.url, "url", "", "base `URL` of the payments API, such as http://127.0.0.1:8080 (required)")
	fs.IntVar(&f.concurrency, "concurrency", load.DefaultConcurrency, "number of concurrent workers")
	fs.DurationVar(&f.duration, "duration", load.DefaultDuration, "how long to send requests")
	fs.Int64Var(&f.requests, "requests", 0, "send this many requests instead of running for --duration")
	fs.Float64Var(&f.dupRatio, "duplicate-ratio", 0, "share (0 to 1) of requests that resend a recent key with the same body")
	fs.IntVar(&f.dupConcurrent, "concurrent-duplicates", 1, "send each key from `K` workers at once (in rounds of ceil(concurrency/K) keys)")
	fs.StringVar(&f.endpoint, "endpoint", string(load.EndpointCharges), "what to send: charges, orders, replay (one key resent) or get (GET /v1/charges/{id})")
	fs.BoolVar(&f.noKey, "no-key", false, "send no Idempotency-Key (for a server run with --disable-idempotency)")
	fs.BoolVar(&f.unkeyedAPI, "unkeyed-api", false, "the API records no key on its charges (behind 'idem proxy', with no idempotency of its own): match each charge with the request whose 201s named it (charges only)")
	fs.StringVar(&f.token, "token", "", "bearer token of the principal (default: a fresh random token per run)")
	fs.DurationVar(&f.timeout, "timeout", load.DefaultTimeout, "bound of one HTTP request")
	fs.DurationVar(&f.retryLimit, "retry-deadline", load.DefaultRetryDeadline, "how long the verification retries requests that have no final answer")
	fs.BoolVar(&f.json, "json", false, "write the summary as JSON on stdout (the report goes to stderr)")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	cfg, err := f.config(fs.Visit)
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	cfg.Progress, cfg.ProgressTTY = stderr, isTerminal(stderr)

	res, err := load.Run(ctx, cfg)
	if err != nil {
		return failure(stderr, name, err)
	}
	v, err := load.Verify(context.WithoutCancel(ctx), res)
	if err != nil {
		return failure(stderr, name, fmt.Errorf("verifying: %w", err))
	}
	report := stdout
	if f.json {
		report = stderr
		if err := res.Summary.WriteJSON(stdout); err != nil {
			return failure(stderr, name, err)
		}
	}
	res.Summary.WriteText(report)
	if v.Result == load.ExactlyOnceFail || v.Result == load.ExactlyOnceUnresolved {
		return exitFailure
	}
	return exitOK
}

// config checks the flags and returns the engine's configuration; errors name the flag.
// visit walks the flags set on the command line.
func (f *loadFlags) config(visit func(func(*flag.Flag))) (load.Config, error) {
	set := map[string]bool{}
	visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var cfg load.Config
	if err := checkHTTPURL("url", f.url, "http://host:port or https://host:port"); err != nil {
		return cfg, err
	}
	switch {
	case f.concurrency < 1:
		return cfg, fmt.Errorf("--concurrency must be at least 1, got %d", f.concurrency)
	case set["duration"] && set["requests"]:
		return cfg, errors.New("--duration and --requests exclude each other")
	case f.duration <= 0:
		return cfg, fmt.Errorf("--duration must be positive, got %v", f.duration)
	case f.requests < 0:
		return cfg, fmt.Errorf("--requests must not be negative, got %d", f.requests)
	case f.dupRatio < 0 || f.dupRatio > 1:
		return cfg, fmt.Errorf("--duplicate-ratio must be between 0 and 1, got %v", f.dupRatio)
	case f.dupConcurrent < 1:
		return cfg, fmt.Errorf("--concurrent-duplicates must be at least 1, got %d", f.dupConcurrent)
	case f.timeout <= 0:
		return cfg, fmt.Errorf("--timeout must be positive, got %v", f.timeout)
	case f.retryLimit <= 0:
		return cfg, fmt.Errorf("--retry-deadline must be positive, got %v", f.retryLimit)
	}
	endpoint, err := load.ParseEndpoint(f.endpoint)
	if err != nil {
		return cfg, fmt.Errorf("--endpoint: %w", err)
	}
	if f.noKey && endpoint == load.EndpointReplay {
		return cfg, errors.New("--endpoint replay needs keys: drop --no-key")
	}
	if f.unkeyedAPI && (f.noKey || endpoint != load.EndpointCharges) {
		return cfg, errors.New("--unkeyed-api matches charges with their requests' keys: it needs --endpoint charges and keys")
	}
	return load.Config{
		URL: f.url, Concurrency: f.concurrency, Duration: f.duration, Requests: f.requests,
		DuplicateRatio: f.dupRatio, ConcurrentDuplicates: f.dupConcurrent, Endpoint: endpoint,
		NoKey: f.noKey, UnkeyedAPI: f.unkeyedAPI, Token: f.token, Timeout: f.timeout, RetryDeadline: f.retryLimit,
	}, nil
}

// isTerminal reports whether w is a terminal, where the progress line is rewritten in
// place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
