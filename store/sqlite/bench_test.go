package sqlite_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/sqlite"
)

// BenchmarkClaimComplete measures a new key's claim and completion (two write
// transactions, each fsynced) from many goroutines of one process.
func BenchmarkClaimComplete(b *testing.B) {
	s, _ := openStore(b, sqlite.Config{})
	var n atomic.Int64
	b.SetParallelism(8) // 8 × GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key := fmt.Sprintf("key-%d", n.Add(1))
			if _, err := s.RecordClaim(ctx, claimParams("bench", key, "tok-"+key, time.Time{})); err != nil {
				b.Error(err)
				return
			}
			if err := s.RecordComplete(ctx, &idemstore.CompleteParams{
				Scope: "bench", Key: key, Token: "tok-" + key, TTL: time.Hour,
				Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)},
			}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkReplay measures the claim of a completed key: a plain read, no write lock.
func BenchmarkReplay(b *testing.B) {
	s, _ := openStore(b, sqlite.Config{})
	ctx := context.Background()
	if _, err := s.RecordClaim(ctx, claimParams("bench", "k", "tok", time.Time{})); err != nil {
		b.Fatal(err)
	}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "bench", Key: "k", Token: "tok", TTL: time.Hour,
		Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := s.RecordClaim(ctx, claimParams("bench", "k", "tok2", time.Time{}))
			if err != nil || res.Outcome != idemstore.ClaimCompleted {
				b.Errorf("replay = %v, %v", res, err)
				return
			}
		}
	})
}
