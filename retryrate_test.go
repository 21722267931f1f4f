package idem

import (
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// The estimate follows the model it documents, whatever the sequence: an exponentially
// weighted mean with weight 1/32, read-first above 1/4 and again below 1/8.
func TestRetryRateFollowsItsModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var r retryRate
		mean, reading := 0.0, false
		for i, found := range rapid.SliceOfN(rapid.Bool(), 1, 400).Draw(t, "outcomes") {
			r.observe(found)
			x := 0.0
			if found {
				x = 1
			}
			mean += (x - mean) / 32
			switch {
			case !reading && mean > 0.25+1e-4:
				reading = true
			case reading && mean < 0.125-1e-4:
				reading = false
			}
			got := float64(r.v.Load()&^rateReading) / rateOne
			if d := got - mean; d > 1e-3 || d < -1e-3 {
				t.Fatalf("after %d outcomes the mean is %.5f, the model's %.5f", i+1, got, mean)
			}
			// Near a threshold the fixed point may decide a step apart from the model.
			if r.readFirst() != reading && !(mean > 0.249 && mean < 0.251) && !(mean > 0.124 && mean < 0.126) {
				t.Fatalf("after %d outcomes (mean %.4f) readFirst = %v, the model says %v", i+1, mean, r.readFirst(), reading)
			}
		}
	})
}

// Concurrent observations are never lost: n finds from zero give the mean of n finds.
func TestRetryRateCountsConcurrentObservations(t *testing.T) {
	t.Parallel()
	var r retryRate
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 4 {
				r.observe(true)
			}
		})
	}
	wg.Wait()
	var want retryRate
	for range 32 {
		want.observe(true)
	}
	if r.v.Load() != want.v.Load() {
		t.Fatalf("32 concurrent finds left %x, 32 in a row %x", r.v.Load(), want.v.Load())
	}
}
