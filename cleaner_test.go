package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// seed puts records into st at now: completed ones with ttl, and in-flight ones with
// a lease.
func seedRecords(t *testing.T, st idem.Store, now time.Time, prefix string, n int, ttl, lease time.Duration, complete bool) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		k := fmt.Sprintf("%s-%02d-key", prefix, i)
		_, err := st.RecordClaim(ctx, &idem.RecordClaimParams{
			Scope: "alice", Key: k, Token: "tok" + k, RecordID: "id" + k,
			Fingerprint: idem.Fingerprint{Version: 1}, Lease: lease, TTL: ttl, Now: now,
		})
		if err != nil {
			t.Fatal(err)
		}
		if complete {
			err = st.RecordComplete(ctx, &idem.RecordCompleteParams{
				Scope: "alice", Key: k, Token: "tok" + k, TTL: ttl, Now: now,
				Response: &idem.Response{Status: 201},
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestCleanerDeletesOnlyExpiredRecordsInBatches(t *testing.T) {
	t.Parallel()
	st := &countingStore{Store: memory.New()}
	clk := newClock()
	start := clk.Now()
	seedRecords(t, st, start, "expired", 5, time.Hour, time.Second, true)
	seedRecords(t, st, start, "live", 2, 3*time.Hour, time.Second, true)
	seedRecords(t, st, start, "leased", 1, time.Hour, 4*time.Hour, false) // in flight, lease outlives the ttl
	clk.Advance(2 * time.Hour)

	c := idem.NewCleaner(st, idem.CleanerConfig{BatchSize: 2, Clock: clk.Now})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	if n := <-c.Passes(); n != 5 {
		t.Errorf("first pass deleted %d, want 5", n)
	}
	cancel()
	<-done
	if got := st.deletes.Load(); got != 3 {
		t.Errorf("%d batches, want 3 (2+2+1)", got)
	}
	if got := st.Len(); got != 3 {
		t.Errorf("%d records left, want the 2 live and the 1 leased", got)
	}
}

func TestCleanerKeepsRecordsForTheRetention(t *testing.T) {
	t.Parallel()
	st := memory.New()
	clk := newClock()
	seedRecords(t, st, clk.Now(), "r", 3, time.Hour, time.Second, true)
	clk.Advance(90 * time.Minute)
	c := idem.NewCleaner(st, idem.CleanerConfig{Retention: time.Hour, Clock: clk.Now})
	if n, err := c.Pass(context.Background()); n != 0 || err != nil {
		t.Fatalf("within retention: deleted %d, %v", n, err)
	}
	clk.Advance(time.Hour)
	if n, err := c.Pass(context.Background()); n != 3 || err != nil {
		t.Fatalf("after retention: deleted %d, %v", n, err)
	}
}

func TestCleanerSkipsStoresThatExpireRecordsThemselves(t *testing.T) {
	t.Parallel()
	st := &countingStore{Store: memory.New(), noBatchedCleanup: true}
	idem.NewCleaner(st, idem.CleanerConfig{}).Run(context.Background()) // returns at once
	if st.deletes.Load() != 0 {
		t.Error("the cleaner deleted on a store without batched cleanup")
	}
}

func TestCleanerSurvivesStoreErrors(t *testing.T) {
	t.Parallel()
	st := &countingStore{Store: memory.New()}
	clk := newClock()
	seedRecords(t, st, clk.Now(), "e", 2, time.Hour, time.Second, true)
	clk.Advance(2 * time.Hour)
	st.down.Store(true)
	c := idem.NewCleaner(st, idem.CleanerConfig{Interval: time.Millisecond, Clock: clk.Now, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	if n := <-c.Passes(); n != 0 {
		t.Fatalf("failing pass deleted %d", n)
	}
	st.down.Store(false)
	for n := range c.Passes() {
		if n == 2 {
			break
		}
	}
}

func TestMiddlewareCleanerConfigCarriesRetention(t *testing.T) {
	t.Parallel()
	m := idem.New(idem.Config{Store: memory.New(), Scope: bearerScope, Retention: time.Hour})
	if got := m.CleanerConfig().Retention; got != time.Hour {
		t.Errorf("Retention = %v", got)
	}
}
