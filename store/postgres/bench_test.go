package postgres_test

import (
	"fmt"
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
