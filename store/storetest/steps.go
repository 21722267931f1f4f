package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// The cases of recovery points (SPEC §13): steps that commit with the record's
// recovery point, takeovers that resume after the last committed step, releases that
// keep an advanced record, the query for resumable records, and derived foreign keys.

func init() {
	register(
		testCase{"StoresWithoutRecoveryPointsRefuseSteps", testNoRecoveryPoints},
		testCase{"StepSavesTheRecoveryPointAndResults", testStepSaves},
		testCase{"StepIsFencedByTokenAndState", testStepFenced},
		testCase{"TakeoverKeepsTheStepsAndANewClaimAfterExpiryDropsThem", testTakeoverKeepsSteps},
		testCase{"ReleaseAfterAStepKeepsTheRecordWithItsLeaseEnded", testReleaseKeepsAdvanced},
		testCase{"ListResumableFindsLapsedRecordsWhoseRecoveryPointAdvanced", testListResumable},
		testCase{"ListResumablePagesWithACursor", testListResumablePages},
		testCase{"TakeoverResumesAfterTheLastCommittedStepWithItsResult", testTakeoverResumes},
		testCase{"ReleasedOperationResumesWithoutRedoingItsSteps", testReleasedResumes},
		testCase{"StepOfAHolderThatLostItsLeaseSavesNothing", testStepAfterLeaseLost},
		testCase{"TxStepCommitsItsWritesWithTheRecoveryPoint", testTxStepCommits},
		testCase{"TxStepAfterATakeoverCommitsNothing", testTxStepAfterTakeover},
		testCase{"TxStepErrorRollsBackItsWrites", testTxStepError},
	)
}

// setupSteps is setup for the cases that need Capabilities.RecoveryPoints.
func setupSteps(t *testing.T, h Harness) *bundle {
	t.Helper()
	b := setup(t, h)
	if !b.s.Capabilities().RecoveryPoints {
		t.Skip("store lacks Capabilities.RecoveryPoints (SPEC §13): skipping recovery-point case")
	}
	return b
}

// setupTxSteps is setupSteps for the cases whose steps write in the store's own
// transaction (Capabilities.Transactions too).
func setupTxSteps(t *testing.T, h Harness) *bundle {
	t.Helper()
	b := setupSteps(t, h)
	if !b.s.Capabilities().Transactions {
		t.Skip("store lacks Capabilities.Transactions (no step helper): skipping transactional step case")
	}
	if h.Tx == nil {
		t.Fatal("store declares Capabilities.Transactions but Harness.Tx is nil: its steps would go untested")
	}
	return b
}

// stepsOf encodes step results in the documented form of idem.Record.Steps: a JSON
// array of {"step", "result"} objects in commit order. pairs alternate a step's name
// and its result.
func stepsOf(pairs ...any) []byte {
	type saved struct {
		Step   string `json:"step"`
		Result any    `json:"result"`
	}
	var out []saved
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, saved{Step: pairs[i].(string), Result: pairs[i+1]})
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	return b
}

// stepParams returns the params of a step of the holder of token.
func (b *bundle) stepParams(token, point string, steps []byte) *idemstore.StepParams {
	return &idemstore.StepParams{Scope: b.scope, Key: b.key, Token: token, RecoveryPoint: point, Steps: steps, Operation: "charges.create"}
}

// step commits a step of the holder of token, failing the test on an error.
func (b *bundle) step(token, point string, steps []byte) {
	b.t.Helper()
	if err := b.s.RecordStep(b.ctx, b.stepParams(token, point, steps)); err != nil {
		b.t.Fatalf("RecordStep(%q): %v", point, err)
	}
}

// advanced is rec with the step p committed.
func advanced(rec *idemstore.Record, p *idemstore.StepParams) *idemstore.Record {
	c := *rec
	c.RecoveryPoint, c.Steps, c.Operation = p.RecoveryPoint, p.Steps, p.Operation
	return &c
}

// deadAfterStep is a holder that claimed the key at t0, committed the step
// "charge_pending" (a pending charge ch_1) and died: its lease lapses at t0 + lease.
func (b *bundle) deadAfterStep() *idemstore.ClaimParams {
	b.t.Helper()
	dead := b.acquire(b.t0)
	b.step(dead.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_1", Amount: 2000}))
	return dead
}

func testNoRecoveryPoints(t *testing.T, h Harness) {
	b := setup(t, h)
	if b.s.Capabilities().RecoveryPoints {
		t.Skip("store declares Capabilities.RecoveryPoints: the other cases check them")
	}
	p := b.acquire(b.t0)
	if err := b.s.RecordStep(b.ctx, b.stepParams(p.Token, "a", stepsOf("a", 1))); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("RecordStep on a store without recovery points = %v, want errors.ErrUnsupported", err)
	}
	if _, err := b.s.RecordListResumable(b.ctx, &idemstore.ListResumableParams{Limit: 10, Now: b.t0}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("RecordListResumable on a store without recovery points = %v, want errors.ErrUnsupported", err)
	}
	if _, err := b.s.RecordCountUnfinished(b.ctx, &idemstore.CountUnfinishedParams{Now: b.t0}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("RecordCountUnfinished on a store without recovery points = %v, want errors.ErrUnsupported", err)
	}
	g, _ := b.guard()
	var runs atomic.Int64
	_, _, err := idem.Do(b.ctx, g, idem.Call{Scope: b.scope, Key: b.key + "-do", Fingerprint: b.fp}, func(ctx context.Context) (int, error) {
		return idem.Step(ctx, "a", func(context.Context) (int, error) { runs.Add(1); return 1, nil })
	})
	if !errors.Is(err, errors.ErrUnsupported) || runs.Load() != 0 {
		t.Errorf("idem.Step on a store without recovery points = %v after %d runs, want errors.ErrUnsupported before running", err, runs.Load())
	}
}

func testStepSaves(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	p := b.acquire(b.t0)
	first := b.stepParams(p.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_1"}))
	b.step(first.Token, first.RecoveryPoint, first.Steps)
	b.wantRecord("record after the first step", b.mustGet(b.at(ms(1))), advanced(inFlightRecord(p), first))

	second := b.stepParams(p.Token, "processor_charged", stepsOf("charge_pending", charge{ID: "ch_1"}, "processor_charged", "pch_1"))
	b.step(second.Token, second.RecoveryPoint, second.Steps)
	b.wantRecord("record after the second step", b.mustGet(b.at(ms(2))), advanced(inFlightRecord(p), second))

	// The holder still holds it, and completes it: its TTL counts from the completion,
	// and it keeps its steps' results but no recovery point, which says where an
	// unfinished operation stands.
	b.complete(p.Token, sampleResponse(), b.at(ms(3)))
	b.wantRecord("record completed after its steps", b.mustGet(b.at(ms(3))),
		completedRecordAt(advanced(inFlightRecord(p), second), sampleResponse(), ttl, b.at(ms(3))))
}

func testStepFenced(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	steps := stepsOf("a", 1)
	if err := b.s.RecordStep(b.ctx, b.stepParams(newToken(), "a", steps)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("RecordStep of an absent key = %v, want ErrLeaseLost", err)
	}
	p := b.acquire(b.t0)
	for _, token := range []string{newToken(), "", p.Token + "x"} {
		b.wantUnchanged("step with a wrong token", b.at(ms(1)), func() {
			if err := b.s.RecordStep(b.ctx, b.stepParams(token, "a", steps)); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("RecordStep with token %q = %v, want ErrLeaseLost", token, err)
			}
		})
	}
	b.complete(p.Token, sampleResponse(), b.at(ms(2)))
	b.wantUnchanged("step of a completed record", b.at(ms(3)), func() {
		if err := b.s.RecordStep(b.ctx, b.stepParams(p.Token, "a", steps)); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("RecordStep of a completed record = %v, want ErrLeaseLost", err)
		}
	})
}

func testTakeoverKeepsSteps(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	dead := b.deadAfterStep()
	want := advanced(inFlightRecord(dead), b.stepParams(dead.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_1", Amount: 2000})))

	taker := b.claimParams(b.at(lease + ms(1)))
	res := b.claimWant(taker, idemstore.ClaimAcquired)
	want.Token, want.LeaseEnd = taker.Token, taker.Now.Add(lease)
	if !res.TookOver {
		t.Fatal("claim after the lease lapsed: TookOver = false")
	}
	b.wantRecord("taken-over record", res.Record, want)
	completed := b.at(lease + ms(2))
	b.complete(taker.Token, sampleResponse(), completed)

	// After expiry (a TTL after the completion: its recovery point advanced) the key
	// starts a new operation: new id, no steps.
	b.claimWant(b.claimParams(completed.Add(ttl-ms(1))), idemstore.ClaimCompleted)
	fresh := b.claimParams(completed.Add(ttl))
	res = b.claimWant(fresh, idemstore.ClaimAcquired)
	b.wantRecord("record claimed after expiry", res.Record, inFlightRecord(fresh))
	b.wantRecord("record claimed after expiry, read back", b.mustGet(completed.Add(ttl+ms(1))), inFlightRecord(fresh))
}

func testReleaseKeepsAdvanced(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	p := b.acquire(b.t0)
	sp := b.stepParams(p.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_1"}))
	b.step(p.Token, sp.RecoveryPoint, sp.Steps)
	releasedAt := b.at(time.Second)
	rel := b.releaseParams(p.Token)
	rel.Now = releasedAt
	if err := b.s.RecordRelease(b.ctx, rel); err != nil {
		t.Fatalf("RecordRelease after a step: %v", err)
	}
	want := advanced(inFlightRecord(p), sp)
	want.Token, want.LeaseEnd = "", releasedAt
	b.wantRecord("record released after a step", b.mustGet(releasedAt), want)
	b.wantLeaseLost("the releasing holder", b.fencedOps(p.Token, releasedAt))

	// A retry takes it over at once, with its steps, long before the lease would have
	// lapsed.
	retry := b.claimParams(releasedAt)
	res := b.claimWant(retry, idemstore.ClaimAcquired)
	if !res.TookOver || !res.Released || res.Record.RecoveryPoint != "charge_pending" || res.Record.ID != p.RecordID {
		t.Fatalf("claim after the release: TookOver %v, Released %v, recovery point %q, id %q; want a takeover of the released record at charge_pending of record %q",
			res.TookOver, res.Released, res.Record.RecoveryPoint, res.Record.ID, p.RecordID)
	}
	b.complete(retry.Token, sampleResponse(), b.at(2*time.Second))
}

// resumable lists every resumable record of the bundle's store at now, failing the
// test on an error.
func (b *bundle) resumable(now time.Time, limit int, afterScope, afterKey string) []*idemstore.Record {
	b.t.Helper()
	recs, err := b.s.RecordListResumable(b.ctx, &idemstore.ListResumableParams{
		AfterScope: afterScope, AfterKey: afterKey, Limit: limit, Now: now,
	})
	if err != nil {
		b.t.Fatalf("RecordListResumable: %v", err)
	}
	return recs
}

// keysOf returns the keys of recs, in order.
func keysOf(recs []*idemstore.Record) []string {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return keys
}

func testListResumable(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	steps := stepsOf("a", 1)
	at := func(key string) *bundle { k := *b; k.key = b.key + "-" + key; return &k }
	advance := func(k *bundle, now time.Time) *idemstore.ClaimParams {
		p := k.acquire(now)
		k.step(p.Token, "a", steps)
		return p
	}
	now := b.at(lease + time.Second)

	lapsed := at("1-lapsed")
	lp := advance(lapsed, b.t0)
	advance(at("2-live"), b.at(2*time.Second)) // lease until t0+12s: live at now
	at("3-not-advanced").acquire(b.t0)
	done := at("4-completed")
	done.complete(advance(done, b.t0).Token, sampleResponse(), b.at(ms(1)))
	released := at("5-released")
	rp := advance(released, b.at(5*time.Second))
	rel := released.releaseParams(rp.Token)
	rel.Now = b.at(6 * time.Second)
	if err := b.s.RecordRelease(b.ctx, rel); err != nil {
		t.Fatal(err)
	}
	pastTTL := at("6-past-ttl")
	ep := pastTTL.claimParams(b.t0)
	ep.TTL = lease + ms(500) // its TTL ran out before now: an unfinished operation never expires
	pastTTL.claimWant(ep, idemstore.ClaimAcquired)
	pastTTL.step(ep.Token, "a", steps)
	expired := at("7-expired")
	xp := expired.claimParams(b.t0)
	xp.TTL = lease + ms(500)
	expired.claimWant(xp, idemstore.ClaimAcquired) // no step: it expires

	recs := b.resumable(now, 100, "", "")
	if got, want := fmt.Sprint(keysOf(recs)), fmt.Sprint([]string{lapsed.key, released.key, pastTTL.key}); got != want {
		t.Fatalf("resumable records = %s, want %s (lapsed and released, advanced, past their TTL or not)", got, want)
	}
	r := recs[0]
	if r.Scope != b.scope || r.ID != lp.RecordID || r.Fingerprint != b.fp || r.RecoveryPoint != "a" ||
		r.Operation != "charges.create" || !r.CreatedAt.Equal(b.t0) || !r.ExpiresAt.Equal(b.at(ttl)) || r.Response != nil {
		t.Errorf("listed record %+v: want scope, id, fingerprint, recovery point, operation and times, no response", r)
	}
}

func testListResumablePages(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	var want []string
	for i := range 5 {
		k := *b
		k.key = fmt.Sprintf("%s-%d", b.key, i)
		p := k.acquire(b.t0)
		k.step(p.Token, "a", stepsOf("a", i))
		want = append(want, k.key)
	}
	now := b.at(2 * lease)
	var got []string
	afterScope, afterKey := "", ""
	for range 10 {
		page := b.resumable(now, 2, afterScope, afterKey)
		got = append(got, keysOf(page)...)
		if len(page) < 2 {
			break
		}
		afterScope, afterKey = page[len(page)-1].Scope, page[len(page)-1].Key
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages of 2 = %v, want %v in (scope, key) order", got, want)
	}
}

// steps is what an operation's steps saw: how often each function ran.
type stepRuns struct{ pending, processor atomic.Int64 }

// chargeSteps is an operation in Brandur Leach's order, on idem.Step: a pending charge,
// then the processor's charge (keyed by the record), then the result.
func chargeSteps(runs *stepRuns, seenPoint *string) func(ctx context.Context) (charge, error) {
	return func(ctx context.Context) (charge, error) {
		*seenPoint = idem.FromContext(ctx).RecoveryPoint()
		pending, err := idem.Step(ctx, "charge_pending", func(context.Context) (charge, error) {
			return charge{ID: fmt.Sprintf("ch_%d", runs.pending.Add(1)), Amount: 2000}, nil
		})
		if err != nil {
			return charge{}, err
		}
		pch, err := idem.Step(ctx, "processor", func(ctx context.Context) (string, error) {
			runs.processor.Add(1)
			return "pch_" + idem.FromContext(ctx).DerivedKey("processor")[:8], nil
		})
		if err != nil {
			return charge{}, err
		}
		return charge{ID: pending.ID + "/" + pch, Amount: pending.Amount}, nil
	}
}

func testTakeoverResumes(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	g, clock := b.guard()
	dead := b.deadAfterStep()
	clock.Advance(lease + ms(1))
	var runs stepRuns
	var point string
	v, replayed, err := idem.Do(b.ctx, g, b.call(), chargeSteps(&runs, &point))
	if err != nil || replayed {
		t.Fatalf("Do after the holder died = %+v, replayed %v, err %v; want it resumed", v, replayed, err)
	}
	wantID := "ch_1/pch_" + derivedKey(dead, "processor")[:8]
	if point != "charge_pending" || runs.pending.Load() != 0 || runs.processor.Load() != 1 || v.ID != wantID {
		t.Fatalf("resumed at %q: pending step ran %d times, processor %d, result %q; want resumed after charge_pending "+
			"with its saved charge (0 runs), the processor called once, %q",
			point, runs.pending.Load(), runs.processor.Load(), v.ID, wantID)
	}
	// Completed, a record keeps its steps' results and no recovery point: that says
	// where an unfinished operation stands (and keeps it in the unfinished ones' index).
	rec := b.mustGet(clock.Now())
	if rec.State != idemstore.StateCompleted || rec.ID != dead.RecordID || rec.RecoveryPoint != "" || len(rec.Steps) == 0 {
		t.Fatalf("record %v, id %q, recovery point %q, %d bytes of step results; want completed, the dead holder's id, "+
			"no recovery point, the steps' results", rec.State, rec.ID, rec.RecoveryPoint, len(rec.Steps))
	}
}

func testReleasedResumes(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	g, _ := b.guard()
	declined := errors.New("the processor is down")
	var pendingRuns atomic.Int64
	pending := func(ctx context.Context) (charge, error) {
		return idem.Step(ctx, "charge_pending", func(context.Context) (charge, error) {
			return charge{ID: fmt.Sprintf("ch_%d", pendingRuns.Add(1)), Amount: 2000}, nil
		})
	}
	_, _, err := idem.Do(b.ctx, g, b.call(), func(ctx context.Context) (charge, error) {
		if _, err := pending(ctx); err != nil {
			return charge{}, err
		}
		return charge{}, declined
	})
	if !errors.Is(err, declined) {
		t.Fatalf("first Do = %v, want the function's error", err)
	}
	rec := b.mustGet(b.t0)
	if rec.State != idemstore.StateInFlight || rec.Token != "" || rec.RecoveryPoint != "charge_pending" {
		t.Fatalf("record after the error: %v, token %q, recovery point %q; want kept in flight, no holder, at charge_pending",
			rec.State, rec.Token, rec.RecoveryPoint)
	}
	// The retry comes at once: the release ended the lease.
	var point string
	v, _, err := idem.Do(b.ctx, g, b.call(), func(ctx context.Context) (charge, error) {
		point = idem.FromContext(ctx).RecoveryPoint()
		return pending(ctx)
	})
	if err != nil || v.ID != "ch_1" || pendingRuns.Load() != 1 || point != "charge_pending" {
		t.Fatalf("retry = %+v, err %v; recovery point %q, pending step ran %d times; want ch_1 from the saved step, run once",
			v, err, point, pendingRuns.Load())
	}
}

// beginThenLoseTheKey begins the bundle's call through a guard, then lets the lease
// lapse and another caller (taker) take the key over at now; the handle is released
// at the end of the test.
func (b *bundle) beginThenLoseTheKey() (hd *idem.Handle, taker *idemstore.ClaimParams, now time.Time) {
	b.t.Helper()
	g, clock := b.guard()
	hd, _, err := g.Begin(b.ctx, b.call())
	if err != nil || hd == nil {
		b.t.Fatalf("Begin = %v, %v", hd, err)
	}
	b.t.Cleanup(func() { _ = hd.Release() })
	clock.Advance(lease + ms(1))
	taker = b.claimParams(clock.Now())
	b.claimWant(taker, idemstore.ClaimAcquired)
	return hd, taker, clock.Now()
}

func testStepAfterLeaseLost(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	hd, taker, now := b.beginThenLoseTheKey()
	var runs atomic.Int64
	_, err := idem.Step(hd.Context(), "charge_pending", func(context.Context) (charge, error) {
		runs.Add(1)
		return charge{ID: "ch_1"}, nil
	})
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Step of a holder whose key was taken over = %v, want ErrLeaseLost", err)
	}
	if cause := context.Cause(hd.Context()); !errors.Is(cause, idemstore.ErrLeaseLost) {
		t.Errorf("the operation's context after the fenced step failed: cause %v, want ErrLeaseLost", cause)
	}
	rec := b.mustGet(now)
	if rec.RecoveryPoint != "" || len(rec.Steps) != 0 || !rec.HeldBy(taker.Token) {
		t.Fatalf("record after the fenced step: recovery point %q, steps %s; want none, still held by the taker", rec.RecoveryPoint, rec.Steps)
	}
	if hd.RecoveryPoint() != "" {
		t.Errorf("the losing handle's recovery point = %q, want none", hd.RecoveryPoint())
	}
}

// txStep runs the harness's step helper for step, writing marker and counting runs.
func (b *bundle) txStep(h Harness, ctx context.Context, step, marker string, runs *atomic.Int64, fail error) (string, error) {
	return h.Tx.Step(ctx, b.s, step, func(ctx context.Context, write func(string) error) (string, error) {
		runs.Add(1)
		if err := write(marker); err != nil {
			return "", err
		}
		return "saved-" + marker, fail
	})
}

func testTxStepCommits(t *testing.T, h Harness) {
	b := setupTxSteps(t, h)
	g, _ := b.guard()
	hd, _, err := g.Begin(b.ctx, b.call())
	if err != nil || hd == nil {
		t.Fatalf("Begin = %v, %v", hd, err)
	}
	first, second := newMarker(), newMarker()
	var runs atomic.Int64
	got, err := b.txStep(h, hd.Context(), "charge_pending", first, &runs, nil)
	if err != nil || got != "saved-"+first {
		t.Fatalf("step = %q, %v", got, err)
	}
	b.wantMarker(h, first, true)
	if rec := b.mustGet(b.t0); rec.RecoveryPoint != "charge_pending" || hd.RecoveryPoint() != "charge_pending" {
		t.Fatalf("recovery point after the step: record %q, handle %q; want charge_pending", rec.RecoveryPoint, hd.RecoveryPoint())
	}
	if err := hd.Release(); err != nil { // the processor failed, say: the client retries
		t.Fatal(err)
	}

	retry, _, err := g.Begin(b.ctx, b.call())
	if err != nil || retry == nil {
		t.Fatalf("Begin of the retry = %v, %v", retry, err)
	}
	got, err = b.txStep(h, retry.Context(), "charge_pending", second, &runs, nil)
	if err != nil || got != "saved-"+first || runs.Load() != 1 {
		t.Fatalf("step of the retry = %q, %v after %d runs; want the first run's saved result without running again", got, err, runs.Load())
	}
	b.wantMarker(h, second, false)
	final := newMarker()
	err = h.Tx.InTx(retry.Context(), b.s, func(ctx context.Context, write func(string) error) error {
		retry.SetResponse(sampleResponse())
		return write(final)
	})
	if err != nil {
		t.Fatalf("final transaction: %v", err)
	}
	if err := retry.Complete(); err != nil {
		t.Fatal(err)
	}
	b.wantMarker(h, final, true)
	if rec := b.mustGet(b.t0); rec.State != idemstore.StateCompleted || !rec.Response.Equal(sampleResponse()) {
		t.Fatalf("record %v, want completed in the final transaction", rec.State)
	}
}

func testTxStepAfterTakeover(t *testing.T, h Harness) {
	b := setupTxSteps(t, h)
	hd, taker, now := b.beginThenLoseTheKey()
	marker := newMarker()
	var runs atomic.Int64
	if _, err := b.txStep(h, hd.Context(), "charge_pending", marker, &runs, nil); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("step of a holder whose key was taken over = %v, want ErrLeaseLost", err)
	}
	b.wantMarker(h, marker, false)
	if rec := b.mustGet(now); rec.RecoveryPoint != "" || !rec.HeldBy(taker.Token) {
		t.Fatalf("record after the fenced step: recovery point %q; want none, held by the taker", rec.RecoveryPoint)
	}
}

func testTxStepError(t *testing.T, h Harness) {
	b := setupTxSteps(t, h)
	g, _ := b.guard()
	hd, _, err := g.Begin(b.ctx, b.call())
	if err != nil || hd == nil {
		t.Fatalf("Begin = %v, %v", hd, err)
	}
	refused := errors.New("customer over their limit")
	marker := newMarker()
	var runs atomic.Int64
	if _, err := b.txStep(h, hd.Context(), "charge_pending", marker, &runs, refused); !errors.Is(err, refused) {
		t.Fatalf("step whose function failed = %v, want its error", err)
	}
	b.wantMarker(h, marker, false)
	if rec := b.mustGet(b.t0); rec.RecoveryPoint != "" {
		t.Fatalf("recovery point after a failed step = %q, want none", rec.RecoveryPoint)
	}
	// Nothing advanced: the release deletes the record.
	if err := hd.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.get(b.t0); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("record after the release = %v, want deleted", err)
	}
}
