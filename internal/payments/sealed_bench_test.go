package payments

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// benchRuns numbers the runs of the new-key benchmark, whose keys must be new.
var benchRuns atomic.Int64

// BenchmarkSealedVsClear measures in-process what sealing the records (Config.Seal,
// SPEC §19) costs the Go side of POST /v1/charges on SQLite, a new key and a replay,
// next to the same API storing records in clear: run the sub-benchmarks side by side,
// several times, and compare cpu-µs/op (the process's CPU time per request).
//
//	go test ./internal/payments -run '^$' -bench SealedVsClear -benchmem -count 4
func BenchmarkSealedVsClear(b *testing.B) {
	const body = `{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`
	for _, mode := range []struct {
		name string
		opts []option
	}{{"clear", nil}, {"sealed", []option{withSeal(b)}}} {
		bb := sqliteBundle(b, mode.opts...)
		if w := bb.postCharge("tok_bench", "bench-replay-key-0001", body); w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
		serve := func(b *testing.B, key func(i int) string) {
			b.ReportAllocs()
			cpu := processCPU()
			rw := &discardWriter{h: http.Header{}}
			i := 0
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
				r.Header.Set("Authorization", "Bearer tok_bench")
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", key(i))
				i++
				clear(rw.h)
				rw.status = 0
				bb.handler.ServeHTTP(rw, r)
				if rw.status != http.StatusCreated {
					b.Fatalf("status %d", rw.status)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
		}
		b.Run("replay/"+mode.name, func(b *testing.B) { serve(b, func(int) string { return "bench-replay-key-0001" }) })
		b.Run("new/"+mode.name, func(b *testing.B) {
			prefix := "bench-new-" + mode.name + "-" + itoa(benchRuns.Add(1)) + "-"
			serve(b, func(i int) string { return prefix + itoa(int64(i)) })
		})
	}
}
