package storetest

import (
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// ClaimParams.LikelyNew is a hint: a store may claim such a key by its cheapest insert
// first (PostgreSQL: a plain INSERT) and read it only when the insert finds it there.
// These cases check that the hint never changes an answer: for a key in each state a
// claim with the hint gets what the same claim without it gets.

func init() {
	register(
		testCase{"LikelyNewClaimOfAbsentKeyAcquiresTheSameRecord", testLikelyNewAbsent},
		testCase{"LikelyNewClaimOfARecordedKeyAnswersAsAnyClaim", testLikelyNewRecorded},
		testCase{"ExactlyOneOf100ConcurrentLikelyNewClaimsAcquires", testLikelyNewConcurrent},
	)
}

// likelyNew is p with the hint.
func likelyNew(p *idemstore.ClaimParams) *idemstore.ClaimParams {
	q := *p
	q.LikelyNew = true
	return &q
}

func testLikelyNewAbsent(t *testing.T, h Harness) {
	b := setup(t, h)
	p := likelyNew(b.claimParams(b.t0))
	res := b.claimWant(p, idemstore.ClaimAcquired)
	if res.TookOver || res.Released || res.MarkedUnknown {
		t.Errorf("claim of an absent key = %+v, want a fresh claim", res)
	}
	if !res.Now.Equal(b.t0) {
		t.Errorf("result Now = %v, want the injected %v", res.Now, b.t0)
	}
	b.wantRecord("claimed record", res.Record, inFlightRecord(p))
	b.wantRecord("record read back", b.mustGet(b.t0), inFlightRecord(p))

	// A lease longer than the TTL: the record expires with its lease.
	b2 := setup(t, h)
	long := likelyNew(b2.claimParams(b2.t0))
	long.Lease, long.TTL = 2*time.Hour, time.Hour
	res = b2.claimWant(long, idemstore.ClaimAcquired)
	b2.wantRecord("claimed record whose lease outlives its TTL", res.Record, inFlightRecord(long))
	b2.wantRecord("record read back", b2.mustGet(b2.t0), inFlightRecord(long))
}

// testLikelyNewRecorded puts a key in each state a claim can find, and claims it with
// and without the hint, on two keys set up alike.
func testLikelyNewRecorded(t *testing.T, h Harness) {
	type state struct {
		name string
		// prepare records the bundle's key and returns the time of the claim.
		prepare func(b *bundle) time.Time
		// other claims with another fingerprint.
		other bool
		steps bool
	}
	states := []state{
		{name: "in flight, its lease live", prepare: func(b *bundle) time.Time { b.acquire(b.t0); return b.at(ms(1)) }},
		{name: "in flight, its lease lapsed", prepare: func(b *bundle) time.Time { b.acquire(b.t0); return b.at(lease + ms(1)) }},
		{name: "completed", prepare: func(b *bundle) time.Time {
			p := b.acquire(b.t0)
			b.complete(p.Token, sampleResponse(), b.at(ms(1)))
			return b.at(ms(2))
		}},
		{name: "completed, claimed with another fingerprint", other: true, prepare: func(b *bundle) time.Time {
			p := b.acquire(b.t0)
			b.complete(p.Token, sampleResponse(), b.at(ms(1)))
			return b.at(ms(2))
		}},
		{name: "completed and expired", prepare: func(b *bundle) time.Time {
			p := b.acquire(b.t0)
			b.complete(p.Token, sampleResponse(), b.at(ms(1)))
			return b.at(ttl + ms(1))
		}},
		{name: "unfinished, its holder dead", steps: true, prepare: func(b *bundle) time.Time {
			b.deadAfterStep()
			return b.at(ttl + lease)
		}},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			plain, hinted := setup(t, h), setup(t, h)
			if st.steps && !plain.s.Capabilities().RecoveryPoints {
				t.Skip("the store has no recovery points")
			}
			var want, got *idemstore.ClaimResult
			for _, c := range []struct {
				b    *bundle
				hint bool
				res  **idemstore.ClaimResult
			}{{plain, false, &want}, {hinted, true, &got}} {
				now := st.prepare(c.b)
				p := c.b.claimParams(now)
				if st.other {
					p.Fingerprint = newFingerprint()
				}
				p.LikelyNew = c.hint
				*c.res = c.b.claim(p)
			}
			if got.Outcome != want.Outcome || got.TookOver != want.TookOver || got.Released != want.Released || got.MarkedUnknown != want.MarkedUnknown {
				t.Fatalf("with LikelyNew: %v (took over %v, released %v, marked %v); without: %v (%v, %v, %v)",
					got.Outcome, got.TookOver, got.Released, got.MarkedUnknown, want.Outcome, want.TookOver, want.Released, want.MarkedUnknown)
			}
			// The records differ in what is the bundle's own (scope, key, tokens, ids,
			// fingerprints): compare the rest.
			norm := func(b *bundle, r *idemstore.Record) idemstore.Record {
				rel := func(at time.Time) time.Time {
					if at.IsZero() {
						return at
					}
					return time.Unix(0, 0).UTC().Add(at.Sub(b.t0))
				}
				n := *r
				n.Scope, n.Key, n.Token, n.ID, n.Fingerprint = "", "", "", "", idemstore.Fingerprint{}
				n.CreatedAt, n.ExpiresAt, n.LeaseEnd = rel(r.CreatedAt), rel(r.ExpiresAt), rel(r.LeaseEnd)
				return n
			}
			g, w := norm(hinted, got.Record), norm(plain, want.Record)
			if d := diffRecords(&g, &w); d != "" {
				t.Fatalf("the record a claim with LikelyNew found differs from the one without: %s", d)
			}
			if got.Outcome == idemstore.ClaimAcquired && !got.TookOver && got.Record.ID == "" {
				t.Fatal("a fresh claim with LikelyNew has no record id")
			}
		})
	}
}

func testLikelyNewConcurrent(t *testing.T, h Harness) {
	// Half with the hint, half without.
	exactlyOneOfConcurrentClaims(t, h, func(i int, p *idemstore.ClaimParams) { p.LikelyNew = i%2 == 0 })
}
