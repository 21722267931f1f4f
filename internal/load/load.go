// Package load is the engine of `idem load`: it drives the payments API (SPEC §11)
// with concurrent workers, measures throughput and latency, and then verifies
// exactly-once: every logical request is retried until it has a final answer, and the
// principal's charges are matched against the keys that got a 201.
//
// A run has two phases. [Run] sends requests for a duration or a count and records
// every answer; [Verify] resolves the logical requests left without a final answer,
// lists what the server wrote and compares. [Match] is the pure comparison.
package load

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint is what the workers send.
type Endpoint string

// Endpoints.
const (
	// EndpointCharges sends POST /v1/charges, a new key per logical request.
	EndpointCharges Endpoint = "charges"
	// EndpointOrders sends POST /v1/orders, a new key per logical request.
	EndpointOrders Endpoint = "orders"
	// EndpointReplay creates one charge, then sends its key and body again with every
	// request: each answer is a replay of the stored response.
	EndpointReplay Endpoint = "replay"
	// EndpointGet creates one charge, then reads it with GET /v1/charges/{id}: the
	// baseline of EndpointReplay.
	EndpointGet Endpoint = "get"
)

// ParseEndpoint returns the endpoint named s.
func ParseEndpoint(s string) (Endpoint, error) {
	switch e := Endpoint(s); e {
	case EndpointCharges, EndpointOrders, EndpointReplay, EndpointGet:
		return e, nil
	}
	return "", fmt.Errorf("unknown endpoint %q: want charges, orders, replay or get", s)
}

// Defaults of [Config].
const (
	// DefaultConcurrency is the number of workers.
	DefaultConcurrency = 32
	// DefaultDuration is how long the load phase lasts when no request count is set.
	DefaultDuration = 10 * time.Second
	// DefaultTimeout bounds one HTTP request.
	DefaultTimeout = 30 * time.Second
	// DefaultRetryDeadline bounds the resolution of the logical requests left without a
	// final answer.
	DefaultRetryDeadline = 30 * time.Second
	// DefaultRecentKeys is how many recent logical requests a duplicate picks from.
	DefaultRecentKeys = 1024
	// DefaultSettle is how long Verify waits before it lists the charges a second time.
	DefaultSettle = time.Second
)

// Config configures a run. URL is required.
type Config struct {
	// URL is the payments API's base URL, such as http://127.0.0.1:8080.
	URL string

	// Concurrency is the number of workers sending at once. Defaults to
	// [DefaultConcurrency].
	Concurrency int

	// Duration is how long the load phase lasts. Ignored when Requests is set.
	// Defaults to [DefaultDuration].
	Duration time.Duration

	// Requests, when positive, ends the load phase after that many requests instead of
	// after Duration. Defaults to 0.
	Requests int64

	// DuplicateRatio is the share (0 to 1) of requests that resend a recent logical
	// request: the same key and the same body. Defaults to 0.
	DuplicateRatio float64

	// ConcurrentDuplicates, when above 1, sends each key from that many workers at
	// once: the workers go in rounds, and in each round ceil(Concurrency /
	// ConcurrentDuplicates) fresh keys are spread over all workers. Defaults to 1.
	ConcurrentDuplicates int

	// Endpoint is what the workers send. Defaults to [EndpointCharges].
	Endpoint Endpoint

	// NoKey sends no Idempotency-Key (for a server run with --disable-idempotency);
	// exactly-once cannot then be verified, only counted. Defaults to false.
	NoKey bool

	// Token is the bearer token, i.e. the principal. Defaults to a fresh random token,
	// so that a run sees only its own charges.
	Token string

	// UnkeyedAPI says that the API records no idempotency key on its charges: an API
	// behind `idem proxy` that has no keys of its own (`idem payments
	// --disable-idempotency`). Verify then gives each listed charge to the logical
	// request whose 2xx answers named it, instead of reading its key; a charge that no
	// answer named is an execution whose answer no client got (a duplicate that ran
	// again), and a discrepancy, as is the charge of a request left without a final
	// answer (it cannot be told from one). Orders cannot be checked so. Defaults to
	// false.
	UnkeyedAPI bool

	// Timeout bounds one HTTP request. Defaults to [DefaultTimeout].
	Timeout time.Duration

	// RetryDeadline bounds how long Verify retries the logical requests left without a
	// final answer. Defaults to [DefaultRetryDeadline].
	RetryDeadline time.Duration

	// Settle is how long Verify waits after listing the charges before it lists them
	// again: a charge that appears in between was made by an execution that ended
	// after every key had its answer (a late re-execution), and is a discrepancy.
	// Defaults to [DefaultSettle].
	Settle time.Duration

	// Progress, when set, receives a progress line every ProgressInterval.
	// Defaults to nil (no progress).
	Progress io.Writer

	// ProgressTTY rewrites the progress line in place with \r instead of writing one
	// line per tick. Defaults to false.
	ProgressTTY bool

	// ProgressInterval is the period of the progress line. Defaults to one second.
	ProgressInterval time.Duration

	// Client sends the requests. Defaults to a client whose transport keeps
	// connections alive, with 2×Concurrency idle connections per host.
	Client *http.Client
}

func (c *Config) setDefaults() error {
	if c.URL == "" {
		return errors.New("URL is required")
	}
	c.URL = strings.TrimRight(c.URL, "/")
	switch {
	case c.Concurrency < 0:
		return fmt.Errorf("Concurrency must be positive, got %d", c.Concurrency)
	case c.Concurrency == 0:
		c.Concurrency = DefaultConcurrency
	}
	if c.Duration < 0 || c.Requests < 0 {
		return errors.New("Duration and Requests must not be negative")
	}
	if c.Duration == 0 && c.Requests == 0 {
		c.Duration = DefaultDuration
	}
	if c.DuplicateRatio < 0 || c.DuplicateRatio > 1 {
		return fmt.Errorf("DuplicateRatio must be between 0 and 1, got %v", c.DuplicateRatio)
	}
	if c.ConcurrentDuplicates < 0 {
		return fmt.Errorf("ConcurrentDuplicates must not be negative, got %d", c.ConcurrentDuplicates)
	}
	if c.ConcurrentDuplicates == 0 {
		c.ConcurrentDuplicates = 1
	}
	if c.Endpoint == "" {
		c.Endpoint = EndpointCharges
	}
	if _, err := ParseEndpoint(string(c.Endpoint)); err != nil {
		return fmt.Errorf("Endpoint: %w", err)
	}
	if c.NoKey && c.Endpoint == EndpointReplay {
		return errors.New("the replay endpoint needs keys (NoKey is set)")
	}
	if c.Token == "" {
		c.Token = "load_" + randomHex(16)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.RetryDeadline <= 0 {
		c.RetryDeadline = DefaultRetryDeadline
	}
	if c.Settle <= 0 {
		c.Settle = DefaultSettle
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = time.Second
	}
	if c.Client == nil {
		c.Client = NewClient(c.Concurrency, c.Timeout)
	}
	return nil
}

// NewClient returns a client for concurrency workers: keep-alive, enough idle
// connections per host that no worker ever dials while another's connection idles,
// no compression (the payments API's bodies are small).
func NewClient(concurrency int, timeout time.Duration) *http.Client {
	t := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2 * concurrency,
		MaxIdleConnsPerHost: 2 * concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: t, Timeout: timeout}
}

// op is one logical request: a key and a body, sent one or more times.
type op struct {
	key  string // "" without keys
	body []byte

	mu     sync.Mutex
	first  Reply         // the first final answer (Status 0 while none)
	later  map[Reply]int // final answers that contradict first, with how many came
	ids    []string      // distinct object ids answered with 2xx
	sends  int
	lastRA time.Duration // the last Retry-After
}

// record notes an answer to one send of o.
func (o *op) record(a answer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sends++
	o.lastRA = a.retryAfter
	if a.final() {
		r := Reply{Status: a.status, Code: a.code, ID: a.id}
		switch {
		case o.first.Status == 0:
			o.first = r
		case r != o.first:
			if o.later == nil {
				o.later = map[Reply]int{}
			}
			o.later[r]++
		}
	}
	if ok2xx(a.status) && a.id != "" && !containsString(o.ids, a.id) {
		o.ids = append(o.ids, a.id)
	}
}

func (o *op) resolved() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.first.Status != 0
}

// answer is what one HTTP exchange returned.
type answer struct {
	status     int // 0 on a transport error
	code       string
	id         string
	replayed   bool
	retryAfter time.Duration
	err        error
}

// final reports whether a holds the final outcome of its logical request: anything
// but a transport error, 409 request_in_progress, 429 and 5xx other than 500
// outcome_unknown (SPEC §12).
func (a answer) final() bool {
	switch {
	case a.status >= 500 && a.code == "outcome_unknown":
		return true
	case a.status == 0, a.status >= 500, a.status == http.StatusTooManyRequests:
		return false
	case a.status == http.StatusConflict && a.code == "request_in_progress":
		return false
	}
	return true
}

// runner is the state of one run shared by its workers.
type runner struct {
	cfg   Config
	stats *stats

	mu     sync.Mutex
	ops    []*op          // every logical request, in creation order
	recent []*op          // ring of recent logical requests, for duplicates
	next   int            // next slot of recent
	byKey  map[string]*op // ops by key
	seq    atomic.Int64
	sent   atomic.Int64    // requests started, against cfg.Requests
	stop   context.Context // ends when no new request may start

	fixedID string // EndpointGet and EndpointReplay: the charge every request reads
	fixed   *op
}

// Result is what a run measured, and, after [Verify], what it verified.
type Result struct {
	// Config is the run's configuration with its defaults applied.
	Config Config
	// Summary holds the figures of the load phase.
	Summary Summary

	ops     []*op
	fixedID string
}

// Run runs the load phase of cfg until its duration or request count is reached or
// ctx ends, and returns what it measured. Verify it with [Verify].
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, stats: newStats(cfg.Concurrency), byKey: map[string]*op{}}
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	// The duration only stops new requests: those in flight finish, because a request
	// cut off would look to the server like a client that went away.
	r.stop = ctx
	var cancel context.CancelFunc = func() {}
	if cfg.Requests == 0 {
		r.stop, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancel()

	start := time.Now()
	stopProgress := r.progress(start)
	if cfg.ConcurrentDuplicates > 1 {
		r.rounds(ctx)
	} else {
		var wg sync.WaitGroup
		for w := range cfg.Concurrency {
			wg.Go(func() { r.work(ctx, w) })
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	stopProgress()

	res := &Result{Config: cfg, ops: r.ops, fixedID: r.fixedID}
	if r.fixed != nil {
		res.ops = []*op{r.fixed}
	}
	res.Summary = r.stats.summary(elapsed)
	res.Summary.fill(&cfg)
	if err := ctx.Err(); err != nil && res.Summary.Requests == 0 {
		return res, err
	}
	return res, nil
}

// prepare creates the charge that EndpointGet and EndpointReplay read.
func (r *runner) prepare(ctx context.Context) error {
	if r.cfg.Endpoint != EndpointGet && r.cfg.Endpoint != EndpointReplay {
		return nil
	}
	o := r.newOp()
	deadline := time.Now().Add(r.cfg.RetryDeadline)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		a := r.send(ctx, EndpointCharges, o)
		if a.status == http.StatusCreated && a.id != "" {
			r.fixedID, r.fixed = a.id, o
			o.record(a)
			return nil
		}
		if a.final() {
			return fmt.Errorf("creating the charge to read: %s", a.describe())
		}
		sleep(ctx, backoff(a, 1))
	}
	return errors.New("creating the charge to read: no final answer before the retry deadline")
}

// more reports whether another request may start, counting it.
func (r *runner) more(ctx context.Context) bool {
	if ctx.Err() != nil || r.stop.Err() != nil {
		return false
	}
	return r.cfg.Requests == 0 || r.sent.Add(1) <= r.cfg.Requests
}

// work is one worker of the default mode.
func (r *runner) work(ctx context.Context, w int) {
	rng := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for r.more(ctx) {
		o := r.pick(rng)
		r.exchange(ctx, w, o)
	}
}

// rounds is the --concurrent-duplicates mode: all workers start each round together,
// ceil(Concurrency/K) fresh keys spread over them, and the next round starts when every
// worker has its answer.
func (r *runner) rounds(ctx context.Context) {
	n := r.cfg.Concurrency
	keys := (n + r.cfg.ConcurrentDuplicates - 1) / r.cfg.ConcurrentDuplicates
	for ctx.Err() == nil && r.stop.Err() == nil {
		ops := make([]*op, keys)
		for i := range ops {
			ops[i] = r.newOp()
		}
		var wg sync.WaitGroup
		for w := range n {
			if !r.more(ctx) {
				break
			}
			wg.Go(func() { r.exchange(ctx, w, ops[w%keys]) })
		}
		wg.Wait()
		if r.cfg.Requests > 0 && r.sent.Load() >= r.cfg.Requests {
			return
		}
	}
}

// pick returns the logical request a worker sends next: the fixed one, a recent one
// (a duplicate) or a new one.
func (r *runner) pick(rng *mrand.Rand) *op {
	if r.fixed != nil {
		return r.fixed
	}
	if r.cfg.DuplicateRatio > 0 && rng.Float64() < r.cfg.DuplicateRatio {
		r.mu.Lock()
		n := len(r.recent)
		var o *op
		if n > 0 {
			o = r.recent[rng.IntN(n)]
		}
		r.mu.Unlock()
		if o != nil {
			return o
		}
	}
	return r.newOp()
}

// newOp returns a new logical request with a fresh key and body.
func (r *runner) newOp() *op {
	n := r.seq.Add(1)
	o := &op{body: r.body(n)}
	if !r.cfg.NoKey {
		o.key = newUUID()
	}
	r.mu.Lock()
	r.ops = append(r.ops, o)
	if o.key != "" {
		r.byKey[o.key] = o
	}
	if len(r.recent) < DefaultRecentKeys {
		r.recent = append(r.recent, o)
	} else {
		r.recent[r.next] = o
		r.next = (r.next + 1) % DefaultRecentKeys
	}
	r.mu.Unlock()
	return o
}

func (r *runner) body(n int64) []byte {
	amount := 100 + n%99_900
	if r.cfg.Endpoint == EndpointOrders {
		return fmt.Appendf(nil, `{"amount":%d,"currency":"usd","description":"load order %d"}`, amount, n)
	}
	return fmt.Appendf(nil, `{"amount":%d,"currency":"usd","customer_id":"cust_load%d"}`, amount, n%1000)
}

// exchange sends o once from worker w and records the answer and its latency.
func (r *runner) exchange(ctx context.Context, w int, o *op) {
	start := time.Now()
	a := r.send(ctx, r.cfg.Endpoint, o)
	lat := time.Since(start)
	if a.status == 0 && ctx.Err() != nil {
		return // cut off by an interrupt: neither a measurement nor an error
	}
	if r.cfg.Endpoint != EndpointGet {
		o.record(a)
	}
	r.stats.add(w, lat, a)
}

// send sends o to endpoint once.
func (r *runner) send(ctx context.Context, endpoint Endpoint, o *op) answer {
	var req *http.Request
	var err error
	switch endpoint {
	case EndpointGet:
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, r.cfg.URL+"/v1/charges/"+r.fixedID, nil)
	case EndpointOrders:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL+"/v1/orders", bytes.NewReader(o.body))
	default:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL+"/v1/charges", bytes.NewReader(o.body))
	}
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+r.cfg.Token)
	if req.Method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
		if o.key != "" {
			req.Header.Set("Idempotency-Key", o.key)
		}
	}
	return do(r.cfg.Client, req)
}

// do sends req and reads what the verification needs from the answer.
func do(c *http.Client, req *http.Request) answer {
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{err: err}
	}
	a := answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if ok2xx(resp.StatusCode) {
		a.id = jsonString(body, `"id":`)
	} else {
		a.code = jsonString(body, `"code":`)
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		a.retryAfter = parseRetryAfter(s)
	}
	return a
}

func (a answer) describe() string {
	if a.status == 0 {
		return fmt.Sprintf("error: %v", a.err)
	}
	if a.code != "" {
		return fmt.Sprintf("%d %s", a.status, a.code)
	}
	return fmt.Sprint(a.status)
}

// jsonString returns the string value that follows the first occurrence of member
// (such as `"id":`) in a compact JSON body, or "". It spares the workers a full decode:
// the API's bodies are compact JSON and the values looked up (ids, error codes) never
// contain escapes.
func jsonString(body []byte, member string) string {
	i := bytes.Index(body, []byte(member))
	if i < 0 {
		return ""
	}
	rest := bytes.TrimLeft(body[i+len(member):], " ")
	if len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return ""
	}
	return string(rest[1 : 1+end])
}

// parseRetryAfter reads Retry-After in seconds or as an HTTP date.
func parseRetryAfter(s string) time.Duration {
	var secs int
	if _, err := fmt.Sscanf(s, "%d", &secs); err == nil && secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(s); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// newUUID returns a random UUID v4 (SPEC §3 recommends 128-bit random keys).
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// jitter returns a random duration in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	n, _ := rand.Int(rand.Reader, big.NewInt(int64(d)))
	return time.Duration(n.Int64())
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func ok2xx(status int) bool { return status >= 200 && status < 300 }

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
