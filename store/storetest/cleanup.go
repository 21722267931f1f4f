package storetest

import (
	"crypto/rand"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

func init() {
	register(
		testCase{"CleanupDeletesOnlyExpiredRecords", testCleanupDeletesOnlyExpired},
		testCase{"CleanupKeepsRecordsForRetention", testCleanupKeepsRetention},
		testCase{"CleanupNeverDeletesLiveInFlightRecord", testCleanupNeverDeletesLiveInFlight},
		testCase{"CleanupDeletesInBatchesOfLimit", testCleanupDeletesInBatches},
		testCase{"StoreCleanerDeletesExpiredRecords", testStoreCleanerDeletesExpired},
	)
}

// setupCleanup is setup for the cleanup cases, which need Capabilities.BatchedCleanup.
// On other stores it checks that RecordDeleteExpired is the documented no-op, then
// skips.
func setupCleanup(t *testing.T, h Harness) *bundle {
	t.Helper()
	b := setup(t, h)
	if !b.s.Capabilities().BatchedCleanup {
		n, err := b.s.RecordDeleteExpired(b.ctx, &idemstore.DeleteExpiredParams{Limit: 100, Now: b.t0})
		if n != 0 || err != nil {
			t.Errorf("RecordDeleteExpired on a store without BatchedCleanup = %d, %v; want 0, nil", n, err)
		}
		t.Skip("store lacks Capabilities.BatchedCleanup (it expires records itself): skipping cleanup case")
	}
	return b
}

// put creates the record of key at t0: in flight under lease, or completed when
// complete is true; it expires at max(t0 + ttl, t0 + lease) or t0 + ttl.
func (b *bundle) put(key string, ttl, lease time.Duration, complete bool) *idemstore.ClaimParams {
	b.t.Helper()
	p := b.claimParams(b.t0)
	p.Key, p.TTL, p.Lease = key, ttl, lease
	b.claimWant(p, idemstore.ClaimAcquired)
	if complete {
		cp := b.completeParams(p.Token, sampleResponse(), b.t0)
		cp.Key, cp.TTL = key, ttl
		if err := b.s.RecordComplete(b.ctx, cp); err != nil {
			b.t.Fatalf("RecordComplete(%q): %v", key, err)
		}
	}
	return p
}

// deleteExpired runs one cleanup batch and fails the test unless it deleted want.
func (b *bundle) deleteExpired(now time.Time, retention time.Duration, limit, want int) {
	b.t.Helper()
	n, err := b.s.RecordDeleteExpired(b.ctx, &idemstore.DeleteExpiredParams{Retention: retention, Limit: limit, Now: now})
	if err != nil {
		b.t.Fatalf("RecordDeleteExpired(retention %v, limit %d) at t0%+v: %v", retention, limit, now.Sub(b.t0), err)
	}
	if n != want {
		b.t.Fatalf("RecordDeleteExpired(retention %v, limit %d) at t0%+v = %d, want %d", retention, limit, now.Sub(b.t0), n, want)
	}
}

// wantPresent fails the test unless key's record reads as present at now.
func (b *bundle) wantPresent(key string, now time.Time) {
	b.t.Helper()
	if _, err := b.s.RecordGet(b.ctx, &idemstore.GetParams{Scope: b.scope, Key: key, Now: now}); err != nil {
		b.t.Fatalf("RecordGet(%q) at t0%+v after cleanup: %v", key, now.Sub(b.t0), err)
	}
}

func testCleanupDeletesOnlyExpired(t *testing.T, h Harness) {
	b := setupCleanup(t, h)
	b.put("expired-completed", time.Minute, lease, true)
	b.put("expired-lapsed", time.Minute, lease, false)
	b.put("live-completed", time.Hour, lease, true)
	b.put("lapsed-not-expired", time.Hour, lease, false)
	// In flight with a live lease at cleanup time, well past created_at + TTL.
	b.put("live-in-flight", time.Second, 3*time.Minute, false)

	now := b.at(2 * time.Minute)
	b.deleteExpired(now, 0, 100, 2)
	b.deleteExpired(now, 0, 100, 0)
	for _, key := range []string{"live-completed", "lapsed-not-expired", "live-in-flight"} {
		b.wantPresent(key, now)
	}
}

func testCleanupKeepsRetention(t *testing.T, h Harness) {
	b := setupCleanup(t, h)
	b.put("expires-at-1m", time.Minute, lease, true)
	now := b.at(2 * time.Minute) // expired a minute ago
	b.deleteExpired(now, 90*time.Second, 100, 0)
	// Deleted when expires_at < now − retention: not at equality.
	b.deleteExpired(now, time.Minute, 100, 0)
	b.deleteExpired(now, time.Minute-time.Millisecond, 100, 1)
}

func testCleanupNeverDeletesLiveInFlight(t *testing.T, h Harness) {
	b := setupCleanup(t, h)
	b.put("live", time.Second, lease, false)
	now := b.at(5 * time.Second) // past created_at + TTL, lease live
	b.deleteExpired(now, 0, 100, 0)
	b.wantPresent("live", now)

	// Even when the caller's retention would reach past its expiry, a live lease keeps
	// the record. A store may refuse a negative retention instead.
	n, err := b.s.RecordDeleteExpired(b.ctx, &idemstore.DeleteExpiredParams{Retention: -time.Hour, Limit: 100, Now: now})
	if err == nil && n != 0 {
		t.Fatalf("RecordDeleteExpired(retention -1h) deleted %d records, want 0: the lease is live", n)
	}
	b.wantPresent("live", now)
}

func testCleanupDeletesInBatches(t *testing.T, h Harness) {
	b := setupCleanup(t, h)
	const expired, live = 25, 3
	for i := range expired {
		b.put("expired-"+rand.Text(), time.Minute, lease, i%2 == 0)
	}
	var liveKeys []string
	for i := range live {
		k := "live-" + rand.Text()
		liveKeys = append(liveKeys, k)
		b.put(k, time.Hour, lease, i%2 == 0)
	}
	now := b.at(2 * time.Minute)
	b.deleteExpired(now, 0, 10, 10)
	b.deleteExpired(now, 0, 10, 10)
	b.deleteExpired(now, 0, 10, 5)
	b.deleteExpired(now, 0, 10, 0)
	for _, k := range liveKeys {
		b.wantPresent(k, now)
	}
}

// The cleaner a store starts when it opens deletes expired records in the background,
// with nothing started by the application, and keeps live ones.
func testStoreCleanerDeletesExpired(t *testing.T, h Harness) {
	if h.NewStoreWithCleaner == nil {
		t.Skip("the store starts no cleaner of its own (Harness.NewStoreWithCleaner is nil)")
	}
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	now := t0.Add(2 * time.Minute)
	// The cleaner's clock stands at t0, when nothing has expired, until every record is
	// in; then it jumps to now.
	var clock atomic.Pointer[time.Time]
	clock.Store(&t0)
	s, c := h.NewStoreWithCleaner(t, idem.CleanerConfig{Interval: 10 * time.Millisecond, Clock: func() time.Time { return *clock.Load() }})
	if c == nil {
		t.Fatal("the store started no cleaner")
	}
	b := &bundle{t: t, s: s, ctx: t.Context(), t0: t0, scope: "scope-" + rand.Text(), fp: newFingerprint()}
	b.put("expired-completed", time.Minute, lease, true)
	b.put("expired-lapsed", time.Minute, lease, false)
	b.put("live-completed", time.Hour, lease, true)
	clock.Store(&now)

	// Passes that began before the jump delete nothing; wait for them to add up.
	deadline := time.After(time.Minute)
	for deleted := 0; deleted < 2; {
		select {
		case n := <-c.Passes():
			deleted += n
		case <-deadline:
			t.Fatalf("the store's cleaner deleted %d of the 2 expired records in a minute", deleted)
		}
	}
	for _, key := range []string{"expired-completed", "expired-lapsed"} {
		// At t0 they are live: reading as absent there means they are gone.
		if _, err := s.RecordGet(b.ctx, &idemstore.GetParams{Scope: b.scope, Key: key, Now: t0}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("RecordGet(%q) after the store's cleaner = %v, want ErrNotFound", key, err)
		}
	}
	b.wantPresent("live-completed", now)
}
