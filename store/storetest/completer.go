package storetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
)

// The cases of the completer (SPEC §13): records whose holder died after a step
// committed are finished in the background, once, through the resume function their
// operation registered.

func init() {
	register(
		testCase{"CompleterFinishesALapsedRecordOnce", testCompleterFinishes},
		testCase{"CompleterLeavesLiveRecordsAlone", testCompleterLeavesLive},
		testCase{"CompletersRacingResumeEachRecordOnce", testCompletersRace},
		testCase{"CompleterRetriesAFailedResumeAfterABackoff", testCompleterBackoff},
		testCase{"CompleterLooksAgainAtRecordsWithoutAResumeFunction", testCompleterNoFunction},
		testCase{"TxCompleterCompletesInTheResumeFunctionsTransaction", testCompleterTx},
	)
}

// chargeOperation is the operation name of the completer cases (stepParams's).
const chargeOperation = "charges.create"

// completerRetryBackoff is the completer's first backoff in the cases.
const completerRetryBackoff = time.Minute

// resumeCharge is the resume function of the charges: it takes the pending charge
// from the first step's saved result (failing if that step would run again), "calls
// the processor" in a second step, and sets the charge as the result. It counts its
// runs in runs.
func resumeCharge(runs *atomic.Int64) idem.ResumeFunc {
	return func(ctx context.Context, h *idem.Handle) error {
		runs.Add(1)
		pending, err := idem.Step(ctx, "charge_pending", func(context.Context) (charge, error) {
			return charge{}, errors.New("the committed step charge_pending ran again")
		})
		if err != nil {
			return err
		}
		pch, err := idem.Step(ctx, "processor", func(ctx context.Context) (string, error) {
			return "pch_" + h.DerivedKey("processor")[:8], nil
		})
		if err != nil {
			return err
		}
		return h.SetResult(charge{ID: pending.ID + "/" + pch, Amount: pending.Amount})
	}
}

// completer returns a guard on the bundle's clock with fn registered for the charges,
// and a completer of it.
func (b *bundle) completer(fn idem.ResumeFunc) (*idem.Guard, *idem.Completer, *testkit.Clock) {
	g, clock := b.guard()
	if fn != nil {
		g.RegisterResume(chargeOperation, fn)
	}
	return g, idem.NewCompleter(g, idem.CompleterConfig{BatchSize: 3, RetryBackoff: completerRetryBackoff,
		Logger: slog.New(slog.DiscardHandler)}), clock
}

// wantPass fails the test unless a pass of c resumed, failed and skipped as many
// records as want says, without an error, and returns the pass.
func (b *bundle) wantPass(c *idem.Completer, want idem.CompleterPass) idem.CompleterPass {
	b.t.Helper()
	got := c.Pass(b.ctx)
	if got.Resumed != want.Resumed || got.Failed != want.Failed || got.Skipped != want.Skipped || got.Err != nil {
		b.t.Fatalf("completer pass = %+v, want %d resumed, %d failed, %d skipped and no error", got, want.Resumed, want.Failed, want.Skipped)
	}
	return got
}

func testCompleterFinishes(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	var runs atomic.Int64
	g, c, clock := b.completer(resumeCharge(&runs))
	dead := b.deadAfterStep()
	clock.Advance(lease + ms(1))
	b.wantPass(c, idem.CompleterPass{Resumed: 1})
	b.wantPass(c, idem.CompleterPass{})
	if runs.Load() != 1 {
		t.Fatalf("the resume function ran %d times, want once", runs.Load())
	}
	want := charge{ID: "ch_1/pch_" + derivedKey(dead, "processor")[:8], Amount: 2000}
	rec := b.mustGet(clock.Now())
	if rec.State != idemstore.StateCompleted || rec.ID != dead.RecordID {
		t.Fatalf("record %v with id %q, want completed, keeping the id %q", rec.State, rec.ID, dead.RecordID)
	}
	// The client's retry finds the finished operation.
	var fnRuns atomic.Int64
	got, replayed, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&fnRuns))
	if err != nil || !replayed || got != want || fnRuns.Load() != 0 {
		t.Fatalf("the client's retry = %+v, replayed %v, err %v; want %+v replayed without running", got, replayed, err, want)
	}
}

func testCompleterLeavesLive(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	var runs atomic.Int64
	_, c, clock := b.completer(resumeCharge(&runs))
	b.deadAfterStep()
	done := *b
	done.key = b.key + "-completed"
	p := done.acquire(b.t0)
	done.step(p.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_2"}))
	done.complete(p.Token, sampleResponse(), b.at(ms(1)))
	notAdvanced := *b
	notAdvanced.key = b.key + "-not-advanced"
	notAdvanced.acquire(b.t0)

	clock.Advance(lease - ms(1)) // the holder may still be working
	b.wantPass(c, idem.CompleterPass{})
	clock.Advance(ms(2)) // the lease lapsed: only the advanced record is resumable
	b.wantPass(c, idem.CompleterPass{Resumed: 1})
	if runs.Load() != 1 {
		t.Fatalf("the resume function ran %d times, want once", runs.Load())
	}
	if rec := notAdvanced.mustGet(clock.Now()); rec.State != idemstore.StateInFlight {
		t.Fatalf("the record without a step: %v, want left in flight for the client's retry", rec.State)
	}
}

func testCompletersRace(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	const records, completers = 10, 4
	keys := make([]*bundle, records)
	for i := range keys {
		k := *b
		k.key = fmt.Sprintf("%s-%d", b.key, i)
		keys[i] = &k
		k.deadAfterStep()
	}
	var runs atomic.Int64
	var (
		mu    sync.Mutex
		byKey = map[string]int{}
	)
	counting := func(ctx context.Context, h *idem.Handle) error {
		mu.Lock()
		byKey[h.Key()]++
		mu.Unlock()
		return resumeCharge(&runs)(ctx, h)
	}
	cs := make([]*idem.Completer, completers)
	passes := make([]idem.CompleterPass, completers)
	for i := range cs {
		_, c, clock := b.completer(counting)
		clock.Advance(lease + ms(1))
		cs[i] = c
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			<-start
			passes[i] = c.Pass(b.ctx)
		})
	}
	close(start)
	wg.Wait()
	resumed := 0
	for i, p := range passes {
		if p.Err != nil || p.Failed != 0 {
			t.Fatalf("completer %d: pass %+v", i, p)
		}
		resumed += p.Resumed
	}
	if resumed != records || len(byKey) != records || runs.Load() != records {
		t.Fatalf("%d completers resumed %d records in all, %d distinct, %d runs; want each of the %d records resumed once: %v",
			completers, resumed, len(byKey), runs.Load(), records, byKey)
	}
	for _, k := range keys {
		if rec := k.mustGet(b.at(2 * lease)); rec.State != idemstore.StateCompleted {
			t.Fatalf("record %s: %v, want completed", k.key, rec.State)
		}
	}
}

func testCompleterBackoff(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	var runs atomic.Int64
	down := errors.New("the processor is down")
	var failing atomic.Bool
	failing.Store(true)
	_, c, clock := b.completer(func(ctx context.Context, h *idem.Handle) error {
		if failing.Load() {
			runs.Add(1)
			return down
		}
		return resumeCharge(&runs)(ctx, h)
	})
	dead := b.deadAfterStep()
	clock.Advance(lease + ms(1))
	b.wantPass(c, idem.CompleterPass{Failed: 1})
	rec := b.mustGet(clock.Now())
	if rec.State != idemstore.StateInFlight || rec.RecoveryPoint != "charge_pending" || rec.ID != dead.RecordID || rec.Token != "" {
		t.Fatalf("record after a failed resume: %v at %q, id %q, token %q; want kept in flight with no holder, at charge_pending",
			rec.State, rec.RecoveryPoint, rec.ID, rec.Token)
	}
	// The record is resumable at once (its lease ended), but waits for its backoff.
	b.wantPass(c, idem.CompleterPass{Skipped: 1})
	clock.Advance(completerRetryBackoff / 2)
	b.wantPass(c, idem.CompleterPass{Skipped: 1})
	// Twice as long after the second failure.
	clock.Advance(completerRetryBackoff)
	b.wantPass(c, idem.CompleterPass{Failed: 1})
	clock.Advance(completerRetryBackoff + completerRetryBackoff/2)
	b.wantPass(c, idem.CompleterPass{Skipped: 1})
	failing.Store(false)
	clock.Advance(completerRetryBackoff)
	b.wantPass(c, idem.CompleterPass{Resumed: 1})
	if runs.Load() != 3 {
		t.Fatalf("the resume function ran %d times, want 3 (two failures, then success)", runs.Load())
	}
	if rec := b.mustGet(clock.Now()); rec.State != idemstore.StateCompleted {
		t.Fatalf("record %v after the successful resume, want completed", rec.State)
	}
}

func testCompleterNoFunction(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	g, c, clock := b.completer(nil)
	b.deadAfterStep()
	clock.Advance(lease + ms(1))
	before := b.mustGet(clock.Now())
	b.wantPass(c, idem.CompleterPass{Skipped: 1})
	b.wantPass(c, idem.CompleterPass{Skipped: 1})
	b.wantRecord("record without a resume function", b.mustGet(clock.Now()), before)

	// It is looked at again after a backoff, not left for good: once a resume
	// function is there (registered late here, or in another process), it is resumed.
	var runs atomic.Int64
	g.RegisterResume(chargeOperation, resumeCharge(&runs))
	b.wantPass(c, idem.CompleterPass{Skipped: 1}) // still waiting for its backoff
	clock.Advance(completerRetryBackoff + completerRetryBackoff/5)
	b.wantPass(c, idem.CompleterPass{Resumed: 1})
	if rec := b.mustGet(clock.Now()); rec.State != idemstore.StateCompleted || runs.Load() != 1 {
		t.Fatalf("record %v after %d runs, want completed by one run of the function registered late", rec.State, runs.Load())
	}
}

func testCompleterTx(t *testing.T, h Harness) {
	b := setupTxSteps(t, h)
	marker := newMarker()
	var runs atomic.Int64
	_, c, clock := b.completer(func(ctx context.Context, hd *idem.Handle) error {
		runs.Add(1)
		return h.Tx.InTx(ctx, b.s, func(ctx context.Context, write func(string) error) error {
			hd.SetResponse(sampleResponse()) // before the helper prepares the completion
			return write(marker)
		})
	})
	b.deadAfterStep()
	clock.Advance(lease + ms(1))
	b.wantPass(c, idem.CompleterPass{Resumed: 1})
	b.wantMarker(h, marker, true)
	rec := b.mustGet(clock.Now())
	if rec.State != idemstore.StateCompleted || !rec.Response.Equal(sampleResponse()) {
		t.Fatalf("record %v with %s, want completed in the resume function's transaction", rec.State, describeResponse(rec.Response))
	}
}
