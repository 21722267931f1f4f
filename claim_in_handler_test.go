package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

// fakeClaimingHelper stands for a store's one-transaction helper (such as
// store/postgres's InTxBatch) on a ClaimInHandler route: it prepares the claim and the
// completion, then ends as outcome says. It returns whether the handle offered a claim.
func fakeClaimingHelper(t *testing.T, h *idem.Handle, outcome func(h *idem.Handle)) bool {
	t.Helper()
	claim, ok := h.PrepareClaim()
	if !ok {
		return false
	}
	if claim.Key == "" || claim.Token == "" || claim.RecordID == "" || claim.Scope != "alice" {
		t.Errorf("claim params = %+v, want key, token, record id and scope", claim)
	}
	if _, ok := h.PrepareCompletion(); !ok {
		t.Errorf("PrepareCompletion of a 201 = not ok")
	}
	outcome(h)
	return true
}

func TestClaimInHandlerSendsTheResponseItsTransactionCommitted(t *testing.T) {
	b := setup(t, nil)
	h := b.mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ord_1"}`)
		if !fakeClaimingHelper(t, idem.FromContext(r.Context()), (*idem.Handle).Completed) {
			t.Error("PrepareClaim offered no claim on a ClaimInHandler route")
		}
	}))
	w := serve(h, req("POST", "/v1/orders", "key-committed", `{}`))
	if w.Code != http.StatusCreated || w.Body.String() != `{"id":"ord_1"}` || w.Header().Get("Idempotency-Key") != "key-committed" {
		t.Fatalf("answer = %d %s %v, want the handler's 201 with Idempotency-Key", w.Code, w.Body, w.Header())
	}
	if n := b.store.claims.Load(); n != 0 {
		t.Fatalf("the middleware claimed %d times, want 0: the handler's transaction claims", n)
	}
}

// A transaction that finds the key taken defers the claim: the middleware claims the
// usual way and runs the handler once more, under a lease, whose answer the client gets.
func TestClaimInHandlerDeferredClaimRunsTheHandlerAgainUnderALease(t *testing.T) {
	b := setup(t, nil)
	var runs atomic.Int64
	h := b.mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		hd := idem.FromContext(r.Context())
		if fakeClaimingHelper(t, hd, (*idem.Handle).DeferClaim) {
			io.WriteString(w, `{"run":"claiming"}`)
			return
		}
		io.WriteString(w, `{"run":"leased","body":`+string(body)+`}`)
	}))
	w := serve(h, req("POST", "/v1/orders", "key-deferred", `{"a":1}`))
	if w.Code != http.StatusCreated || w.Body.String() != `{"run":"leased","body":{"a":1}}` {
		t.Fatalf("answer = %d %s, want the leased run's 201 (with the body read again)", w.Code, w.Body)
	}
	if runs.Load() != 2 || b.store.claims.Load() != 1 {
		t.Fatalf("%d runs, %d claims; want 2 runs and 1 claim", runs.Load(), b.store.claims.Load())
	}
	replay := serve(h, req("POST", "/v1/orders", "key-deferred", `{"a":1}`))
	if replay.Body.String() != w.Body.String() || replay.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 3 {
		t.Fatalf("replay = %d %s after %d runs, want the stored answer replayed", replay.Code, replay.Body, runs.Load())
	}
}

func TestClaimInHandlerKeyInProgressIs409RequestInProgress(t *testing.T) {
	b := setup(t, nil)
	h := b.mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fakeClaimingHelper(t, idem.FromContext(r.Context()), func(h *idem.Handle) { h.CompletionFailed(idem.ErrKeyInProgress) })
	}))
	w := serve(h, req("POST", "/v1/orders", "key-in-progress", `{}`))
	wantCode(t, w, http.StatusConflict, idem.CodeRequestInProgress)
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
}

func TestClaimInHandlerFailedTransactionIs503(t *testing.T) {
	b := setup(t, nil)
	h := b.mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fakeClaimingHelper(t, idem.FromContext(r.Context()), func(h *idem.Handle) { h.CompletionFailed(context.DeadlineExceeded) })
	}))
	wantCode(t, serve(h, req("POST", "/v1/orders", "key-failed-tx", `{}`)), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
}

func TestPrepareClaimOffersNothingOnOtherRoutes(t *testing.T) {
	b := setup(t, nil)
	h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := idem.FromContext(r.Context()).PrepareClaim(); ok {
			t.Error("PrepareClaim offered a claim the middleware already made")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if w := serve(h, req("POST", "/v1/charges", "key-lease-route", `{}`)); w.Code != http.StatusCreated {
		t.Fatalf("answer = %d %s", w.Code, w.Body)
	}
}

// Reopen lets a handler whose §7 transaction committed nothing answer otherwise: the
// next PrepareCompletion freezes the new response, and the client gets that one.
func TestReopenReplacesAPreparedResponse(t *testing.T) {
	b := setup(t, nil)
	h := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := idem.FromContext(r.Context())
		w.Header().Set("X-First", "1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"first":true}`)
		if _, ok := hd.PrepareCompletion(); !ok {
			t.Fatal("PrepareCompletion not ok")
		}
		hd.CompletionFailed(context.Canceled) // the pipelined transaction rolled back
		if !hd.Reopen() {
			t.Fatal("Reopen = false")
		}
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"second":true}`)
		p, ok := hd.PrepareCompletion()
		if !ok || p.Response.Status != http.StatusOK || string(p.Response.Body) != `{"second":true}` {
			t.Fatalf("second PrepareCompletion = %v %+v, want the second response", ok, p)
		}
		if err := b.store.RecordComplete(r.Context(), p); err != nil {
			t.Fatal(err)
		}
		hd.Completed()
		if hd.Reopen() {
			t.Error("Reopen after Completed = true")
		}
	}))
	w := serve(h, req("POST", "/v1/charges", "key-reopened", `{}`))
	if w.Code != http.StatusOK || w.Body.String() != `{"second":true}` || w.Header().Get("X-First") != "" {
		t.Fatalf("answer = %d %s %v, want only the second response", w.Code, w.Body, w.Header())
	}
	replay := serve(h, req("POST", "/v1/charges", "key-reopened", `{}`))
	if !strings.Contains(replay.Body.String(), "second") || replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay = %d %s, want the second response", replay.Code, replay.Body)
	}
}
