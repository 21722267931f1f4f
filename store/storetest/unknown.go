package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// The cases of the policy unknown (SPEC §13): a claim that finds a key's holder died
// stores 500 outcome_unknown in the record, atomically, instead of taking it over, so
// that every repeat gets the same answer until an operator resolves the key.

func init() {
	register(
		testCase{"PolicyUnknownMarksALapsedLeaseOutcomeUnknown", testUnknownMarks},
		testCase{"PolicyUnknownLeavesALiveLeaseAlone", testUnknownLive},
		testCase{"PolicyUnknownTakesOverARecordReleasedAfterAStep", testUnknownReleased},
		testCase{"ExactlyOneOfConcurrentTakeoversAndMarksActs", testUnknownRace},
		testCase{"DoUnderPolicyUnknownIsOutcomeUnknown", testDoUnknown},
	)
}

// unknownParams is a claim of the bundle's key at now under the policy unknown.
func (b *bundle) unknownParams(now time.Time) *idemstore.ClaimParams {
	p := b.claimParams(now)
	p.OnLapse = idemstore.LapseUnknown
	return p
}

// unknownResponse is what a record marked outcome unknown answers.
var unknownResponse = &idemstore.Response{Status: 500, OutcomeUnknown: true}

func testUnknownMarks(t *testing.T, h Harness) {
	b := setup(t, h)
	dead := b.acquire(b.t0)
	now := b.at(lease + ms(1))
	res := b.claimWant(b.unknownParams(now), idemstore.ClaimCompleted)
	want := completedRecord(inFlightRecord(dead), unknownResponse, ttl)
	if !res.MarkedUnknown || res.TookOver {
		t.Fatalf("claim under the policy unknown: MarkedUnknown %v, TookOver %v; want marked, not taken over", res.MarkedUnknown, res.TookOver)
	}
	b.wantRecord("record marked outcome unknown", res.Record, want)
	b.wantRecord("record marked outcome unknown, read back", b.mustGet(now), want)
	// Every repeat, under either policy, gets the same stored answer; nothing marks it
	// twice.
	for _, p := range []*idemstore.ClaimParams{b.unknownParams(b.at(lease + ms(2))), b.claimParams(b.at(2 * lease))} {
		res := b.claimWant(p, idemstore.ClaimCompleted)
		if res.MarkedUnknown {
			t.Error("a repeat marked the record again")
		}
		b.wantRecord("record answered to a repeat", res.Record, want)
	}
	b.wantLeaseLost("the dead holder, come back", b.fencedOps(dead.Token, b.at(2*lease)))
}

func testUnknownLive(t *testing.T, h Harness) {
	b := setup(t, h)
	b.acquire(b.t0)
	b.wantUnchanged("live lease under the policy unknown", b.at(lease-ms(1)), func() {
		if res := b.claimWant(b.unknownParams(b.at(lease-ms(1))), idemstore.ClaimInFlight); res.MarkedUnknown {
			t.Error("a live lease was marked outcome unknown")
		}
	})
}

func testUnknownReleased(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	p := b.acquire(b.t0)
	b.step(p.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_1"}))
	rel := b.releaseParams(p.Token)
	rel.Now = b.at(time.Second)
	if err := b.s.RecordRelease(b.ctx, rel); err != nil {
		t.Fatal(err)
	}
	// Its holder stopped, knowing where it was: the operation resumes.
	res := b.claimWant(b.unknownParams(b.at(time.Second)), idemstore.ClaimAcquired)
	if !res.TookOver || !res.Released || res.MarkedUnknown || res.Record.RecoveryPoint != "charge_pending" {
		t.Fatalf("claim under the policy unknown of a released record: TookOver %v, Released %v, MarkedUnknown %v, at %q; want a takeover of the released record at charge_pending",
			res.TookOver, res.Released, res.MarkedUnknown, res.Record.RecoveryPoint)
	}
}

// testUnknownRace races claims that would take a dead holder's key over against
// claims that would mark it outcome unknown: exactly one of them acts, and every other
// sees what it did.
func testUnknownRace(t *testing.T, h Harness) {
	b := setup(t, h)
	b.acquire(b.t0)
	const n = 40
	params := make([]*idemstore.ClaimParams, n)
	for i := range params {
		params[i] = b.claimParams(b.at(2 * lease))
		if i%2 == 0 {
			params[i].OnLapse = idemstore.LapseUnknown
		}
	}
	acted := 0
	results := b.claimConcurrently(params)
	for _, res := range results {
		if res.Outcome == idemstore.ClaimAcquired || res.MarkedUnknown {
			acted++
		}
	}
	if acted != 1 {
		t.Fatalf("%d of %d concurrent claims took the key over or marked it, want exactly one", acted, n)
	}
	rec := b.mustGet(b.at(2 * lease))
	for i, res := range results {
		switch {
		case res.Outcome == idemstore.ClaimAcquired && rec.Token != params[i].Token:
			t.Fatalf("claim %d took the key over, but the record is held by %q", i, rec.Token)
		case res.MarkedUnknown && (rec.Response == nil || !rec.Response.OutcomeUnknown):
			t.Fatalf("claim %d marked the record, but it is %v", i, rec.State)
		}
	}
}

func testDoUnknown(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	b.acquire(b.t0) // a holder that died mid-operation
	clock.Advance(lease + ms(1))
	call := b.call()
	call.OnLapse = idemstore.LapseUnknown
	var runs atomic.Int64
	for i := range 2 {
		_, _, err := idem.Do(b.ctx, g, call, func(context.Context) (charge, error) {
			runs.Add(1)
			return charge{ID: "ch_2"}, nil
		})
		if !errors.Is(err, idem.ErrOutcomeUnknown) {
			t.Fatalf("Do %d under the policy unknown after the holder died = %v, want ErrOutcomeUnknown", i+1, err)
		}
	}
	// The policy is the call's; the record answers every call the same way.
	if _, _, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs)); !errors.Is(err, idem.ErrOutcomeUnknown) || runs.Load() != 0 {
		t.Fatalf("Do under the default policy = %v after %d runs, want ErrOutcomeUnknown without running", err, runs.Load())
	}
}
