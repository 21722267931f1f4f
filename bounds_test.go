package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/memory"
)

// The bounds of SPEC §5 (Lease) and §9 (bounded time): a stalled store costs a keyed
// request at most StoreTimeout before the handler runs, and a handler whose renewals
// stall is cancelled before its lease ends.

// wantCallBounded fails unless ctx, the context of a store call that began at or
// after began, ends at most timeout after began.
func wantCallBounded(t *testing.T, what string, ctx context.Context, began time.Time, timeout time.Duration) {
	t.Helper()
	deadline, ok := ctx.Deadline()
	if !ok {
		t.Fatalf("%s runs without a deadline: a stalled store would hang the request", what)
	}
	if d := deadline.Sub(began); d > timeout {
		t.Fatalf("%s may take %v, want at most StoreTimeout (%v)", what, d, timeout)
	}
}

func TestStalledClaimAnswersStoreUnavailableWithinStoreTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	b := setup(t, func(c *idem.Config) { c.StoreTimeout = timeout })
	b.store.stall = make(chan storeCall, 1)
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}")) }()

	call := <-b.store.stall
	wantCallBounded(t, "the claim", call.ctx, call.began, timeout)
	w := <-done
	wantCode(t, w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Error("503 store_unavailable without Retry-After")
	}
}

// A ClaimInHandler route that reads its key before the handler (while retries are
// frequent, SPEC §7) reads it under StoreTimeout too: a stalled read answers 503
// store_unavailable in bounded time, and the handler does not run.
func TestStalledReadOfAClaimInHandlerRouteAnswersStoreUnavailableWithinStoreTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	b := setup(t, func(c *idem.Config) { c.StoreTimeout = timeout })
	var runs atomic.Int64
	h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if err := idem.FromContext(r.Context()).AcquireForTx(r.Context()); err != nil {
			return
		}
		_ = inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(http.StatusCreated)
			return nil
		})
	})
	for i := range 16 { // a request, then retries: the route learns to read first
		if w := serve(h, req("POST", "/x", key, "{}")); w.Code != http.StatusCreated {
			t.Fatalf("request %d: %d %s", i+1, w.Code, w.Body)
		}
	}
	gets := b.store.gets.Load()
	if w := serve(h, req("POST", "/x", key, "{}")); w.Code != http.StatusCreated || b.store.gets.Load() != gets+1 {
		t.Fatalf("after 15 retries a retry is answered %d with %d reads, want 201 from one read", w.Code, b.store.gets.Load()-gets)
	}

	b.store.stall = make(chan storeCall, 1)
	runsBefore := runs.Load()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(h, req("POST", "/x", "a-new-key", "{}")) }()
	call := <-b.store.stall
	wantCallBounded(t, "the read of the key", call.ctx, call.began, timeout)
	w := <-done
	wantCode(t, w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Error("503 store_unavailable without Retry-After")
	}
	if n := runs.Load() - runsBefore; n != 0 {
		t.Errorf("the handler ran %d times behind a stalled read", n)
	}
}

func TestStalledPollEndsTheInFlightWaitWithStoreUnavailable(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	b := setup(t, nil)
	h := newHeld()
	first := make(chan struct{})
	go func() { serve(b.mw.Handler(h), req("POST", "/x", key, "{}")); close(first) }()
	<-h.entered

	// A duplicate, through a middleware that waits for the first request far longer
	// than the test runs, over the same store, whose reads stall.
	polls := &stallingReads{countingStore: b.store, stall: make(chan storeCall, 1)}
	dup := idem.New(idem.Config{
		Store: polls, Scope: bearerScope, Clock: b.clock.Now,
		StoreTimeout: timeout, InFlightWait: time.Hour,
		Logger: slog.New(slog.DiscardHandler),
	}).Handler(&counter{})
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(dup, req("POST", "/x", key, "{}")) }()

	call := <-polls.stall
	wantCallBounded(t, "a poll of the in-flight wait", call.ctx, call.began, timeout)
	wantCode(t, <-done, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	close(h.gate)
	<-first
}

// storeCall is a stalled store call: its context and when it began.
type storeCall struct {
	ctx   context.Context
	began time.Time
}

// stallingReads is a countingStore whose reads stall as a store that stopped
// answering does; its claims answer.
type stallingReads struct {
	*countingStore
	stall chan storeCall
}

func (s *stallingReads) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	s.stall <- storeCall{ctx, time.Now()}
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestHandlerIsCancelledBeforeItsKeyCanBeTakenOver(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // Lease 30s, injected clock
	b.store.renewBlocks = make(chan struct{})
	leaseEnds := idem.UseManualLeaseTimers(b.mw)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	mw := b.mw.Handler(h)
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(mw, req("POST", "/x", key, "{}")) }()
	ctx := <-h.entered

	// The first renewal stalls.
	b.clock.Advance(10 * time.Second)
	b.ticker.Tick()
	<-b.store.renewBlocks

	// The handler is cancelled when its lease-end timer fires: before the lease the
	// store granted ends, by at least the margin.
	cutoff := b.clock.Now().Add(leaseEnds.Armed())
	rec, err := b.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "alice", Key: key, Now: b.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if margin := rec.LeaseEnd.Sub(cutoff); margin < time.Second {
		t.Fatalf("the handler would be cancelled %v before the store's lease end, want at least 1s (Lease/10, at most MaxLeaseMargin)", margin)
	}
	// The clock reaches the cutoff and the timer fires.
	b.clock.Advance(cutoff.Sub(b.clock.Now()))
	leaseEnds.Tick()
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
		t.Fatalf("handler context cause %v, want ErrLeaseLost", context.Cause(ctx))
	}
	if err := <-renewed; !errors.Is(err, context.Canceled) {
		t.Errorf("the stalled renewal ended with %v, want it called off", err)
	}
	// At this moment nobody can take the key over yet: the store's lease is live.
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 409, idem.CodeRequestInProgress)
	// Once it ends, a retry takes the key over, and the cancelled holder's late
	// answer is fenced off.
	b.clock.Advance(rec.LeaseEnd.Sub(b.clock.Now()))
	if w := serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}")); w.Code != 201 {
		t.Fatalf("retry after the lease ended: %d, want the takeover's 201", w.Code)
	}
	close(h.gate)
	wantCode(t, <-first, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
}

func TestTTLMustOutliveTheLease(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, want string
		build      func()
	}{
		{"config TTL equal to the lease", "Config.TTL (30s) must be longer than Config.Lease (30s)", func() {
			idem.New(idem.Config{Store: memory.New(), Scope: bearerScope, TTL: idem.DefaultLease})
		}},
		{"config TTL shorter than the default lease", "Config.TTL (10s) must be longer", func() {
			idem.New(idem.Config{Store: memory.New(), Scope: bearerScope, TTL: 10 * time.Second})
		}},
		{"route TTL shorter than the lease", "RouteOptions.TTL (1m0s) must be longer than Config.Lease (2m0s)", func() {
			idem.New(idem.Config{Store: memory.New(), Scope: bearerScope, Lease: 2 * time.Minute}).
				Route(idem.RouteOptions{TTL: time.Minute})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if got := fmt.Sprint(recover()); !strings.HasPrefix(got, "idem: ") || !strings.Contains(got, tt.want) {
					t.Errorf("panic %q, want one saying %q", got, tt.want)
				}
			}()
			tt.build()
		})
	}
}

func TestCompletingAnExpiredRecordIsLogged(t *testing.T) {
	t.Parallel()
	var completions []observe.CompletionEvent
	b := setup(t, func(c *idem.Config) {
		c.TTL = 31 * time.Second
		c.Observer = &observe.Observer{Completed: func(e observe.CompletionEvent) { completions = append(completions, e) }}
	})
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered
	b.clock.Advance(32 * time.Second) // the handler outlives the TTL
	close(h.gate)
	<-done
	if !strings.Contains(b.logs.String(), "completed after its TTL") {
		t.Errorf("no warning for a record completed already expired; logs:\n%s", b.logs)
	}
	if len(completions) != 1 || !completions[0].Expired || completions[0].Result != observe.CompletionStored {
		t.Errorf("observer told %+v, want one stored completion marked Expired", completions)
	}
	// The record is absent already: a retry executes again, which is what the
	// warning is about.
	c := &counter{}
	if w := serve(b.mw.Handler(c), req("POST", "/x", key, "{}")); w.Code != 201 || c.n.Load() != 1 {
		t.Errorf("retry: %d after %d executions", w.Code, c.n.Load())
	}
}

// lateClaims is a countingStore whose armed claims are cut off: each waits for its
// context to end, as a call to a stalled store does, and then hands the test, on late,
// a func that makes the claim reach the store, as a healed partition delivers it.
type lateClaims struct {
	*countingStore
	armed atomic.Int64 // how many of the next claims are cut off
	late  chan func() error
}

func (s *lateClaims) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	if p.Scope == idemstore.ReservedScope { // idem's own records: the store's state
		return s.countingStore.RecordClaim(ctx, p)
	}
	if s.armed.Add(-1) < 0 {
		s.armed.Add(1)
		return s.countingStore.RecordClaim(ctx, p)
	}
	<-ctx.Done()
	cut := *p
	s.late <- func() error {
		_, err := s.countingStore.RecordClaim(context.Background(), &cut)
		return err
	}
	return nil, ctx.Err()
}

// cutOffSetup is setup over a lateClaims store, with watched told when the watch of a
// cut-off claim ends.
func cutOffSetup(t *testing.T, mod func(*idem.Config)) (b *bundle, st *lateClaims, watched chan bool) {
	b = setup(t, func(c *idem.Config) {
		st = &lateClaims{countingStore: c.Store.(*countingStore), late: make(chan func() error, 64)}
		c.Store = st
		c.StoreTimeout = 20 * time.Millisecond
		if mod != nil {
			mod(c)
		}
	})
	watched = make(chan bool, 64)
	idem.OnCutOffWatched(b.mw, func(released bool) { watched <- released })
	return b, st, watched
}

// A claim cut off by StoreTimeout that reaches the store afterwards (a healed
// partition) is released in the background, fenced by its own token, so that the
// client's retry executes at once instead of meeting request_in_progress until the
// cut-off claim's unrenewed lease lapses (here never: the clock is injected).
func TestAClaimCutOffByStoreTimeoutThatLandsLaterIsReleased(t *testing.T) {
	t.Parallel()
	b, st, watched := cutOffSetup(t, nil)
	h := b.mw.Handler(&counter{})
	st.armed.Store(1)
	wantCode(t, serve(h, req("POST", "/x", key, "{}")), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if err := (<-st.late)(); err != nil { // the partition heals: the claim lands
		t.Fatal(err)
	}
	if rec, err := b.store.RecordGet(t.Context(), &idemstore.GetParams{Scope: "alice", Key: key, Now: b.clock.Now()}); err != nil || rec.State != idemstore.StateInFlight {
		t.Fatalf("after the late claim landed: %+v, %v; want the key in flight", rec, err)
	}
	select {
	case released := <-watched:
		if !released {
			t.Fatal("the watch of the cut-off claim ended without releasing it")
		}
	case <-time.After(idem.DefaultLease + 5*time.Second): // the watch's own bound, and more
		t.Fatal("no watch of the cut-off claim ended within its lease")
	}
	wantCode(t, serve(h, req("POST", "/x", key, "{}")), http.StatusCreated, "")
	if !strings.Contains(b.logs.String(), "reached the store after all") {
		t.Errorf("the release of the late claim was not logged:\n%s", b.logs)
	}
}

// A cut-off claim that never reaches the store costs a watch that ends by the claim's
// lease end, releasing nothing; at most MaxCutOffWatches run at once, however many
// claims are cut off, and the requests never wait for them.
func TestWatchesOfCutOffClaimsAreBounded(t *testing.T) {
	t.Parallel()
	// The watches end by their claims' lease end: a lease long enough that every
	// request is cut off before the first watch ends, on a loaded machine too.
	b, st, watched := cutOffSetup(t, func(c *idem.Config) { c.Lease = 2 * time.Second })
	h := b.mw.Handler(&counter{})
	n := 2 * idem.MaxCutOffWatches
	st.armed.Store(int64(n))
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			w := serve(h, req("POST", "/x", fmt.Sprintf("key-cut-off-%04d", i), "{}"))
			if w.Code != http.StatusServiceUnavailable {
				t.Errorf("a cut-off claim answered %d, want 503", w.Code)
			}
		})
	}
	wg.Wait()
	if running := idem.CutOffWatches(b.mw); running != idem.MaxCutOffWatches {
		t.Fatalf("%d watches run after %d cut-off claims, want MaxCutOffWatches (%d)", running, n, idem.MaxCutOffWatches)
	}
	for range idem.MaxCutOffWatches {
		if <-watched {
			t.Fatal("a watch released a claim that never reached the store")
		}
	}
	if running := idem.CutOffWatches(b.mw); running != 0 {
		t.Fatalf("%d watches still run after each ended", running)
	}
	wantCode(t, serve(h, req("POST", "/x", "key-cut-off-0000", "{}")), http.StatusCreated, "")
}
