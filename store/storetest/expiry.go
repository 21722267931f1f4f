package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

func init() {
	register(
		testCase{"ExpiredRecordReadsAsAbsent", testExpiredRecordReadsAsAbsent},
		testCase{"CompletedRecordExpiresAtCreatedPlusTTL", testCompletedExpiresAtCreatedPlusTTL},
		testCase{"InFlightRecordWithLiveLeaseNeverExpires", testInFlightWithLiveLeaseNeverExpires},
	)
}

// wantAbsent fails the test unless the bundle's record reads as absent at now.
func (b *bundle) wantAbsent(what string, now time.Time) {
	b.t.Helper()
	if rec, err := b.get(now); !errors.Is(err, idemstore.ErrNotFound) {
		b.t.Fatalf("%s: RecordGet at t0%+v = %v, %v; want ErrNotFound", what, now.Sub(b.t0), rec, err)
	}
}

// wantFreshClaim claims the bundle's key at now and requires a fresh claim: acquired,
// not a takeover, with the claim's own record id and creation time.
func (b *bundle) wantFreshClaim(what string, now time.Time) *idemstore.ClaimParams {
	b.t.Helper()
	p := b.claimParams(now)
	res := b.claimWant(p, idemstore.ClaimAcquired)
	if res.TookOver {
		b.t.Errorf("%s: TookOver = true, want a fresh claim", what)
	}
	b.wantRecord(what, res.Record, inFlightRecord(p))
	return p
}

func testExpiredRecordReadsAsAbsent(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.claimParams(b.t0)
	p.TTL = time.Minute
	b.claimWant(p, idemstore.ClaimAcquired)
	cp := b.completeParams(p.Token, sampleResponse(), b.at(time.Second))
	cp.TTL = time.Minute
	if err := b.s.RecordComplete(b.ctx, cp); err != nil {
		t.Fatalf("RecordComplete: %v", err)
	}

	b.mustGet(b.at(time.Minute - time.Millisecond))
	b.wantAbsent("completed record at created+TTL", b.at(time.Minute))
	b.wantAbsent("completed record after created+TTL", b.at(time.Hour))

	fresh := b.wantFreshClaim("claim of an expired completed record", b.at(time.Minute))
	if fresh.RecordID == p.RecordID {
		t.Fatal("test bug: fresh claim reused the record id")
	}
	b.wantRecord("record after the fresh claim", b.mustGet(b.at(time.Minute)), inFlightRecord(fresh))
}

func testCompletedExpiresAtCreatedPlusTTL(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	// Completed 30 s after the claim: expiry still counts from created_at.
	b.complete(p.Token, sampleResponse(), b.at(30*time.Second))
	rec := b.mustGet(b.at(ttl - time.Millisecond))
	if want := b.at(ttl); !rec.ExpiresAt.Equal(want) {
		t.Fatalf("ExpiresAt = %v, want created_at + TTL = %v", rec.ExpiresAt, want)
	}
	b.claimWant(b.claimParams(b.at(ttl-time.Millisecond)), idemstore.ClaimCompleted)
	b.wantAbsent("completed record at created+TTL", b.at(ttl))
	b.wantFreshClaim("claim at created+TTL", b.at(ttl))
}

func testInFlightWithLiveLeaseNeverExpires(t *testing.T, h Harness) {
	b := setup(t, h)
	// TTL shorter than the lease: the lease decides.
	const shortTTL = 5 * time.Second
	p := b.claimParams(b.t0)
	p.TTL = shortTTL
	res := b.claimWant(p, idemstore.ClaimAcquired)
	if want := b.at(lease); !res.Record.ExpiresAt.Equal(want) {
		t.Fatalf("ExpiresAt = %v, want max(created_at + TTL, lease_end) = %v", res.Record.ExpiresAt, want)
	}

	// Past created_at + TTL, the lease is live: the record is there, in flight.
	b.mustGet(b.at(7 * time.Second))
	b.claimWant(b.claimParams(b.at(7*time.Second)), idemstore.ClaimInFlight)

	// Renewals push expires_at with the lease.
	rp := b.renewParams(p.Token, lease, b.at(9*time.Second))
	rp.TTL = shortTTL
	end, err := b.s.RecordRenew(b.ctx, rp)
	if err != nil {
		t.Fatalf("RecordRenew: %v", err)
	}
	rec := b.mustGet(b.at(19*time.Second - time.Millisecond))
	if !rec.ExpiresAt.Equal(end) || !end.Equal(b.at(19*time.Second)) {
		t.Fatalf("after renewal: LeaseEnd %v, ExpiresAt %v; want both t0+19s = %v", end, rec.ExpiresAt, b.at(19*time.Second))
	}
	b.claimWant(b.claimParams(b.at(19*time.Second-time.Millisecond)), idemstore.ClaimInFlight)

	// Lease lapsed and created_at + TTL passed: expired, so the next claim is fresh
	// (new record id), not a takeover.
	b.wantAbsent("in-flight record past its lease and TTL", b.at(19*time.Second))
	b.wantFreshClaim("claim of an expired in-flight record", b.at(19*time.Second))
}
