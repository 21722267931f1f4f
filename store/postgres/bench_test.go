package postgres_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// Latency of the request paths on a warm pool, one goroutine:
//
//	go test -run '^$' -bench . -benchtime 2000x ./store/postgres
func BenchmarkClaimNewKeyAndComplete(b *testing.B) {
	s := newStore(b)
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1","object":"charge"}`)}
	b.ResetTimer()
	for i := range b.N {
		p := claimParams(fmt.Sprintf("bench-%d", i), time.Time{})
		res, err := s.RecordClaim(b.Context(), p)
		if err != nil || res.Outcome != idemstore.ClaimAcquired {
			b.Fatalf("claim: %v %v", res, err)
		}
		err = s.RecordComplete(b.Context(), &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp, TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := newStore(b)
	p := claimParams("bench-replay", time.Time{})
	if _, err := s.RecordClaim(b.Context(), p); err != nil {
		b.Fatal(err)
	}
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1","object":"charge"}`)}
	if err := s.RecordComplete(b.Context(), &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp, TTL: time.Hour}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		retry := *p
		retry.Now = time.Time{}
		res, err := s.RecordClaim(b.Context(), &retry)
		if err != nil || res.Outcome != idemstore.ClaimCompleted {
			b.Fatalf("replay: %v %v", res, err)
		}
	}
}

// BenchmarkInTxNewKey is a whole lease-route request through the middleware whose
// handler inserts a row inside InTx, one goroutine on a warm pool: its latency is
// mostly its round trips (the claim, BEGIN with the INSERT, the completion with COMMIT).
//
//	go test -run '^$' -bench InTxNewKey -benchtime 2000x ./store/postgres
func BenchmarkInTxNewKey(b *testing.B) {
	s := newStore(b)
	table := s.table("bench_items")
	if _, err := s.Pool().Exec(b.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		b.Fatal(err)
	}
	post := poster(insertingHandler(s.Store, txHelpers[0], table)) // txHelpers[0] is InTx
	if code := post("bench-warm-up"); code != http.StatusCreated {
		b.Fatalf("warm-up = %d", code)
	}
	b.ResetTimer()
	for i := range b.N {
		if code := post(fmt.Sprintf("bench-key-%08d", i)); code != http.StatusCreated {
			b.Fatalf("request = %d", code)
		}
	}
}
