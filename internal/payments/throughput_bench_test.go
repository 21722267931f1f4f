package payments

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// The throughput benchmarks of issue 5, for the developer's inner loop: the real handler
// stack (authentication, the idempotency middleware, the payments handlers, the store's
// §7 helper) served by an in-process httptest server, 32 concurrent clients, on real
// PostgreSQL and SQLite. Each endpoint runs plain (DisableIdempotency, the baseline) and
// idempotent (a fresh key per request) side by side in one run, so that the ratio of
// their req/s is meaningful on a noisy machine:
//
//	go test ./internal/payments -run '^$' -bench 'Charges|Orders' -benchtime 3s -count 3
//
// scripts/bench measures the same end to end, with processes.

// benchClients is the number of concurrent clients, as issue 5's targets assume.
const benchClients = 32

// BenchmarkCharges measures POST /v1/charges.
func BenchmarkCharges(b *testing.B) {
	body := []byte(`{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`)
	benchEndpoint(b, "/v1/charges", body)
}

// BenchmarkOrders measures POST /v1/orders.
func BenchmarkOrders(b *testing.B) {
	body := []byte(`{"amount": 2000, "currency": "usd", "description": "two things"}`)
	benchEndpoint(b, "/v1/orders", body)
}

func benchEndpoint(b *testing.B, path string, body []byte) {
	for _, mode := range []string{"plain", "idempotent"} {
		b.Run(mode, func(b *testing.B) {
			for _, db := range []string{"postgres", "sqlite"} {
				b.Run(db, func(b *testing.B) {
					srv := benchServer(b, db, mode == "plain", false)
					benchPost(b, srv, path, body, mode != "plain")
				})
			}
		})
	}
}

// BenchmarkRatio measures idempotent/plain throughput of each endpoint on each
// database in alternating slices (plain, idempotent, plain, …) of ratioSlice at
// benchClients clients, so that a noisy neighbour hurts both sides alike. It reports
// both rates and their ratio, the figure of issue 5's targets; it runs once whatever
// -benchtime says.
//
//	go test ./internal/payments -run '^$' -bench Ratio
func BenchmarkRatio(b *testing.B) {
	benchRatio(b, []string{"charges", "orders"}, false)
}

// BenchmarkRatioSynchronousClaim is BenchmarkRatio for POST /v1/charges with the
// stores' SynchronousClaim set: every claim waits for its flush (fsync), as before the
// claims' own commits stopped waiting. The difference is what that saves.
//
//	go test ./internal/payments -run '^$' -bench 'Ratio'
func BenchmarkRatioSynchronousClaim(b *testing.B) {
	benchRatio(b, []string{"charges"}, true)
}

func benchRatio(b *testing.B, endpoints []string, syncClaim bool) {
	bodies := map[string][]byte{
		"/v1/charges": []byte(`{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`),
		"/v1/orders":  []byte(`{"amount": 2000, "currency": "usd", "description": "two things"}`),
	}
	for _, ep := range endpoints {
		path := "/v1/" + ep
		for _, db := range []string{"postgres", "sqlite"} {
			b.Run(ep+"/"+db, func(b *testing.B) {
				plain, keyed := benchServer(b, db, true, syncClaim), benchServer(b, db, false, syncClaim)
				var n [2]int64
				var took [2]time.Duration
				for i := range 2 * ratioSlices {
					srv, mode := plain, i%2
					if mode == 1 {
						srv = keyed
					}
					start := time.Now()
					n[mode] += postFor(b, srv, path, bodies[path], mode == 1, ratioSlice)
					took[mode] += time.Since(start)
				}
				p, k := float64(n[0])/took[0].Seconds(), float64(n[1])/took[1].Seconds()
				b.ReportMetric(p, "plain-req/s")
				b.ReportMetric(k, "idem-req/s")
				b.ReportMetric(k/p, "ratio")
			})
		}
	}
}

// ratioSlices slices of ratioSlice make up each side of a BenchmarkRatio measurement.
const (
	ratioSlices = 8
	ratioSlice  = 500 * time.Millisecond
)

// postFor posts body to path from benchClients goroutines for d and returns how many
// requests completed, failing b on any answer but 201.
func postFor(b *testing.B, srv *httptest.Server, path string, body []byte, keyed bool, d time.Duration) int64 {
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = benchClients
	token, prefix := "tok-bench", testenv.Name("key-")
	var seq, failed atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range benchClients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if !postOnce(client, srv.URL+path, token, body, keyed, prefix, &seq) {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d requests did not answer 201", f, seq.Load())
	}
	return seq.Load()
}

func postOnce(client *http.Client, url, token string, body []byte, keyed bool, prefix string, seq *atomic.Int64) bool {
	n := seq.Add(1)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if keyed {
		req.Header.Set("Idempotency-Key", prefix+"-"+itoa(n))
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusCreated
}

// benchServer serves the payments API the way `idem payments` does: the store and the
// payments data share one database (SPEC §7) and its connection pool.
func benchServer(b *testing.B, db string, plain, syncClaim bool) *httptest.Server {
	b.Helper()
	ctx := testenv.Context(b)
	cfg := Config{DisableIdempotency: plain, Logger: quietLogger()}
	switch db {
	case "postgres":
		dbURL, schema := pgtest.Schema(b)
		st, err := postgres.Open(ctx, pgtest.SearchPathURL(b, dbURL, schema), postgres.Config{MaxConns: 32, AsynchronousClaim: !syncClaim})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(st.Close)
		if err := st.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		cfg.Store, cfg.DB = st, NewPostgresStoreDB(st)
	case "sqlite":
		st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "idem.db"), sqlite.Config{SynchronousClaim: syncClaim})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		if err := st.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		cfg.Store, cfg.DB = st, NewSQLiteStoreDB(st)
	}
	if _, err := cfg.DB.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(New(cfg).Handler())
	b.Cleanup(srv.Close)
	return srv
}

// benchPost posts body to path from benchClients goroutines, each request with a new
// key when keyed, and reports req/s.
func benchPost(b *testing.B, srv *httptest.Server, path string, body []byte, keyed bool) {
	tr := &http.Transport{MaxIdleConnsPerHost: benchClients, MaxConnsPerHost: benchClients}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	token := testenv.Name("tok-")
	prefix := testenv.Name("key-")
	var seq atomic.Int64
	var failed atomic.Int64
	b.SetParallelism((benchClients + 1) / 2) // × GOMAXPROCS (2 here) = 32 clients
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+path, bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			if keyed {
				req.Header.Set("Idempotency-Key", prefix+"-"+itoa(seq.Add(1)))
			}
			resp, err := client.Do(req)
			if err != nil {
				failed.Add(1)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d requests did not answer 201", n, b.N)
	}
}

func itoa(n int64) string {
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(buf[i:])
		}
	}
}
