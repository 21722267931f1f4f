package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
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

func (s *stallingReads) RecordGet(ctx context.Context, p *idem.RecordGetParams) (*idem.Record, error) {
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
	rec, err := b.store.RecordGet(context.Background(), &idem.RecordGetParams{Scope: "alice", Key: key, Now: b.clock.Now()})
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
	var completions []idem.CompletionEvent
	b := setup(t, func(c *idem.Config) {
		c.TTL = 31 * time.Second
		c.Observer = &idem.Observer{Completed: func(e idem.CompletionEvent) { completions = append(completions, e) }}
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
	if len(completions) != 1 || !completions[0].Expired || completions[0].Result != idem.CompletionStored {
		t.Errorf("observer told %+v, want one stored completion marked Expired", completions)
	}
	// The record is absent already: a retry executes again, which is what the
	// warning is about.
	c := &counter{}
	if w := serve(b.mw.Handler(c), req("POST", "/x", key, "{}")); w.Code != 201 || c.n.Load() != 1 {
		t.Errorf("retry: %d after %d executions", w.Code, c.n.Load())
	}
}
