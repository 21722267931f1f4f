package idem

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
)

// ErrClaimDeferred is returned by a store's one-transaction helper (such as
// store/postgres's (*Store).InTxBatch) on a [RouteOptions.ClaimInHandler] route when
// its transaction found the key already claimed, or could not write what the handler
// prepared, and committed nothing. The helper has called [Handle.DeferClaim]; the
// handler returns, and the middleware claims the key the usual way.
var ErrClaimDeferred = errors.New("idem: the key was not claimed in the handler's transaction; the middleware claims it")

// ErrKeyInProgress is returned by a store's one-transaction helper on a
// [RouteOptions.ClaimInHandler] route when a concurrent transaction holding the same
// key did not commit within the helper's lock timeout. The helper has passed it to
// [Handle.CompletionFailed]; the middleware answers 409 request_in_progress.
var ErrKeyInProgress = errors.New("idem: a concurrent request holds the key")

// reopener is a Responder that can discard a frozen response (Handle.Reopen).
type reopener interface{ reopen() bool }

// Reopen is for a SPEC §7 helper whose transaction rolled back, having committed
// nothing, after [Handle.PrepareCompletion] froze the response: a pipelined
// transaction that found a conflict, say, after which the handler writes another
// response and completes it in another transaction. It discards the response written
// so far and any failure reported, so that the next PrepareCompletion freezes the new
// response. The lease is no longer renewed: the handler must finish within it (the
// fenced completion refuses otherwise). It returns false, changing nothing, when there
// is nothing to reopen: no completion was prepared, the response was streamed (or was
// not a capture's), or the completion committed.
func (h *Handle) Reopen() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, _ := h.responder.(reopener)
	if r == nil || h.done || !h.decided || !r.reopen() {
		return false
	}
	h.decided, h.store, h.params, h.failed = false, false, nil, nil
	return true
}

// PrepareClaim is for store packages implementing the one-transaction path of
// [RouteOptions.ClaimInHandler]. It returns the claim to make inside the handler's
// transaction, which inserts the record already completed with the response of
// [Handle.PrepareCompletion] (when that is ok; otherwise the transaction records
// nothing). ok is false when the key was claimed already, as it is on every other
// route.
func (h *Handle) PrepareClaim() (params *RecordClaimParams, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.inTx || h.deferred {
		return nil, false
	}
	h.claimedInTx = true
	return &h.claim, true
}

// DeferClaim is for store packages: the handler's transaction found the key of
// [Handle.PrepareClaim] already claimed, or could not write what the handler
// prepared, and committed nothing. The middleware then discards the handler's
// response and claims the key the usual way: it replays the stored response, refuses
// the request, or runs the handler once more holding a lease.
func (h *Handle) DeferClaim() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inTx {
		h.deferred = true
	}
}

// reopen empties a frozen capture for a new response.
func (c *capture) reopen() {
	clear(c.header)
	c.body.Reset()
	c.status, c.wroteHeader, c.frozen = 0, false, false
}

// executeClaimingInHandler runs a ClaimInHandler route's handler, whose transaction
// claims the key: its claim has no lease and no heartbeat (the open transaction is the
// lock). It returns false, having sent nothing, when that transaction found the key
// taken: the caller then claims the usual way.
func (x *request) executeClaimingInHandler(next http.Handler) bool {
	m := x.rt.m
	h := &Handle{}
	h.init(m.g, x.r.Context(), x.h.scope, x.h.key, x.h.claim.Fingerprint, x.h.claim.TTL)
	h.describer, h.responder, h.inTx, h.managed, h.route = x, x, true, true, x.h.route
	h.newClaim()
	h.hb.stopped = true // no lease to renew
	// As on the lease path, the handler's context outlives the client, so that its
	// one transaction runs to an outcome the client's retry finds; with no lease to
	// renew, the lease bounds it instead.
	ctx, cancel := context.WithTimeout(&h.detached, m.g.cfg.Lease)
	defer cancel()
	h.hctx = handleCtx{Context: ctx, h: h}
	x.capture = getCapture(x.w, x.rt.keyHeader, x.keyValues(), m.cfg.MaxResponseBytes)
	// A panic needs no release: no record exists unless the transaction committed it.
	next.ServeHTTP(x.capture, x.handlerRequest(h.Context()))
	defer putCapture(x.capture)
	completed, failed := h.outcome()
	h.mu.Lock()
	deferred, claimed := h.deferred, h.claimedInTx
	h.mu.Unlock()
	if !deferred && h.observing() {
		h.observeClaimedInTx(claimed, completed, failed)
	}
	switch {
	case completed:
		x.capture.send()
	case deferred:
		return false
	case errors.Is(failed, ErrKeyInProgress):
		x.writeError(CodeRequestInProgress, "")
	case failed != nil:
		m.cfg.Logger.WarnContext(x.r.Context(), "idem: the claiming transaction failed; answering 503",
			x.attrs(slog.Any("error", failed))...)
		x.unavailable()
	default:
		if !claimed && x.rt.policy(x.capture.status) && x.capture.wroteHeader {
			m.cfg.Logger.ErrorContext(x.r.Context(), "idem: a ClaimInHandler route answered without claiming its key in its transaction; nothing was recorded", x.attrs()...)
		}
		x.capture.send()
	}
	return true
}

// observeClaimedInTx reports the claim made in the handler's transaction (not
// deferred): its outcome, and its completion when the transaction ran one.
func (h *Handle) observeClaimedInTx(claimed, completed bool, failed error) {
	switch {
	case errors.Is(failed, ErrKeyInProgress):
		h.observeClaim(OutcomeInProgress, false, h.claimStartedReal, nil)
	case claimed:
		h.observeClaim(OutcomeAcquired, false, h.claimStartedReal, nil)
		switch {
		case completed:
			h.mu.Lock()
			params := h.params
			h.mu.Unlock()
			h.observeCompletion(completionResult(params), true, false, 0, nil)
		case failed != nil:
			h.observeCompletion(CompletionFailed, true, false, 0, failed)
		default: // its response releases the key: the transaction recorded nothing
			h.observeRelease(0, nil)
		}
	}
}
