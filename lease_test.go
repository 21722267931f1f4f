package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// heldHandler signals when it runs and waits for the test before answering.
type heldHandler struct {
	entered chan context.Context
	gate    chan struct{}
}

func newHeld() *heldHandler {
	return &heldHandler{entered: make(chan context.Context, 1), gate: make(chan struct{})}
}

func (h *heldHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.entered <- r.Context()
	<-h.gate
	w.WriteHeader(201)
}

func TestHeartbeatRenewsTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // Lease 30s, injected clock
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered

	b.clock.Advance(20 * time.Second)
	b.ticker.Tick()
	if err := <-renewed; err != nil {
		t.Fatalf("renewal failed: %v", err)
	}
	// 40s after the claim the first lease (30s) would have lapsed; the renewed one
	// (until 50s) holds, so a duplicate is told to wait rather than taking over.
	b.clock.Advance(20 * time.Second)
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 409, idem.CodeRequestInProgress)
	close(h.gate)
	<-done
}

func TestLostLeaseCancelsTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	causes, entered := make(chan error, 1), make(chan struct{})
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			close(entered)
			<-r.Context().Done()
			causes <- context.Cause(r.Context())
			w.WriteHeader(201) // too late: the key was taken over
			return
		}
		w.WriteHeader(202)
	}))
	first := make(chan *httpResult, 1)
	go func() { first <- result(serve(mw, req("POST", "/x", key, "{}"))) }()
	// Wait for the first holder's claim, then let its lease lapse; the next
	// request takes the key over and completes it.
	<-entered
	b.clock.Advance(31 * time.Second)
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 202 {
		t.Fatalf("takeover: %d", w.Code)
	}
	b.ticker.Tick()
	if err := <-renewed; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("renewal: %v, want ErrLeaseLost", err)
	}
	if cause := <-causes; !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("handler context cause %v, want ErrLeaseLost", cause)
	}
	if r := <-first; r.code != 503 {
		t.Errorf("the holder that lost its lease answered %d, want 503", r.code)
	}
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 202 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d, want the winner's replay", w.Code)
	}
}

func TestFailingRenewalsCancelOnceTheLeaseRanOut(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	ctx := <-h.entered
	b.store.renewDown.Store(true)

	b.clock.Advance(10 * time.Second)
	b.ticker.Tick()
	if err := <-renewed; err == nil {
		t.Fatal("renewal succeeded on a failing store")
	}
	if ctx.Err() != nil {
		t.Fatal("the handler was cancelled while its lease was still live")
	}
	b.clock.Advance(20 * time.Second) // the lease granted at the claim ends now
	b.ticker.Tick()
	<-renewed
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
		t.Errorf("cause %v, want ErrLeaseLost", context.Cause(ctx))
	}
	close(h.gate)
	<-done
}

type httpResult struct{ code int }

func result(w interface{ Result() *http.Response }) *httpResult {
	return &httpResult{code: w.Result().StatusCode}
}

func TestCompletionDoesNotWaitForABlockedRenewal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.store.renewBlocks = make(chan struct{})
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	entered, gate := make(chan struct{}), make(chan struct{})
	var cause error
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-gate
		w.WriteHeader(201)
		err := inTx(r.Context(), b.store, nil, func() error { return nil })
		if err != nil {
			t.Errorf("inTx: %v", err)
		}
		cause = context.Cause(r.Context())
	}))
	done := make(chan int)
	go func() { done <- serve(mw, req("POST", "/x", key, "{}")).Code }()
	<-entered
	go b.ticker.Tick()
	<-b.store.renewBlocks // the renewal is stuck in the store
	close(gate)           // PrepareCompletion must abort it rather than wait
	if code := <-done; code != 201 {
		t.Errorf("status %d", code)
	}
	if cause != nil {
		t.Errorf("the aborted renewal cancelled the handler: %v", cause)
	}
	if err := <-renewed; !errors.Is(err, context.Canceled) {
		t.Errorf("renewal ended with %v, want it aborted", err)
	}
}

func TestHandlerAnsweringAfterALostLeaseGetsStoreUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	entered := make(chan struct{})
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		// The application's own error for an interrupted operation.
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"processor_interrupted"}}`))
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(mw, req("POST", "/x", key, "{}")) }()
	<-entered
	b.store.renewDown.Store(true)
	b.clock.Advance(31 * time.Second) // past the lease granted at the claim
	b.ticker.Tick()
	<-renewed

	w := <-first
	wantCode(t, w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Error("503 store_unavailable without Retry-After")
	}
}
