package storetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

func init() {
	register(
		testCase{"TxCompletionCommitsWithApplicationWrites", testTxCompletionCommits},
		testCase{"TxCompletionAfterTakeoverCommitsNothing", testTxCompletionAfterTakeover},
		testCase{"TxCompletionByNewHolderCommits", testTxCompletionByNewHolder},
		testCase{"TxCompletionRaceWithTakeoverCommitsExactlyOne", testTxCompletionRace},
		testCase{"DoTxCommitsTheWritesWithTheResult", testDoTxCommits},
		testCase{"DoTxErrorRollsBackTheWritesAndReleases", testDoTxError},
		testCase{"DoTxAfterATakeoverCommitsNothing", testDoTxAfterTakeover},
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
func (b *bundle) writeAndComplete(h Harness, token string, resp *idemstore.Response, marker string) error {
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
		if err := b.writeAndComplete(h, first.Token, sampleResponse(), marker); !errors.Is(err, idemstore.ErrLeaseLost) {
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
	if err := b.writeAndComplete(h, first.Token, sampleResponse(), oldMarker); !errors.Is(err, idemstore.ErrLeaseLost) {
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
		first            *idemstore.ClaimParams
		oldMark, newMark string
		oldErr, newErr   error
		takeover         *idemstore.ClaimResult
		claimErr         error
	}
	rs := make([]*round, rounds)
	for i := range rs {
		k := *b
		k.key = fmt.Sprintf("%s-%d", b.key, i)
		rs[i] = &round{k: &k, first: k.acquire(b.t0), oldMark: newMarker(), newMark: newMarker()}
	}
	oldResp := &idemstore.Response{Status: 201, Body: []byte("old holder")}
	newResp := &idemstore.Response{Status: 201, Body: []byte("new holder")}

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
			if r.claimErr == nil && r.takeover.Outcome == idemstore.ClaimAcquired {
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
			if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) && !errors.Is(err, errNoTakeover) {
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
		if rec.State != idemstore.StateCompleted || !rec.Response.Equal(winner) {
			t.Fatalf("round %d: record %v with response %s, want completed with %s",
				i, rec.State, describeResponse(rec.Response), describeResponse(winner))
		}
	}
}

// errNoTakeover marks a round whose takeover found the record already completed.
var errNoTakeover = errors.New("no takeover: the old holder completed first")

// writer is the transaction of the DoTx cases: it writes an application row.
type writer = func(marker string) error

// inTx is h.Tx.InTx over the bundle's store, as DoTx takes it.
func (b *bundle) inTx(h Harness) func(context.Context, func(context.Context, writer) error) error {
	return func(ctx context.Context, fn func(context.Context, writer) error) error {
		return h.Tx.InTx(ctx, b.s, fn)
	}
}

// writeCharge returns a DoTx function that writes marker and returns a charge,
// counting its runs in n.
func writeCharge(marker string, n *atomic.Int64) func(context.Context, writer) (charge, error) {
	return func(ctx context.Context, write writer) (charge, error) {
		n.Add(1)
		if err := write(marker); err != nil {
			return charge{}, err
		}
		return charge{ID: "ch_" + marker, Amount: 2000}, nil
	}
}

func testDoTxCommits(t *testing.T, h Harness) {
	b := setupTx(t, h)
	g, _ := b.guard()
	marker := newMarker()
	var runs atomic.Int64
	v, replayed, err := idem.DoTx(b.ctx, g, b.call(), b.inTx(h), writeCharge(marker, &runs))
	if err != nil || replayed || v.ID != "ch_"+marker {
		t.Fatalf("DoTx = %+v, replayed %v, err %v; want the charge executed", v, replayed, err)
	}
	b.wantMarker(h, marker, true)
	if rec := b.mustGet(b.t0); rec.State != idemstore.StateCompleted {
		t.Fatalf("record %v, want completed in the transaction", rec.State)
	}
	again, replayed, err := idem.DoTx(b.ctx, g, b.call(), b.inTx(h), writeCharge(newMarker(), &runs))
	if err != nil || !replayed || again != v || runs.Load() != 1 {
		t.Fatalf("repeat DoTx = %+v, replayed %v, err %v, %d runs; want %+v replayed", again, replayed, err, runs.Load(), v)
	}
}

func testDoTxError(t *testing.T, h Harness) {
	b := setupTx(t, h)
	g, _ := b.guard()
	marker := newMarker()
	refused := errors.New("amount over the customer's limit")
	_, _, err := idem.DoTx(b.ctx, g, b.call(), b.inTx(h), func(ctx context.Context, write writer) (charge, error) {
		if err := write(marker); err != nil {
			return charge{}, err
		}
		return charge{}, refused
	})
	if !errors.Is(err, refused) {
		t.Fatalf("DoTx = %v, want the function's error", err)
	}
	b.wantMarker(h, marker, false)
	if _, err := b.get(b.t0); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("record after the function failed: %v, want it released (ErrNotFound)", err)
	}
}

// testDoTxAfterTakeover lets another caller take the key over after DoTx claimed it
// and before its transaction begins: the fenced completion fails, the function's write
// rolls back with it, and the new holder still holds the key.
func testDoTxAfterTakeover(t *testing.T, h Harness) {
	b := setupTx(t, h)
	g, clock := b.guard()
	var taker *idemstore.ClaimParams
	takeOverFirst := func(ctx context.Context, fn func(context.Context, writer) error) error {
		clock.Advance(lease + ms(1))
		taker = b.claimParams(clock.Now())
		if res := b.claimWant(taker, idemstore.ClaimAcquired); !res.TookOver {
			t.Fatal("the claim after the lease lapsed did not take the key over")
		}
		return h.Tx.InTx(ctx, b.s, fn)
	}
	marker := newMarker()
	var runs atomic.Int64
	_, _, err := idem.DoTx(b.ctx, g, b.call(), takeOverFirst, writeCharge(marker, &runs))
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("DoTx whose key was taken over = %v, want ErrLeaseLost", err)
	}
	b.wantMarker(h, marker, false)
	rec := b.mustGet(clock.Now())
	if rec.State != idemstore.StateInFlight || !rec.HeldBy(taker.Token) {
		t.Fatalf("record %v, want still in flight under the new holder", rec.State)
	}
}
