package storetest

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

func init() {
	register(
		testCase{"ClaimOfAbsentKeyAcquiresInFlightRecord", testClaimOfAbsentKeyAcquires},
		testCase{"ExactlyOneOf100ConcurrentClaimsAcquires", testExactlyOneOfConcurrentClaims},
		testCase{"ClaimOfInFlightKeyIsInFlightUntilLeaseEnd", testClaimOfInFlightKey},
		testCase{"ClaimOfCompletedKeyReplaysResponseByteForByte", testClaimOfCompletedKeyReplays},
		testCase{"ClaimWithOtherFingerprintIsMismatch", testClaimWithOtherFingerprintIsMismatch},
		testCase{"MismatchLeavesRecordIntact", testMismatchLeavesRecordIntact},
		testCase{"FingerprintVersionIsStoredAndReturned", testFingerprintVersionIsStored},
		testCase{"KeyedAndPlainFingerprintsNeverMatch", testKeyedAndPlainNeverMatch},
		testCase{"PingAnswers", testPingAnswers},
	)
}

func testClaimOfAbsentKeyAcquires(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.claimParams(b.t0)
	res := b.claimWant(p, idemstore.ClaimAcquired)
	if res.TookOver {
		t.Error("TookOver = true for a claim of an absent key")
	}
	if !res.Now.Equal(b.t0) {
		t.Errorf("result Now = %v, want the injected %v", res.Now, b.t0)
	}
	b.wantRecord("claimed record", res.Record, inFlightRecord(p))
	b.wantRecord("record read back", b.mustGet(b.t0), inFlightRecord(p))
}

func testExactlyOneOfConcurrentClaims(t *testing.T, h Harness) {
	exactlyOneOfConcurrentClaims(t, h, func(int, *idemstore.ClaimParams) {})
}

// exactlyOneOfConcurrentClaims races 100 claims of one absent key, each readied by
// ready, and requires exactly one acquired, every other in flight under its token.
func exactlyOneOfConcurrentClaims(t *testing.T, h Harness, ready func(i int, p *idemstore.ClaimParams)) {
	b := setup(t, h)
	const n = 100
	params := make([]*idemstore.ClaimParams, n)
	for i := range params {
		params[i] = b.claimParams(b.t0)
		ready(i, params[i])
	}
	results := b.claimConcurrently(params)

	winner := -1
	for i, res := range results {
		switch res.Outcome {
		case idemstore.ClaimAcquired:
			if winner >= 0 {
				t.Fatalf("claims %d and %d both acquired the key", winner, i)
			}
			winner = i
		case idemstore.ClaimInFlight:
			if res.Record.Fingerprint != b.fp {
				t.Errorf("claim %d: in-flight record fingerprint = %v, want %v", i, res.Record.Fingerprint, b.fp)
			}
		default:
			t.Errorf("claim %d = %v, want acquired or in_flight", i, res.Outcome)
		}
	}
	if winner < 0 {
		t.Fatal("none of the concurrent claims acquired the key")
	}
	for i, res := range results {
		if i != winner && res.Record.Token != "" && res.Record.Token != params[winner].Token {
			t.Errorf("claim %d saw token %q, want the winner's %q", i, res.Record.Token, params[winner].Token)
		}
	}
	b.wantRecord("record after the race", b.mustGet(b.t0), inFlightRecord(params[winner]))
}

// claimConcurrently runs every claim at once, one goroutine each, and returns their
// results in order. Errors fail the test.
func (b *bundle) claimConcurrently(params []*idemstore.ClaimParams) []*idemstore.ClaimResult {
	b.t.Helper()
	results := make([]*idemstore.ClaimResult, len(params))
	errs := make([]error, len(params))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, p := range params {
		wg.Go(func() {
			<-start
			results[i], errs[i] = b.s.RecordClaim(b.ctx, p)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.t.Fatalf("concurrent claim %d: %v", i, err)
		}
		if results[i].Record == nil {
			b.t.Fatalf("concurrent claim %d = %v with a nil Record", i, results[i].Outcome)
		}
	}
	return results
}

func testClaimOfInFlightKey(t *testing.T, h Harness) {
	b := setup(t, h)
	first := b.acquire(b.t0)
	for _, d := range []int{0, 1, 9999} { // milliseconds into the 10 s lease
		at := b.at(ms(d))
		res := b.claimWant(b.claimParams(at), idemstore.ClaimInFlight)
		if res.TookOver {
			t.Errorf("at t0+%dms: TookOver = true for an in-flight answer", d)
		}
		if !res.Record.LeaseEnd.Equal(b.at(lease)) {
			t.Errorf("at t0+%dms: LeaseEnd = %v, want t0+%v = %v", d, res.Record.LeaseEnd, lease, b.at(lease))
		}
		b.wantRecord("in-flight record answered", res.Record, inFlightRecord(first))
	}
}

func testClaimOfCompletedKeyReplays(t *testing.T, h Harness) {
	for name, resp := range replayResponses() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, h)
			p := b.acquire(b.t0)
			b.complete(p.Token, cloneResponse(resp), b.at(ms(5)))

			res := b.claimWant(b.claimParams(b.at(ms(10))), idemstore.ClaimCompleted)
			if res.TookOver {
				t.Error("TookOver = true for a replay")
			}
			want := completedRecord(inFlightRecord(p), resp, ttl)
			b.wantRecord("replayed record", res.Record, want)
			b.wantRecord("record read back", b.mustGet(b.at(ms(10))), want)
		})
	}
}

// replayResponses are responses that must come back exactly as stored.
func replayResponses() map[string]*idemstore.Response {
	binary := make([]byte, 512)
	for i := range binary {
		binary[i] = byte(i)
	}
	return map[string]*idemstore.Response{
		"json":       sampleResponse(),
		"empty body": {Status: 204, Header: http.Header{"Etag": {`"v1"`}}, Body: []byte{}},
		"nil body":   {Status: 202, Body: nil},
		"no headers": {Status: 200, Body: []byte("ok")},
		"binary":     {Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: binary},
		"402 card declined": {
			Status: 402,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   []byte(`{"error":{"type":"card_error","code":"card_declined"}}`),
		},
	}
}

func cloneResponse(r *idemstore.Response) *idemstore.Response {
	c := *r
	c.Header = r.Header.Clone()
	c.Body = append([]byte(nil), r.Body...)
	if r.Body != nil && len(r.Body) == 0 {
		c.Body = []byte{}
	}
	return &c
}

func testClaimWithOtherFingerprintIsMismatch(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)

	other := b.claimParams(b.at(ms(1)))
	other.Fingerprint = newFingerprint()
	res := b.claimWant(other, idemstore.ClaimMismatch)
	b.wantRecord("mismatched in-flight record", res.Record, inFlightRecord(p))

	b.complete(p.Token, sampleResponse(), b.at(ms(2)))
	other = b.claimParams(b.at(ms(3)))
	other.Fingerprint = newFingerprint()
	res = b.claimWant(other, idemstore.ClaimMismatch)
	b.wantRecord("mismatched completed record", res.Record, completedRecord(inFlightRecord(p), sampleResponse(), ttl))
}

func testMismatchLeavesRecordIntact(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	mismatch := func(state string) {
		t.Helper()
		before := b.mustGet(b.at(ms(10)))
		for i := range 3 {
			other := b.claimParams(b.at(ms(10 + i)))
			other.Fingerprint = newFingerprint()
			b.claimWant(other, idemstore.ClaimMismatch)
		}
		b.wantRecord(state+" record after mismatches", b.mustGet(b.at(ms(20))), before)
	}
	mismatch("in-flight")
	// The holder still holds the key: the mismatches took nothing from it.
	b.complete(p.Token, sampleResponse(), b.at(ms(30)))
	mismatch("completed")
}

func testFingerprintVersionIsStored(t *testing.T, h Harness) {
	b := setup(t, h)
	b.fp = idemstore.Fingerprint{Version: 1, Sum: newFingerprint().Sum}
	p := b.acquire(b.t0)
	if got := b.mustGet(b.t0).Fingerprint; got != b.fp {
		t.Fatalf("stored fingerprint = %v, want %v", got, b.fp)
	}

	// A version-2 claim cannot be compared with a version-1 record: it is taken to match
	// (Fingerprint.Matches), never key_reused.
	v2 := b.claimParams(b.at(ms(1)))
	v2.Fingerprint = idemstore.Fingerprint{Version: 2, Sum: newFingerprint().Sum}
	res := b.claimWant(v2, idemstore.ClaimInFlight)
	if res.Record.Fingerprint != b.fp {
		t.Errorf("in-flight answer fingerprint = %v, want the stored %v", res.Record.Fingerprint, b.fp)
	}

	b.complete(p.Token, sampleResponse(), b.at(ms(2)))
	v2.Now = b.at(ms(3))
	res = b.claimWant(v2, idemstore.ClaimCompleted)
	if res.Record.Fingerprint != b.fp {
		t.Errorf("replayed fingerprint = %v, want the stored %v", res.Record.Fingerprint, b.fp)
	}
	if !res.Record.Response.Equal(sampleResponse()) {
		t.Errorf("replayed response = %s", describeResponse(res.Record.Response))
	}
}

// testKeyedAndPlainNeverMatch: a keyed fingerprint (version 1000 and up, SPEC §19)
// and a plain one never match, whatever their sums (Fingerprint.Matches): a claim of
// the other kind is key_reused on a record in flight, completed or lapsed, and takes
// nothing over; the core decides what to do with it, holding both forms of the
// request's fingerprint.
func testKeyedAndPlainNeverMatch(t *testing.T, h Harness) {
	for _, keyedFirst := range []bool{false, true} {
		b := setup(t, h)
		plain := idemstore.Fingerprint{Version: idemstore.FingerprintVersion, Sum: b.fp.Sum}
		keyed := idemstore.Fingerprint{Version: idemstore.KeyedVersionOffset + idemstore.FingerprintVersion, Sum: b.fp.Sum}
		first, other := plain, keyed
		if keyedFirst {
			first, other = keyed, plain
		}
		b.fp = first
		p := b.acquire(b.t0)
		before := b.mustGet(b.t0)
		claim := func(now time.Time) {
			t.Helper()
			q := b.claimParams(now)
			q.Fingerprint = other
			res := b.claimWant(q, idemstore.ClaimMismatch)
			if res.Record.Fingerprint != first {
				t.Errorf("keyed first %v: mismatch answer's fingerprint = %v, want the stored %v", keyedFirst, res.Record.Fingerprint, first)
			}
		}
		claim(b.at(ms(1)))         // in flight, live
		claim(b.at(lease + ms(1))) // in flight, lapsed: not taken over
		b.wantRecord("record after the other kind's claims", b.mustGet(b.at(lease+ms(2))), before)
		b.complete(p.Token, sampleResponse(), b.at(lease+ms(3)))
		claim(b.at(lease + ms(4))) // completed
	}
}

func testPingAnswers(t *testing.T, h Harness) {
	b := setup(t, h)
	if err := b.s.Ping(b.ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
