package payments

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkReplayVsGet measures, in-process and without a network, what the Go side of
// a stored replay on PostgreSQL costs next to GET /v1/charges/{id} of the same charge:
// the figures behind issue 5's "replay (store) ≥ 0.8× GET" target, for profiling
// (-cpuprofile, -memprofile) the two paths apart from the HTTP client and transport.
//
//	go test ./internal/payments -run '^$' -bench ReplayVsGet -benchmem -cpu 2
//	go test ./internal/payments -run '^$' -bench ReplayVsGet/replay -cpuprofile cpu.out
func BenchmarkReplayVsGet(b *testing.B) {
	bb := postgresBundle(b)
	const token, key, body = "tok_bench", "bench-replay-key-0001", `{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`
	w := bb.postCharge(token, key, body)
	if w.Code != http.StatusCreated {
		b.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var c struct{ ID string }
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, method, path, key, body string, want int) {
		b.ReportAllocs()
		cpu := processCPU()
		b.RunParallel(func(pb *testing.PB) {
			rw := &discardWriter{h: http.Header{}}
			for pb.Next() {
				r := httptest.NewRequest(method, path, strings.NewReader(body))
				r.Header.Set("Authorization", "Bearer "+token)
				if body != "" {
					r.Header.Set("Content-Type", "application/json")
				}
				if key != "" {
					r.Header.Set("Idempotency-Key", key)
				}
				clear(rw.h)
				rw.status = 0
				bb.handler.ServeHTTP(rw, r)
				if rw.status != want {
					b.Errorf("status %d, want %d", rw.status, want)
					return
				}
			}
		})
		b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
	}
	b.Run("replay", func(b *testing.B) { run(b, http.MethodPost, "/v1/charges", key, body, http.StatusCreated) })
	b.Run("get", func(b *testing.B) { run(b, http.MethodGet, "/v1/charges/"+c.ID, "", "", http.StatusOK) })
}

// processCPU is the CPU time (user and system) this process has used: per request, what
// the Go side costs, without PostgreSQL's share of the wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// discardWriter is a ResponseWriter that keeps the status and drops the body.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(p), nil
}
