package payments

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkCreateCharge measures POST /v1/charges in-process, with and without the
// idempotency middleware (what --disable-idempotency compares), on each database.
//
//	go test -run '^$' -bench CreateCharge ./internal/payments/
func BenchmarkCreateCharge(b *testing.B) {
	for _, dbName := range []string{"sqlite", "postgres"} {
		for _, mode := range []string{"on", "off"} {
			b.Run(fmt.Sprintf("db=%s/idempotency=%s", dbName, mode), func(b *testing.B) {
				benchCharges(b, dbName, mode == "off")
			})
		}
	}
}

func benchCharges(b *testing.B, dbName string, disable bool) {
	var opts []option
	if disable {
		opts = append(opts, withoutIdempotency())
	}
	var bb *bundle
	if dbName == "postgres" {
		bb = postgresBundle(b, opts...)
	} else {
		bb = sqliteBundle(b, opts...)
	}
	b.ResetTimer()
	for i := range b.N {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount": 2000, "currency": "usd"}`))
		r.Header.Set("Authorization", "Bearer tok_bench")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", fmt.Sprintf("bench-key-%012d", i))
		w := httptest.NewRecorder()
		bb.handler.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}
