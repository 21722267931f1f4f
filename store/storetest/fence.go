package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

func init() {
	register(
		testCase{"FencedOperationsWithWrongTokenAreLeaseLostAndChangeNothing", testWrongTokenIsFenced},
		testCase{"FencedOperationsOnAbsentKeyAreLeaseLost", testFencedOnAbsentKey},
		testCase{"CompleteOfCompletedRecordIsLeaseLost", testCompleteOfCompletedIsLeaseLost},
		testCase{"ReleaseAndRenewOfCompletedRecordAreLeaseLost", testReleaseRenewOfCompletedAreLeaseLost},
		testCase{"ReleaseDeletesHeldInFlightRecord", testReleaseDeletesHeldRecord},
		testCase{"LapsedHolderCompletesWhenNobodyTookOver", testLapsedHolderCompletes},
		testCase{"LapsedLeaseIsTakenOverBySameFingerprint", testLapsedLeaseIsTakenOver},
		testCase{"LapsedLeaseWithOtherFingerprintIsMismatch", testLapsedLeaseOtherFingerprint},
		testCase{"ExactlyOneOf100ConcurrentTakeoversAcquires", testExactlyOneOfConcurrentTakeovers},
		testCase{"OldHolderIsFencedAfterTakeover", testOldHolderIsFenced},
		testCase{"NewHolderCompletesAfterTakeover", testNewHolderCompletes},
		testCase{"NewHolderRenewsAndReleasesAfterTakeover", testNewHolderRenewsAndReleases},
		testCase{"RenewExtendsLease", testRenewExtendsLease},
	)
}

// fencedOps runs complete, release and renew as the holder of token at now, and returns
// each one's error by name.
func (b *bundle) fencedOps(token string, now time.Time) map[string]error {
	_, renewErr := b.s.RecordRenew(b.ctx, b.renewParams(token, lease, now))
	return map[string]error{
		"RecordRenew":    renewErr,
		"RecordComplete": b.s.RecordComplete(b.ctx, b.completeParams(token, sampleResponse(), now)),
		"RecordRelease":  b.s.RecordRelease(b.ctx, b.releaseParams(token)),
	}
}

func (b *bundle) renewParams(token string, l time.Duration, now time.Time) *idemstore.RenewParams {
	return &idemstore.RenewParams{Scope: b.scope, Key: b.key, Token: token, Lease: l, TTL: ttl, Now: now}
}

func (b *bundle) releaseParams(token string) *idemstore.ReleaseParams {
	return &idemstore.ReleaseParams{Scope: b.scope, Key: b.key, Token: token}
}

// wantLeaseLost fails the test unless every operation in errs returned ErrLeaseLost.
func (b *bundle) wantLeaseLost(what string, errs map[string]error) {
	b.t.Helper()
	for op, err := range errs {
		if !errors.Is(err, idemstore.ErrLeaseLost) {
			b.t.Errorf("%s: %s = %v, want ErrLeaseLost", what, op, err)
		}
	}
}

// wantUnchanged runs ops and fails the test unless the record read at now is the same
// before and after.
func (b *bundle) wantUnchanged(what string, now time.Time, ops func()) {
	b.t.Helper()
	before := b.mustGet(now)
	ops()
	b.wantRecord(what+": record after", b.mustGet(now), before)
}

func testWrongTokenIsFenced(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	for _, token := range []string{newToken(), "", p.Token + "x", p.Token[:len(p.Token)-1]} {
		b.wantUnchanged("in flight, wrong token", b.at(ms(1)), func() {
			b.wantLeaseLost("token "+token, b.fencedOps(token, b.at(ms(1))))
		})
	}
	// The holder still holds the key after all that.
	if _, err := b.s.RecordRenew(b.ctx, b.renewParams(p.Token, lease, b.at(ms(2)))); err != nil {
		t.Fatalf("holder's RecordRenew after wrong-token attempts: %v", err)
	}
}

func testFencedOnAbsentKey(t *testing.T, h Harness) {
	b := setup(t, h)
	b.wantLeaseLost("absent key", b.fencedOps(newToken(), b.t0))
	if _, err := b.get(b.t0); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet after fenced operations on an absent key = %v, want ErrNotFound", err)
	}
}

func testCompleteOfCompletedIsLeaseLost(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	b.complete(p.Token, sampleResponse(), b.at(ms(1)))
	b.wantUnchanged("completed twice", b.at(ms(2)), func() {
		other := &idemstore.Response{Status: 500, Body: []byte("second")}
		err := b.s.RecordComplete(b.ctx, b.completeParams(p.Token, other, b.at(ms(2))))
		if !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("second RecordComplete with the holder's token = %v, want ErrLeaseLost", err)
		}
	})
}

func testReleaseRenewOfCompletedAreLeaseLost(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	b.complete(p.Token, sampleResponse(), b.at(ms(1)))
	b.wantUnchanged("completed record", b.at(ms(2)), func() {
		if err := b.s.RecordRelease(b.ctx, b.releaseParams(p.Token)); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("RecordRelease of a completed record = %v, want ErrLeaseLost", err)
		}
		if _, err := b.s.RecordRenew(b.ctx, b.renewParams(p.Token, lease, b.at(ms(2)))); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("RecordRenew of a completed record = %v, want ErrLeaseLost", err)
		}
	})
	b.claimWant(b.claimParams(b.at(ms(3))), idemstore.ClaimCompleted)
}

func testReleaseDeletesHeldRecord(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	if err := b.s.RecordRelease(b.ctx, b.releaseParams(p.Token)); err != nil {
		t.Fatalf("holder's RecordRelease: %v", err)
	}
	if _, err := b.get(b.at(ms(1))); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet after release = %v, want ErrNotFound", err)
	}
	if err := b.s.RecordRelease(b.ctx, b.releaseParams(p.Token)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("second RecordRelease = %v, want ErrLeaseLost", err)
	}
	// A retry executes afresh: a new record, not a takeover.
	retry := b.claimParams(b.at(ms(2)))
	res := b.claimWant(retry, idemstore.ClaimAcquired)
	if res.TookOver {
		t.Error("claim after release: TookOver = true, want a fresh claim")
	}
	b.wantRecord("record claimed after release", res.Record, inFlightRecord(retry))
}

func testLapsedHolderCompletes(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	// The lease lapsed at t0+10s but nobody took the key over: the holder still holds it.
	b.complete(p.Token, sampleResponse(), b.at(lease+time.Second))
	b.wantRecord("record completed after its lease lapsed", b.mustGet(b.at(lease+time.Second)),
		completedRecord(inFlightRecord(p), sampleResponse(), ttl))
}

// takeOver claims the bundle's key at now, after first's lease lapsed, and requires a
// takeover that keeps the record's id and creation time.
func (b *bundle) takeOver(first *idemstore.ClaimParams, now time.Time) *idemstore.ClaimParams {
	b.t.Helper()
	p := b.claimParams(now)
	res := b.claimWant(p, idemstore.ClaimAcquired)
	if !res.TookOver || res.Released {
		b.t.Fatalf("claim of a lapsed lease: TookOver %v, Released %v; want a takeover, not of a released record", res.TookOver, res.Released)
	}
	want := inFlightRecord(first)
	want.Token = p.Token
	want.LeaseEnd = now.Add(p.Lease)
	want.ExpiresAt = idemstore.InFlightExpiresAt(want.CreatedAt, p.TTL, want.LeaseEnd)
	b.wantRecord("taken-over record", res.Record, want)
	b.wantRecord("taken-over record read back", b.mustGet(now), want)
	return p
}

func testLapsedLeaseIsTakenOver(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	// The lease lapses at exactly LeaseEnd (Record.LeaseLive).
	second := b.takeOver(first, b.at(lease))
	if second.Token == first.Token {
		t.Fatal("test bug: the takeover reused the first token")
	}
	// Taken over again after the second lease lapsed: still the same record.
	b.takeOver(first, b.at(3*lease))
}

func testLapsedLeaseOtherFingerprint(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	b.wantUnchanged("lapsed lease, other fingerprint", b.at(2*lease), func() {
		p := b.claimParams(b.at(2 * lease))
		p.Fingerprint = newFingerprint()
		res := b.claimWant(p, idemstore.ClaimMismatch)
		if res.TookOver {
			t.Error("mismatch: TookOver = true")
		}
	})
	// The original request's retry still takes it over.
	b.takeOver(first, b.at(2*lease))
}

func testExactlyOneOfConcurrentTakeovers(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	const n = 100
	params := make([]*idemstore.ClaimParams, n)
	for i := range params {
		params[i] = b.claimParams(b.at(2 * lease))
	}
	results := b.claimConcurrently(params)
	winner := -1
	for i, res := range results {
		switch res.Outcome {
		case idemstore.ClaimAcquired:
			if winner >= 0 {
				t.Fatalf("claims %d and %d both took the key over", winner, i)
			}
			if !res.TookOver {
				t.Errorf("claim %d acquired with TookOver = false", i)
			}
			winner = i
		case idemstore.ClaimInFlight:
		default:
			t.Errorf("claim %d = %v, want acquired or in_flight", i, res.Outcome)
		}
	}
	if winner < 0 {
		t.Fatal("none of the concurrent takeovers acquired the key")
	}
	rec := b.mustGet(b.at(2 * lease))
	if rec.Token != params[winner].Token || rec.ID != first.RecordID || !rec.CreatedAt.Equal(b.t0) {
		t.Fatalf("record after the race: token %q id %q created %v, want the winner's token %q, id %q, created %v",
			rec.Token, rec.ID, rec.CreatedAt, params[winner].Token, first.RecordID, b.t0)
	}
	b.wantLeaseLost("first holder after the race", b.fencedOps(first.Token, b.at(2*lease)))
}

func testOldHolderIsFenced(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	b.takeOver(first, b.at(lease+time.Second))
	b.wantUnchanged("old holder after takeover", b.at(lease+2*time.Second), func() {
		b.wantLeaseLost("old holder after takeover", b.fencedOps(first.Token, b.at(lease+2*time.Second)))
	})
}

func testNewHolderCompletes(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	second := b.takeOver(first, b.at(lease+time.Second))
	b.complete(second.Token, sampleResponse(), b.at(lease+2*time.Second))
	// created_at is the first claim's, so the record expires at t0 + TTL.
	b.wantRecord("record completed by the new holder", b.mustGet(b.at(lease+3*time.Second)),
		completedRecord(inFlightRecord(first), sampleResponse(), ttl))
	b.wantLeaseLost("old holder after completion", b.fencedOps(first.Token, b.at(lease+3*time.Second)))
}

func testNewHolderRenewsAndReleases(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	second := b.takeOver(first, b.at(lease+time.Second))
	end, err := b.s.RecordRenew(b.ctx, b.renewParams(second.Token, lease, b.at(lease+5*time.Second)))
	if err != nil {
		t.Fatalf("new holder's RecordRenew: %v", err)
	}
	if want := b.at(2*lease + 5*time.Second); !end.Equal(want) {
		t.Errorf("new holder's RecordRenew = %v, want %v", end, want)
	}
	if err := b.s.RecordRelease(b.ctx, b.releaseParams(second.Token)); err != nil {
		t.Fatalf("new holder's RecordRelease: %v", err)
	}
	if _, err := b.get(b.at(lease + 6*time.Second)); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet after the new holder's release = %v, want ErrNotFound", err)
	}
}

func testRenewExtendsLease(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0) // lease 10 s: lapses at t0+10s unless renewed
	end, err := b.s.RecordRenew(b.ctx, b.renewParams(p.Token, lease, b.at(8*time.Second)))
	if err != nil {
		t.Fatalf("RecordRenew at t0+8s: %v", err)
	}
	if want := b.at(18 * time.Second); !end.Equal(want) {
		t.Fatalf("RecordRenew at t0+8s = %v, want t0+18s = %v", end, want)
	}
	want := inFlightRecord(p)
	want.LeaseEnd = end
	b.wantRecord("renewed record", b.mustGet(b.at(12*time.Second)), want)

	res := b.claimWant(b.claimParams(b.at(12*time.Second)), idemstore.ClaimInFlight)
	if !res.Record.LeaseEnd.Equal(end) {
		t.Errorf("in-flight answer at t0+12s: LeaseEnd = %v, want %v", res.Record.LeaseEnd, end)
	}
	b.claimWant(b.claimParams(b.at(18*time.Second-time.Millisecond)), idemstore.ClaimInFlight)
	b.takeOver(p, b.at(18*time.Second))
}
