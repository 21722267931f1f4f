package storetest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

func init() {
	register(
		testCase{"TxCompletionCommitsWithApplicationWrites", testTxCompletionCommits},
		testCase{"TxCompletionAfterTakeoverCommitsNothing", testTxCompletionAfterTakeover},
		testCase{"TxCompletionByNewHolderCommits", testTxCompletionByNewHolder},
		testCase{"TxCompletionRaceWithTakeoverCommitsExactlyOne", testTxCompletionRace},
	)
}

// setupTx is setup for the SPEC §7 cases, which need Capabilities.Transactions and a
// Harness.Tx.
func setupTx(t *testing.T, h Harness) *bundle {
	t.Helper()
	b := setup(t, h)
	if !b.s.Capabilities().Transactions {
		t.Skip("store lacks Capabilities.Transactions (no SPEC §7 helper): skipping transaction case")
	}
	if h.Tx == nil {
		t.Fatal("store declares Capabilities.Transactions but Harness.Tx is nil: SPEC §7 would go untested")
	}
	return b
}

func newMarker() string { return "marker-" + rand.Text() }

// writeAndComplete runs h.Tx.WriteAndComplete for the holder of token with resp.
func (b *bundle) writeAndComplete(h Harness, token string, resp *idem.Response, marker string) error {
	return h.Tx.WriteAndComplete(b.ctx, b.s, b.completeParams(token, resp, b.at(2*lease)), marker)
}

// wantMarker fails the test unless marker's commit state is want.
func (b *bundle) wantMarker(h Harness, marker string, want bool) {
	b.t.Helper()
	got, err := h.Tx.MarkerCommitted(b.ctx, b.s, marker)
	if err != nil {
		b.t.Fatalf("MarkerCommitted(%q): %v", marker, err)
	}
	if got != want {
		b.t.Fatalf("marker %q committed = %v, want %v", marker, got, want)
	}
}

func testTxCompletionCommits(t *testing.T, h Harness) {
	b := setupTx(t, h)
	p := b.acquire(b.t0)
	marker := newMarker()
	if err := b.writeAndComplete(h, p.Token, sampleResponse(), marker); err != nil {
		t.Fatalf("WriteAndComplete by the holder: %v", err)
	}
	b.wantMarker(h, marker, true)
	b.wantRecord("record completed in the transaction", b.mustGet(b.at(2*lease)),
		completedRecord(inFlightRecord(p), sampleResponse(), ttl))
}

func testTxCompletionAfterTakeover(t *testing.T, h Harness) {
	b := setupTx(t, h)
	first := b.acquire(b.t0)
	b.takeOver(first, b.at(lease+ms(1)))
	marker := newMarker()
	b.wantUnchanged("old holder's transaction", b.at(2*lease), func() {
		if err := b.writeAndComplete(h, first.Token, sampleResponse(), marker); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("WriteAndComplete by the old holder after a takeover = %v, want ErrLeaseLost", err)
		}
	})
	b.wantMarker(h, marker, false)
}

func testTxCompletionByNewHolder(t *testing.T, h Harness) {
	b := setupTx(t, h)
	first := b.acquire(b.t0)
	second := b.takeOver(first, b.at(lease+ms(1)))
	oldMarker, newMarker := newMarker(), newMarker()
	if err := b.writeAndComplete(h, first.Token, sampleResponse(), oldMarker); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("WriteAndComplete by the old holder = %v, want ErrLeaseLost", err)
	}
	if err := b.writeAndComplete(h, second.Token, sampleResponse(), newMarker); err != nil {
		t.Fatalf("WriteAndComplete by the new holder: %v", err)
	}
	b.wantMarker(h, oldMarker, false)
	b.wantMarker(h, newMarker, true)
	b.wantRecord("record completed by the new holder", b.mustGet(b.at(2*lease)),
		completedRecord(inFlightRecord(first), sampleResponse(), ttl))
}

// testTxCompletionRace races, on each of several keys, the old holder's transaction
// against a takeover followed by the new holder's transaction: whichever wins, exactly
// one transaction commits, and the stored response is the committer's.
func testTxCompletionRace(t *testing.T, h Harness) {
	b := setupTx(t, h)
	const rounds = 20
	type round struct {
		k                *bundle
		first            *idem.RecordClaimParams
		oldMark, newMark string
		oldErr, newErr   error
		takeover         *idem.RecordClaimResult
		claimErr         error
	}
	rs := make([]*round, rounds)
	for i := range rs {
		k := *b
		k.key = fmt.Sprintf("%s-%d", b.key, i)
		rs[i] = &round{k: &k, first: k.acquire(b.t0), oldMark: newMarker(), newMark: newMarker()}
	}
	oldResp := &idem.Response{Status: 201, Body: []byte("old holder")}
	newResp := &idem.Response{Status: 201, Body: []byte("new holder")}

	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			<-start
			r.oldErr = r.k.writeAndComplete(h, r.first.Token, oldResp, r.oldMark)
		})
		wg.Go(func() {
			<-start
			p := r.k.claimParams(b.at(2 * lease))
			r.takeover, r.claimErr = b.s.RecordClaim(b.ctx, p)
			if r.claimErr == nil && r.takeover.Outcome == idem.ClaimAcquired {
				r.newErr = r.k.writeAndComplete(h, p.Token, newResp, r.newMark)
			} else {
				r.newErr = errNoTakeover
			}
		})
	}
	close(start)
	wg.Wait()

	for i, r := range rs {
		if r.claimErr != nil {
			t.Fatalf("round %d: takeover claim: %v", i, r.claimErr)
		}
		for who, err := range map[string]error{"old holder": r.oldErr, "new holder": r.newErr} {
			if err != nil && !errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, errNoTakeover) {
				t.Fatalf("round %d: %s's WriteAndComplete: %v", i, who, err)
			}
		}
		if (r.oldErr == nil) == (r.newErr == nil) {
			t.Fatalf("round %d: old holder's transaction err %v, new holder's %v: want exactly one committed", i, r.oldErr, r.newErr)
		}
		winner := newResp
		if r.oldErr == nil {
			winner = oldResp
		}
		r.k.wantMarker(h, r.oldMark, r.oldErr == nil)
		r.k.wantMarker(h, r.newMark, r.newErr == nil)
		rec := r.k.mustGet(b.at(2 * lease))
		if rec.State != idem.StateCompleted || !rec.Response.Equal(winner) {
			t.Fatalf("round %d: record %v with response %s, want completed with %s",
				i, rec.State, describeResponse(rec.Response), describeResponse(winner))
		}
	}
}

// errNoTakeover marks a round whose takeover found the record already completed.
var errNoTakeover = errors.New("no takeover: the old holder completed first")
