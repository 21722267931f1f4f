package redis_test

import (
	"context"
	"crypto/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
)

// BenchmarkWaitReplicas measures what claims that wait for a replica cost: a new key's
// store calls (a claim, then a completion) on a private master with one replica, with
// Config.WaitReplicas 0 and 1 in alternating slices (off, on, off, …) of
// waitBenchSlice, so that a noisy neighbour hurts both sides alike. It reports both
// rates, their ratio, and the mean time of one key's two calls, at 1 and at 32
// concurrent callers; it runs once whatever -benchtime says.
//
//	go test ./store/redis -run '^$' -bench WaitReplicas
func BenchmarkWaitReplicas(b *testing.B) {
	master := redistest.StartServer(b, "--repl-diskless-sync-delay", "0")
	redistest.StartReplica(b, master, "")
	// The server is private and dies with the benchmark: its keys are not deleted.
	open := func(query string) *redis.Store {
		s, err := redis.Open(b.Context(), master.URL()+query, redis.Config{Logger: discardLogger()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	stores := [2]*redis.Store{open(""), open("?wait_replicas=1&wait_timeout=1s")}
	for _, callers := range []int{1, 32} {
		b.Run("callers="+itoa(callers), func(b *testing.B) {
			var n [2]int64
			var took [2]time.Duration
			for i := range 2 * waitBenchSlices {
				side := i % 2
				start := time.Now()
				n[side] += newKeysFor(b, stores[side], callers, waitBenchSlice)
				took[side] += time.Since(start)
			}
			off, on := float64(n[0])/took[0].Seconds(), float64(n[1])/took[1].Seconds()
			b.ReportMetric(off, "off-keys/s")
			b.ReportMetric(on, "wait-keys/s")
			b.ReportMetric(on/off, "ratio")
			// With one caller, a key's two calls take the slice's time over its keys.
			if callers == 1 {
				b.ReportMetric(float64(took[0].Microseconds())/float64(n[0]), "off-µs/key")
				b.ReportMetric(float64(took[1].Microseconds())/float64(n[1]), "wait-µs/key")
			}
		})
	}
}

// waitBenchSlices slices of waitBenchSlice make up each side of a measurement.
const (
	waitBenchSlices = 8
	waitBenchSlice  = 500 * time.Millisecond
)

// newKeysFor claims and completes fresh keys on s from callers goroutines for d, and
// returns how many keys it completed; any error fails b.
func newKeysFor(b *testing.B, s *redis.Store, callers int, d time.Duration) int64 {
	var done atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			ctx := context.Background()
			for time.Now().Before(deadline) {
				p := claimParams("bench", "key-"+rand.Text(), time.Time{})
				if _, err := s.RecordClaim(ctx, p); err != nil {
					b.Error(err)
					return
				}
				err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
					Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1","object":"charge"}`)}, TTL: time.Hour})
				if err != nil {
					b.Error(err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load()
}
