package storetest

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
)

// The cases of the core API (SPEC §16): idem.Do and idem.DoTx over the store, through
// a Guard whose clock is the case's.

func init() {
	register(
		testCase{"DoRunsOnceAndReplaysTheResult", testDoRunsOnce},
		testCase{"DoDuplicateInFlightIsInProgress", testDoInFlight},
		testCase{"DoOtherInputIsKeyReused", testDoMismatch},
		testCase{"DoTakesOverALapsedLeaseKeepingTheRecordID", testDoTakeover},
		testCase{"DoErrorReleasesTheKey", testDoErrorReleases},
	)
}

// charge is the result of the functions the cases run.
type charge struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// guard returns a Guard over the bundle's store, with the suite's lease and TTL, on a
// clock that starts at t0 and moves when the case says.
func (b *bundle) guard() (*idem.Guard, *testkit.Clock) {
	clock := testkit.NewClock(b.t0)
	return idem.NewGuard(idem.GuardConfig{
		Store: b.s, Lease: lease, TTL: ttl, Clock: clock.Now,
		Logger: slog.New(slog.DiscardHandler),
	}), clock
}

// call is the bundle's key with its fingerprint.
func (b *bundle) call() idem.Call {
	return idem.Call{Scope: b.scope, Key: b.key, Fingerprint: b.fp}
}

// chargeOnce returns a function that counts its runs in n and charges 2000 in a charge
// named for its run.
func chargeOnce(n *atomic.Int64) func(context.Context) (charge, error) {
	return func(ctx context.Context) (charge, error) {
		if idem.FromContext(ctx) == nil {
			return charge{}, errors.New("the function's context carries no idem.Handle")
		}
		return charge{ID: "ch_" + strconv.FormatInt(n.Add(1), 10), Amount: 2000}, nil
	}
}

func testDoRunsOnce(t *testing.T, h Harness) {
	b := setup(t, h)
	g, _ := b.guard()
	var runs atomic.Int64
	first, replayed, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs))
	if err != nil || replayed || first != (charge{ID: "ch_1", Amount: 2000}) {
		t.Fatalf("first Do = %+v, replayed %v, err %v; want ch_1 executed", first, replayed, err)
	}
	again, replayed, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs))
	if err != nil || !replayed || again != first {
		t.Fatalf("repeat Do = %+v, replayed %v, err %v; want %+v replayed", again, replayed, err, first)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the function ran %d times, want once", n)
	}
	if rec := b.mustGet(b.t0); rec.State != idemstore.StateCompleted {
		t.Fatalf("record %v after Do, want completed", rec.State)
	}
}

func testDoInFlight(t *testing.T, h Harness) {
	b := setup(t, h)
	g, _ := b.guard()
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, _, err := idem.Do(b.ctx, g, b.call(), func(context.Context) (charge, error) {
			close(started)
			<-finish
			return charge{ID: "ch_1"}, nil
		})
		done <- err
	}()
	<-started
	var runs atomic.Int64
	_, _, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs))
	var inProgress *idem.InProgressError
	if !errors.Is(err, idem.ErrKeyInProgress) || !errors.As(err, &inProgress) || inProgress.RetryAfter <= 0 {
		t.Fatalf("Do of a key in flight = %v, want an InProgressError with a RetryAfter", err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatalf("first Do: %v", err)
	}
	if runs.Load() != 0 {
		t.Fatal("the duplicate ran its function")
	}
}

func testDoMismatch(t *testing.T, h Harness) {
	b := setup(t, h)
	g, _ := b.guard()
	var runs atomic.Int64
	if _, _, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs)); err != nil {
		t.Fatal(err)
	}
	other := b.call()
	other.Fingerprint = newFingerprint()
	if _, _, err := idem.Do(b.ctx, g, other, chargeOnce(&runs)); !errors.Is(err, idem.ErrKeyReused) {
		t.Fatalf("Do with another input = %v, want ErrKeyReused", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("the function ran %d times, want once", runs.Load())
	}
}

func testDoTakeover(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	dead := b.acquire(b.t0) // a holder that died mid-operation
	clock.Advance(lease + ms(1))
	var runs atomic.Int64
	v, replayed, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs))
	if err != nil || replayed || v.ID != "ch_1" {
		t.Fatalf("Do after the lease lapsed = %+v, replayed %v, err %v; want it executed", v, replayed, err)
	}
	rec := b.mustGet(clock.Now())
	if rec.State != idemstore.StateCompleted || rec.ID != dead.RecordID {
		t.Fatalf("record %v with id %q, want completed keeping the dead holder's id %q", rec.State, rec.ID, dead.RecordID)
	}
}

func testDoErrorReleases(t *testing.T, h Harness) {
	b := setup(t, h)
	g, _ := b.guard()
	declined := errors.New("card declined by the processor's network")
	_, _, err := idem.Do(b.ctx, g, b.call(), func(context.Context) (charge, error) { return charge{}, declined })
	if !errors.Is(err, declined) {
		t.Fatalf("Do = %v, want the function's error", err)
	}
	if _, err := b.get(b.t0); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("record after the function failed: %v, want it released (ErrNotFound)", err)
	}
	var runs atomic.Int64
	if _, replayed, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&runs)); err != nil || replayed || runs.Load() != 1 {
		t.Fatalf("retry after the error: replayed %v, err %v, %d runs; want it executed afresh", replayed, err, runs.Load())
	}
}
