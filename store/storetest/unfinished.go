package storetest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
)

// The cases of unfinished operations (SPEC §13): a record in flight whose recovery
// point advanced never expires and is never cleaned up until it is completed (its TTL
// then counts from the completion) or an operator settles it; a retry after its TTL
// resumes it with the same record id and the same derived keys; the completer
// finishes it however old it is, never gives up on it, and says when it grows old.

func init() {
	register(
		testCase{"UnfinishedOperationNeverExpiresAndItsTTLCountsFromTheCompletion", testUnfinishedNeverExpires},
		testCase{"RetryAfterTheTTLResumesTheUnfinishedOperationWithItsDerivedKeys", testRetryAfterTTLResumes},
		testCase{"CleanupNeverDeletesAnUnfinishedOperation", testCleanupKeepsUnfinished},
		testCase{"CountUnfinishedCountsEveryUnfinishedOperationAndTheOldest", testCountUnfinished},
		testCase{"UnknownPolicyPastTheTTLKeepsTheMarkedRecordATTL", testUnknownPastTTL},
		testCase{"CompleterFinishesAnOperationLongPastItsTTL", testCompleterPastTTL},
		testCase{"CompleterNeverGivesUpOnAnUnfinishedOperation", testCompleterNeverGivesUp},
		testCase{"CompleterLogsAnOldUnfinishedOperationOnce", testCompleterWarnsOnce},
	)
}

// wantUnfinished fails the test unless rec is the unfinished record of the holder dead
// (deadAfterStep): in flight at charge_pending, with its record id and creation.
func (b *bundle) wantUnfinished(what string, rec *idemstore.Record, dead *idemstore.ClaimParams) {
	b.t.Helper()
	if !rec.Unfinished() || rec.RecoveryPoint != "charge_pending" || rec.ID != dead.RecordID || !rec.CreatedAt.Equal(dead.Now) {
		b.t.Fatalf("%s: %v at %q, id %q, created %v; want the unfinished record %q of t0, at charge_pending",
			what, rec.State, rec.RecoveryPoint, rec.ID, rec.CreatedAt, dead.RecordID)
	}
}

func testUnfinishedNeverExpires(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	dead := b.deadAfterStep()
	late := b.at(2 * ttl) // long past created_at + TTL and the lease
	b.wantUnfinished("the record past its TTL", b.mustGet(late), dead)

	// The next claim takes it over, keeping its id and steps: not a fresh claim.
	taker := b.claimParams(late)
	res := b.claimWant(taker, idemstore.ClaimAcquired)
	if !res.TookOver || res.Released || res.Record.ID != dead.RecordID || res.Record.RecoveryPoint != "charge_pending" ||
		string(res.Record.Steps) != string(stepsOf("charge_pending", charge{ID: "ch_1", Amount: 2000})) {
		t.Fatalf("claim past the TTL: took over %v, id %q, at %q, steps %s; want the unfinished record taken over with its steps",
			res.TookOver, res.Record.ID, res.Record.RecoveryPoint, res.Record.Steps)
	}

	// Completed, it lives a TTL from the completion.
	done := late.Add(time.Second)
	b.complete(taker.Token, sampleResponse(), done)
	rec := b.mustGet(done)
	if !rec.ExpiresAt.Equal(done.Add(ttl)) {
		t.Fatalf("ExpiresAt of the completed record = %v, want the completion + TTL = %v", rec.ExpiresAt, done.Add(ttl))
	}
	b.claimWant(b.claimParams(done.Add(ttl-ms(1))), idemstore.ClaimCompleted)
	b.wantAbsent("the completed record a TTL after its completion", done.Add(ttl))
	fresh := b.wantFreshClaim("claim a TTL after the completion", done.Add(ttl))
	if fresh.RecordID == dead.RecordID {
		t.Fatal("test bug: the fresh claim reused the record id")
	}
}

func testRetryAfterTTLResumes(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	g, clock := b.guard()
	dead := b.deadAfterStep()
	clock.Advance(2 * ttl)
	var runs stepRuns
	var point string
	v, replayed, err := idem.Do(b.ctx, g, b.call(), chargeSteps(&runs, &point))
	wantID := "ch_1/pch_" + derivedKey(dead, "processor")[:8]
	if err != nil || replayed || point != "charge_pending" || runs.pending.Load() != 0 || runs.processor.Load() != 1 || v.ID != wantID {
		t.Fatalf("the retry a TTL late = %+v (replayed %v, err %v), resumed at %q, pending step run %d times, processor %d; "+
			"want %q: resumed after charge_pending under the dead holder's record, so its derived key",
			v, replayed, err, point, runs.pending.Load(), runs.processor.Load(), wantID)
	}
	again, replayed, err := idem.Do(b.ctx, g, b.call(), chargeSteps(&runs, &point))
	if err != nil || !replayed || again != v || runs.processor.Load() != 1 {
		t.Fatalf("the next retry = %+v, replayed %v, err %v; want %+v replayed", again, replayed, err, v)
	}
}

// unfinishedAt leaves key's record at now: claimed with ttl, its step committed, its
// holder dead (lease lapsing at now + lease). It returns the claim.
func (b *bundle) unfinishedAt(key string, now time.Time, ttl time.Duration) *idemstore.ClaimParams {
	b.t.Helper()
	k := *b
	k.key = key
	p := k.claimParams(now)
	p.TTL = ttl
	k.claimWant(p, idemstore.ClaimAcquired)
	k.step(p.Token, "charge_pending", stepsOf("charge_pending", charge{ID: "ch_" + key}))
	return p
}

func testCleanupKeepsUnfinished(t *testing.T, h Harness) {
	b := setupCleanup(t, h)
	if !b.s.Capabilities().RecoveryPoints {
		t.Skip("store lacks Capabilities.RecoveryPoints (SPEC §13): skipping recovery-point case")
	}
	b.unfinishedAt("unfinished-lapsed", b.t0, time.Minute)
	released := b.unfinishedAt("unfinished-released", b.t0, time.Minute)
	rel := &idemstore.ReleaseParams{Scope: b.scope, Key: released.Key, Token: released.Token, Now: b.at(time.Second)}
	if err := b.s.RecordRelease(b.ctx, rel); err != nil {
		t.Fatal(err)
	}
	b.put("expired-completed", time.Minute, lease, true)
	finished := b.unfinishedAt("finished", b.t0, time.Minute)
	cp := b.completeParams(finished.Token, sampleResponse(), b.at(30*time.Second))
	cp.Key, cp.TTL = finished.Key, time.Minute
	if err := b.s.RecordComplete(b.ctx, cp); err != nil {
		t.Fatal(err)
	}

	now := b.at(80 * time.Second) // past every created_at + TTL; "finished" expires at t0+90s
	b.deleteExpired(now, 0, 100, 1)
	for _, key := range []string{"unfinished-lapsed", "unfinished-released", "finished"} {
		b.wantPresent(key, now)
	}
	now = b.at(2 * ttl)
	b.deleteExpired(now, 0, 100, 1) // "finished", a minute after its completion
	b.deleteExpired(now, 0, 100, 0)
	n, err := b.s.RecordDeleteExpired(b.ctx, &idemstore.DeleteExpiredParams{Retention: -time.Hour, Limit: 100, Now: now})
	if err == nil && n != 0 {
		t.Fatalf("RecordDeleteExpired(retention -1h) deleted %d records, want 0: they are unfinished", n)
	}
	for _, key := range []string{"unfinished-lapsed", "unfinished-released"} {
		b.wantPresent(key, now)
	}

	// Completed at last, it goes a TTL after its completion.
	k := *b
	k.key = released.Key
	taker := k.claimParams(now)
	taker.TTL = time.Minute
	k.claimWant(taker, idemstore.ClaimAcquired)
	done := k.completeParams(taker.Token, sampleResponse(), now)
	done.TTL = time.Minute
	if err := b.s.RecordComplete(b.ctx, done); err != nil {
		t.Fatal(err)
	}
	b.deleteExpired(now.Add(time.Minute-ms(1)), 0, 100, 0)
	b.deleteExpired(now.Add(time.Minute+ms(1)), 0, 100, 1)
	b.wantPresent("unfinished-lapsed", now.Add(time.Minute+ms(1)))
}

// countUnfinished counts the store's unfinished operations at now, failing the test
// on an error.
func (b *bundle) countUnfinished(now time.Time) *idemstore.CountUnfinishedResult {
	b.t.Helper()
	n, err := b.s.RecordCountUnfinished(b.ctx, &idemstore.CountUnfinishedParams{Now: now})
	if err != nil {
		b.t.Fatalf("RecordCountUnfinished: %v", err)
	}
	if !n.Now.Equal(now) {
		b.t.Fatalf("RecordCountUnfinished at %v says now is %v", now, n.Now)
	}
	return n
}

func testCountUnfinished(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	if n := b.countUnfinished(b.t0); n.Count != 0 || !n.Oldest.IsZero() || n.OldestAge() != 0 {
		t.Fatalf("count of an empty store = %+v, age %v; want 0, no oldest", n, n.OldestAge())
	}
	// Not unfinished, and older than every unfinished one: a key in flight without a
	// step, and one completed after its step.
	noStep := b.claimParams(b.at(-2 * time.Minute))
	noStep.Key = "no-step"
	b.claimWant(noStep, idemstore.ClaimAcquired)
	done := b.unfinishedAt("completed", b.at(-time.Minute), ttl)
	cp := b.completeParams(done.Token, sampleResponse(), b.at(-time.Minute))
	cp.Key = done.Key
	if err := b.s.RecordComplete(b.ctx, cp); err != nil {
		t.Fatal(err)
	}
	// Unfinished: lapsed, released, past its TTL, and one whose holder is at work.
	b.unfinishedAt("lapsed", b.t0, ttl)
	released := b.unfinishedAt("released", b.at(time.Second), ttl)
	rel := &idemstore.ReleaseParams{Scope: b.scope, Key: released.Key, Token: released.Token, Now: b.at(2 * time.Second)}
	if err := b.s.RecordRelease(b.ctx, rel); err != nil {
		t.Fatal(err)
	}
	b.unfinishedAt("past-ttl", b.at(2*time.Second), lease+ms(1))
	b.unfinishedAt("at-work", b.at(15*time.Second), ttl)

	now := b.at(20 * time.Second)
	if n := b.countUnfinished(now); n.Count != 4 || !n.Oldest.Equal(b.t0) || n.OldestAge() != 20*time.Second {
		t.Fatalf("count = %+v, age %v; want 4 unfinished operations, the oldest created at t0 (%v), 20s old", n, n.OldestAge(), b.t0)
	}
}

func testUnknownPastTTL(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	b.deadAfterStep()
	late := b.at(2 * ttl)
	p := b.claimParams(late)
	p.OnLapse = idemstore.LapseUnknown
	res := b.claimWant(p, idemstore.ClaimCompleted)
	if !res.MarkedUnknown || !res.Record.ExpiresAt.Equal(late.Add(ttl)) {
		t.Fatalf("claim under the policy unknown past the TTL: marked %v, expires %v; want marked, expiring a TTL later (%v)",
			res.MarkedUnknown, res.Record.ExpiresAt, late.Add(ttl))
	}
	if rec := b.mustGet(late.Add(ttl - ms(1))); rec.Response == nil || !rec.Response.OutcomeUnknown {
		t.Fatalf("the marked record a moment before its expiry: %v, want outcome unknown", describeResponse(rec.Response))
	}
	b.wantAbsent("the marked record a TTL after it was marked", late.Add(ttl))
}

func testCompleterPastTTL(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	var runs atomic.Int64
	g, c, clock := b.completer(resumeCharge(&runs))
	dead := b.deadAfterStep()
	clock.Advance(lease - ms(1)) // its holder may still be at work
	if p := b.wantPass(c, idem.CompleterPass{}); p.Unfinished != 1 || p.OldestUnfinished != lease-ms(1) {
		t.Fatalf("pass while the holder's lease is live = %+v, want 1 unfinished operation, %v old", p, lease-ms(1))
	}
	clock.Advance(2 * ttl)
	if p := b.wantPass(c, idem.CompleterPass{Resumed: 1}); p.Unfinished != 0 || p.OldestUnfinished != 0 {
		t.Fatalf("pass that finished it = %+v, want no unfinished operation left", p)
	}
	rec := b.mustGet(clock.Now())
	want := charge{ID: "ch_1/pch_" + derivedKey(dead, "processor")[:8], Amount: 2000}
	if rec.State != idemstore.StateCompleted || rec.ID != dead.RecordID || !rec.ExpiresAt.Equal(clock.Now().Add(ttl)) || runs.Load() != 1 {
		t.Fatalf("record %v, id %q, expiring %v after %d runs; want completed once as record %q with the dead holder's derived key, "+
			"expiring a TTL after the completion (%v)", rec.State, rec.ID, rec.ExpiresAt, runs.Load(), dead.RecordID, clock.Now().Add(ttl))
	}
	var fnRuns atomic.Int64
	got, replayed, err := idem.Do(b.ctx, g, b.call(), chargeOnce(&fnRuns))
	if err != nil || !replayed || got != want {
		t.Fatalf("the client's retry = %+v, replayed %v, err %v; want %+v replayed", got, replayed, err, want)
	}
}

// completerWith is completer with cfg (its BatchSize, RetryBackoff and Logger
// defaulted as completer's).
func (b *bundle) completerWith(fn idem.ResumeFunc, cfg idem.CompleterConfig) (*idem.Completer, *testkit.Clock) {
	g, clock := b.guard()
	g.RegisterResume(chargeOperation, fn)
	cfg.BatchSize = 3
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return idem.NewCompleter(g, cfg), clock
}

func testCompleterNeverGivesUp(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	down := errors.New("the processor is down")
	var attempts []time.Time
	const maxBackoff = 4 * time.Minute
	c, clock := b.completerWith(func(context.Context, *idem.Handle) error { return down },
		idem.CompleterConfig{RetryBackoff: 30 * time.Second, MaxRetryBackoff: maxBackoff})
	dead := b.deadAfterStep()
	clock.Advance(lease + ms(1))
	const step, span = 15 * time.Second, 3 * ttl
	for elapsed := time.Duration(0); elapsed < span; elapsed += step {
		if p := c.Pass(b.ctx); p.Err != nil || p.Resumed != 0 {
			t.Fatalf("pass at t0%+v = %+v", clock.Now().Sub(b.t0), p)
		} else if p.Failed == 1 {
			attempts = append(attempts, clock.Now())
		}
		clock.Advance(step)
	}
	// Jittered by ±10%, and seen at the first pass after it: at most this apart.
	bound := maxBackoff + maxBackoff/10 + step
	for i := 1; i < len(attempts); i++ {
		if gap := attempts[i].Sub(attempts[i-1]); gap > bound {
			t.Fatalf("attempt %d came %v after the one before, want at most %v (MaxRetryBackoff, jittered, and a pass)", i+1, gap, bound)
		}
	}
	if atLeast := int(span / bound); len(attempts) < atLeast {
		t.Fatalf("%d attempts in %v, want at least %d", len(attempts), span, atLeast)
	}
	b.wantUnfinished("the record after three TTLs of failed resumes", b.mustGet(clock.Now()), dead)
}

func testCompleterWarnsOnce(t *testing.T, h Harness) {
	b := setupSteps(t, h)
	var logs testkit.Buffer
	const warnAfter = 10 * time.Minute
	c, clock := b.completerWith(func(context.Context, *idem.Handle) error { return errors.New("the processor is down") },
		idem.CompleterConfig{RetryBackoff: time.Minute, MaxRetryBackoff: time.Minute, WarnAfter: warnAfter,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	dead := b.deadAfterStep()
	const msg = "still unfinished"
	for clock.Now().Sub(b.t0) < warnAfter-time.Minute {
		clock.Advance(time.Minute)
		c.Pass(b.ctx)
	}
	if n := strings.Count(logs.String(), msg); n != 0 {
		t.Fatalf("%d warnings that the operation is old before it was %v old:\n%s", n, warnAfter, logs.String())
	}
	for clock.Now().Sub(b.t0) < 3*warnAfter {
		clock.Advance(time.Minute)
		c.Pass(b.ctx)
	}
	out := logs.String()
	if n := strings.Count(out, msg); n != 1 {
		t.Fatalf("%d warnings that the operation is old, want exactly one:\n%s", n, out)
	}
	for _, want := range []string{"record_id=" + dead.RecordID, "recovery_point=charge_pending", "operation=" + chargeOperation,
		"last_error=\"the processor is down\""} {
		if !strings.Contains(out, want) {
			t.Errorf("the warning lacks %s:\n%s", want, out)
		}
	}
}
