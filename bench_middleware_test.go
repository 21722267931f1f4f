package idem_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/memory"
)

// The middleware benchmarks of issue 5 measure what the middleware costs per request
// above a bare handler, with the in-memory store and fixed inputs: SPEC §11's charge
// body as JSON, with a new key and as a replay. Run them side by side and subtract
// BenchmarkBareHandler:
//
//	go test -run '^$' -bench 'BareHandler|Middleware' -benchmem -count 5 .
//
// The request and the response writer are reused across iterations, so that what is
// measured is the handler and the middleware, not httptest's request parsing.

// benchChargeBody is SPEC §11's charge body as a client sends it.
const benchChargeBody = `{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`

// benchChargeResponse is the charge the handler answers with.
const benchChargeResponse = `{"id":"ch_3MtwBwLkdIwHu7ix28a3tqPa","object":"charge","amount":2000,"currency":"usd",` +
	`"customer_id":"cust_abc123","status":"succeeded","created":1767225600,"idempotency_key":"4f1c6a7e-2b7d-4a53-9b0e-0c1f3f2d9a11"}`

// chargeHandler answers as POST /v1/charges does, without a database.
var chargeHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Location"] = []string{"/v1/charges/ch_3MtwBwLkdIwHu7ix28a3tqPa"}
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, benchChargeResponse)
})

// benchWriter is a reusable http.ResponseWriter that discards the body.
type benchWriter struct {
	header http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header { return w.header }
func (w *benchWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.n += len(p)
	return len(p), nil
}

func (w *benchWriter) reset() {
	clear(w.header)
	w.status, w.n = 0, 0
}

// benchBody is a reusable request body.
type benchBody struct{ strings.Reader }

func (*benchBody) Close() error { return nil }

// benchRequest is one reusable POST /v1/charges from one principal.
type benchRequest struct {
	r    *http.Request
	body *benchBody
	w    *benchWriter
}

func newBenchRequest(b *testing.B) *benchRequest {
	r, err := http.NewRequest(http.MethodPost, "http://api.example/v1/charges", nil)
	if err != nil {
		b.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer sk_test_bench")
	r.Header.Set("Content-Type", "application/json")
	return &benchRequest{r: r, body: &benchBody{}, w: &benchWriter{header: make(http.Header)}}
}

// serve sends the request with the key header values (none when nil) to h.
func (q *benchRequest) serve(b *testing.B, h http.Handler, key []string) {
	q.w.reset()
	q.body.Reset(benchChargeBody)
	q.r.Body = q.body
	q.r.ContentLength = int64(len(benchChargeBody))
	if key != nil {
		q.r.Header["Idempotency-Key"] = key
	}
	h.ServeHTTP(q.w, q.r)
	if q.w.status != http.StatusCreated || q.w.n != len(benchChargeResponse) {
		b.Fatalf("status %d, %d body bytes", q.w.status, q.w.n)
	}
}

// benchMiddleware wraps chargeHandler with a middleware over a fresh in-memory store,
// configured as in production: the store's clock, a real heartbeat, no logging.
func benchMiddleware(mod func(*idem.Config)) http.Handler {
	cfg := idem.Config{
		Store:  memory.New(),
		Scope:  bearerScope,
		Logger: slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	return idem.New(cfg).Handler(chargeHandler)
}

// benchKeys returns n distinct UUID-shaped keys as header values.
func benchKeys(n int) [][]string {
	keys := make([][]string, n)
	for i := range keys {
		s := strconv.FormatInt(int64(i), 16)
		keys[i] = []string{"4f1c6a7e-2b7d-4a53-9b0e-" + strings.Repeat("0", 12-len(s)) + s}
	}
	return keys
}

// BenchmarkBareHandler is the baseline: the charge handler without the middleware.
func BenchmarkBareHandler(b *testing.B) {
	q := newBenchRequest(b)
	b.ReportAllocs()
	for b.Loop() {
		q.serve(b, chargeHandler, nil)
	}
}

// BenchmarkMiddlewareNewKey is a first request: claim, execute, complete. The
// in-memory store is replaced (off the clock) every newKeyBatch keys: it keeps every
// record on the Go heap, and a heap that grows with b.N would make the garbage
// collector, not the middleware, dominate the figure. A real store keeps its records
// elsewhere.
func BenchmarkMiddlewareNewKey(b *testing.B) { benchmarkNewKey(b, nil) }

// BenchmarkMiddlewareNewKeyWithoutBounds is BenchmarkMiddlewareNewKey without the
// bounds per scope (SPEC §19), for what they cost side by side: run both in one
// invocation, alternated (-bench 'MiddlewareNewKey', several times).
func BenchmarkMiddlewareNewKeyWithoutBounds(b *testing.B) {
	benchmarkNewKey(b, func(c *idem.Config) { c.MaxInFlightPerScope, c.MaxStoredBytesPerScope = -1, -1 })
}

func benchmarkNewKey(b *testing.B, mod func(*idem.Config)) {
	const newKeyBatch = 4096
	keys := benchKeys(min(b.N, newKeyBatch))
	q := newBenchRequest(b)
	var h http.Handler
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%newKeyBatch == 0 {
			b.StopTimer()
			h = benchMiddleware(mod)
			b.StartTimer()
		}
		q.serve(b, h, keys[i%newKeyBatch])
	}
}

// BenchmarkMiddlewareReplay is a retry answered from the store.
func BenchmarkMiddlewareReplay(b *testing.B) {
	benchmarkReplay(b, benchMiddleware(nil))
}

func benchmarkReplay(b *testing.B, h http.Handler) {
	q := newBenchRequest(b)
	key := []string{"4f1c6a7e-2b7d-4a53-9b0e-0c1f3f2d9a11"}
	q.serve(b, h, key)
	b.ReportAllocs()
	for b.Loop() {
		q.serve(b, h, key)
		if q.w.header.Get("Idempotent-Replayed") != "true" {
			b.Fatal("not a replay")
		}
	}
}

// BenchmarkMiddlewareReplayCached is a retry answered from the replay cache
// (Config.ReplayCacheSize), without a store call.
func BenchmarkMiddlewareReplayCached(b *testing.B) {
	benchmarkReplay(b, benchMiddleware(func(c *idem.Config) { c.ReplayCacheSize = 1024 }))
}

// BenchmarkMemoryStoreNewKey is the in-memory store's share of
// BenchmarkMiddlewareNewKey: a claim and a completion of a new key, called directly.
func BenchmarkMemoryStoreNewKey(b *testing.B) {
	const batch = 4096
	ctx := context.Background()
	keys := benchKeys(min(b.N, batch))
	resp := &idem.Response{Status: 201, Body: []byte(benchChargeResponse),
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}}}
	var st *memory.Store
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%batch == 0 {
			b.StopTimer()
			st = memory.New()
			b.StartTimer()
		}
		k := keys[i%batch][0]
		claim := idemstore.ClaimParams{Scope: "s", Key: k, Token: "t", RecordID: "r", Lease: idem.DefaultLease, TTL: idem.DefaultTTL}
		if _, err := st.RecordClaim(ctx, &claim); err != nil {
			b.Fatal(err)
		}
		complete := idemstore.CompleteParams{Scope: "s", Key: k, Token: "t", Response: resp, TTL: idem.DefaultTTL}
		if err := st.RecordComplete(ctx, &complete); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryStoreReplay is the in-memory store's share of
// BenchmarkMiddlewareReplay: a claim that finds the completed record.
func BenchmarkMemoryStoreReplay(b *testing.B) {
	ctx := context.Background()
	st := memory.New()
	claim := idemstore.ClaimParams{Scope: "s", Key: "k", Token: "t", RecordID: "r", Lease: idem.DefaultLease, TTL: idem.DefaultTTL}
	if _, err := st.RecordClaim(ctx, &claim); err != nil {
		b.Fatal(err)
	}
	resp := &idem.Response{Status: 201, Body: []byte(benchChargeResponse),
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}}}
	if err := st.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "s", Key: "k", Token: "t", Response: resp, TTL: idem.DefaultTTL}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		claim := idemstore.ClaimParams{Scope: "s", Key: "k", Token: "t2", RecordID: "r2", Lease: idem.DefaultLease, TTL: idem.DefaultTTL}
		if res, err := st.RecordClaim(ctx, &claim); err != nil || res.Outcome != idemstore.ClaimCompleted {
			b.Fatal(res, err)
		}
	}
}
