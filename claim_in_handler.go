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

// reopener and handlerClaimer are what Reopen, PrepareClaim and DeferClaim find behind
// a Handle's preparer.
type reopener interface{ reopen() bool }

type handlerClaimer interface {
	handlerClaim() (*RecordClaimParams, bool)
	deferClaim()
	claimDeferred() bool
}

// Reopen is for a SPEC §7 helper whose transaction rolled back, having committed
// nothing, after [Handle.PrepareCompletion] froze the response: a pipelined
// transaction that found a conflict, say, after which the handler writes another
// response and completes it in another transaction. It discards the response written
// so far and any failure reported, so that the next PrepareCompletion freezes the new
// response. The lease is no longer renewed: the handler must finish within it (the
// fenced completion refuses otherwise). It returns false, changing nothing, when there
// is nothing to reopen: no completion was prepared, the response was streamed, or the
// completion committed.
func (h *Handle) Reopen() bool {
	h.mu.Lock()
	r, _ := h.prepare.(reopener)
	done := h.done
	h.mu.Unlock()
	if r == nil || done || !r.reopen() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = nil
	return true
}

// PrepareClaim is for store packages implementing the one-transaction path of
// [RouteOptions.ClaimInHandler]. It returns the claim to make inside the handler's
// transaction, which inserts the record already completed with the response of
// [Handle.PrepareCompletion] (when that is ok; otherwise the transaction records
// nothing). ok is false when the middleware claimed the key itself, as it does on
// every other route.
func (h *Handle) PrepareClaim() (params *RecordClaimParams, ok bool) {
	h.mu.Lock()
	c, _ := h.prepare.(handlerClaimer)
	h.mu.Unlock()
	if c == nil {
		return nil, false
	}
	return c.handlerClaim()
}

// DeferClaim is for store packages: the handler's transaction found the key of
// [Handle.PrepareClaim] already claimed, or could not write what the handler
// prepared, and committed nothing. The middleware then discards the handler's
// response and claims the key the usual way: it replays the stored response, refuses
// the request, or runs the handler once more holding a lease.
func (h *Handle) DeferClaim() {
	h.mu.Lock()
	c, _ := h.prepare.(handlerClaimer)
	h.mu.Unlock()
	if c != nil {
		c.deferClaim()
	}
}

// reopen discards a prepared completion whose transaction committed nothing, so that
// the handler can write another response (Handle.Reopen).
func (ex *execution) reopen() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if !ex.decided || ex.capture.passThrough {
		return false
	}
	ex.decided, ex.store, ex.params = false, false, nil
	ex.capture.reopen()
	return true
}

// reopen empties a frozen capture for a new response.
func (c *capture) reopen() {
	clear(c.header)
	c.body.Reset()
	c.status, c.wroteHeader, c.frozen = 0, false, false
}

// claimingExecution is the run of a ClaimInHandler route's handler: no claim yet, no
// lease and no heartbeat; the handler's transaction claims.
type claimingExecution struct {
	execution
	claim    RecordClaimParams
	claimed  bool // the handler asked for the claim
	deferred bool // ... and its transaction found the key taken
}

func (ce *claimingExecution) handlerClaim() (*RecordClaimParams, bool) {
	ce.mu.Lock()
	defer ce.mu.Unlock()
	if ce.deferred {
		return nil, false
	}
	ce.claimed = true
	return &ce.claim, true
}

func (ce *claimingExecution) deferClaim() {
	ce.mu.Lock()
	defer ce.mu.Unlock()
	ce.deferred = true
}

func (ce *claimingExecution) claimDeferred() bool {
	ce.mu.Lock()
	defer ce.mu.Unlock()
	return ce.deferred
}

// executeClaimingInHandler runs a ClaimInHandler route's handler, whose transaction
// claims the key. It returns false, having sent nothing, when that transaction found
// the key taken: the caller then claims the usual way.
func (x *request) executeClaimingInHandler(next http.Handler) bool {
	m := x.m
	token, id := newTokens()
	ce := &claimingExecution{}
	ex := &ce.execution
	ex.request, ex.token = x, token
	ex.hb.stopped = true // no lease to renew: the open transaction is the lock
	ex.handleVal.scope, ex.handleVal.key, ex.handleVal.prepare = x.scope, x.key, ce
	ex.handle = &ex.handleVal
	// As on the lease path, the handler's context outlives the client, so that its
	// one transaction runs to an outcome the client's retry finds; with no lease to
	// renew, the lease bounds it instead.
	ctx, cancel := context.WithTimeout(x.detached(), m.cfg.Lease)
	defer cancel()
	ex.hctx = handleCtx{Context: ctx, h: ex.handle}
	ex.capture = getCapture(x.w, x.keyValues, m.cfg.MaxResponseBytes)
	ce.claim = RecordClaimParams{
		Scope: x.scope, Key: x.key, Fingerprint: x.fp, Token: token, RecordID: id,
		Lease: m.cfg.Lease, TTL: x.rt.ttl, Now: m.storeNow(),
	}
	// A panic needs no release: no record exists unless the transaction committed it.
	next.ServeHTTP(ex.capture, x.handlerRequest(&ex.hctx))
	defer putCapture(ex.capture)
	completed, failed := ex.handle.outcome()
	switch {
	case completed:
		ex.capture.send()
	case ce.claimDeferred():
		return false
	case errors.Is(failed, ErrKeyInProgress):
		m.WriteError(x.w, x.r, CodeRequestInProgress, "")
	case failed != nil:
		m.cfg.Logger.WarnContext(x.r.Context(), "idem: the claiming transaction failed; answering 503",
			x.attrs(slog.Any("error", failed))...)
		ex.unavailable()
	default:
		ce.mu.Lock()
		claimed := ce.claimed
		ce.mu.Unlock()
		if !claimed && x.rt.policy(ex.capture.status) && ex.capture.wroteHeader {
			m.cfg.Logger.ErrorContext(x.r.Context(), "idem: a ClaimInHandler route answered without claiming its key in its transaction; nothing was recorded", x.attrs()...)
		}
		ex.capture.send()
	}
	return true
}
