package idem

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-go/idem/observe"
)

// reopen empties a frozen capture for a new response.
func (c *capture) reopen() {
	clear(c.header)
	c.body.Reset()
	c.status, c.wroteHeader, c.frozen = 0, false, false
}

// runClaimingInHandler runs a ClaimInHandler route's request. While the route's
// requests often find their key recorded (retryRate), a primary-key read of the key
// comes first (Handle.lookup), so that a retry is answered before the handler runs, as
// on the lease path: the stored response, key_reused, or what the usual claim finds of
// a record in flight (409, or a lapsed lease taken over, after which the handler runs
// under that lease). Otherwise, and for a key without a live record, the handler runs
// with the claim still to make, in the transaction of the store's Respond, which
// answers a key recorded meanwhile itself.
//
// A key this process knows (localKeys) is read before the handler in either regime:
// a duplicate of a key whose handler runs here gets 409 request_in_progress unless the
// store shows the key completed (then its replay; and unless the route waits for keys
// in flight), and a key recorded here is read first.
func (x *request) runClaimingInHandler(next http.Handler) {
	rt := x.rt
	defer func() { rt.retries.observe(x.keyFound) }()
	g, h := rt.m.g, &x.h
	if err := g.checkStoreState(x.r.Context(), g.localNow(), time.Time{}); err != nil {
		// The claim is made in the handler's transaction: refused before it runs.
		h.observeClaim(observe.OutcomeStoreError, false, time.Now(), err)
		x.answer(nil, g.storeError(x.r.Context(), h, "state", err))
		return
	}
	k := cacheKey{h.scope, h.key}
	local := rt.local.begin(k, h.claim.Fingerprint)
	switch local {
	case localNothing:
		defer func() {
			completed, _ := h.outcome()
			rt.local.end(k, x.keyFound || completed || !h.inTx)
		}()
		if !rt.retries.readFirst() {
			x.executeClaimingInHandler(next)
			return
		}
	}
	ctx := x.r.Context()
	first, found, err := h.lookup(ctx)
	if err != nil {
		h.observeClaim(observe.OutcomeStoreError, false, time.Now(), err)
		x.answer(nil, g.storeError(ctx, h, "lookup", err))
		return
	}
	if local == localRunning && first == nil && g.cfg.InFlightWait == 0 {
		// A handler of the key runs here, and the store shows no completed record
		// (its claim is in that handler's open transaction): the duplicate is in
		// flight. A key the store shows completed (the running handler's transaction
		// will find it so too) is replayed below, not answered 409.
		x.keyFound = true
		h.observeClaim(observe.OutcomeInProgress, false, time.Now(), nil)
		x.writeError(CodeRequestInProgress, "")
		return
	}
	if !found {
		x.executeClaimingInHandler(next)
		return
	}
	x.keyFound = true
	if resp, err := g.claimFrom(ctx, h, first); resp != nil || err != nil {
		x.answer(resp, err)
		return
	}
	x.execute(next) // acquired the usual way: the handler runs under the lease
}

// executeClaimingInHandler runs a ClaimInHandler route's handler before the key is
// claimed: the store's Respond claims it inside the transaction that holds the
// handler's writes and its completed record, with no lease and no heartbeat (the open
// transaction is the lock); a helper that needs a lease (InTx) claims it first the
// usual way (Handle.AcquireForTx).
func (x *request) executeClaimingInHandler(next http.Handler) {
	m := x.rt.m
	h := &x.h
	h.responder, h.inTx = x, true
	h.newClaim()
	h.hb.stopped = true // no lease to renew
	// As on the lease path, the handler's context outlives the client, so that its
	// one transaction runs to an outcome the client's retry finds; with no lease to
	// renew, the lease bounds it instead (and the lease of a claim made meanwhile).
	ctx, cancel := context.WithTimeout(&h.detached, m.g.cfg.Lease)
	defer cancel()
	h.hctx = handleCtx{Context: ctx, h: h}
	x.capture = getCapture(x.w, x.rt.keyHeader, x.keyValues(), m.cfg.MaxResponseBytes)
	defer func() {
		if p := recover(); p != nil {
			// No record exists unless a transaction committed it, or a helper claimed
			// the key under a lease (which the release ends). The capture is not
			// pooled again: the panic may have left it in use.
			if !h.inTx {
				h.abort()
			}
			panic(p)
		}
	}()
	next.ServeHTTP(x.capture, x.handlerRequest(h.Context()))
	x.reportLateWrites()
	x.endClaimingInHandler()
	putCapture(x.capture)
}

// endClaimingInHandler answers a ClaimInHandler route's request once its handler
// returned, as its transaction ended, or claims and completes what the handler
// answered without one.
func (x *request) endClaimingInHandler() {
	h := &x.h
	c := x.capture
	if c.pending {
		x.answer(c.pendingResp, c.pendingErr)
		return
	}
	if !h.inTx {
		x.finish() // a helper claimed the key under a lease: the lease path's end
		return
	}
	completed, failed := h.outcome()
	if h.observing() {
		h.observeClaimedInTx(h.claimedInTx, completed, failed)
	}
	switch {
	case completed:
		c.send()
	case errors.Is(failed, ErrKeyInProgress):
		x.writeError(CodeRequestInProgress, "")
	case failed != nil:
		x.rt.m.cfg.Logger.WarnContext(x.r.Context(), "idem: the claiming transaction failed; answering 503",
			x.attrs(slog.Any("error", failed))...)
		x.unavailable()
	default:
		x.answerUnclaimed()
	}
}

// answerUnclaimed answers what a ClaimInHandler route's handler wrote without a
// transaction that recorded it. A response that releases the key (an error answered
// before Respond: 400, 409, 5xx, SPEC §6) records nothing and is sent. Any other is a
// misuse, answered 500 and never stored, with an error naming the route: the route
// promises that its handler's writes commit with the key's record through the store's
// Respond, and a handler that wrote its response itself (its writes, if any, through
// the database directly) would run once per duplicate, the retries answered as
// replays of executions they did not replay (issue 19 item 1). A response streamed
// already cannot be taken back: it is logged the same way. Nothing written at all is
// a mistake too, answered 500.
func (x *request) answerUnclaimed() {
	h, c := &x.h, x.capture
	if c.empty() {
		x.rt.m.cfg.Logger.ErrorContext(x.r.Context(), "idem: the handler of a ClaimInHandler route returned without a response; "+
			"answering 500 (return the response from the store's Respond)", x.attrs(slog.String("route", x.routeName()))...)
		x.writeError(CodeInternalError, "")
		return
	}
	c.finish()
	store := x.rt.policy(c.status)
	h.mu.Lock()
	if h.overridden {
		store = h.overrideStore
	}
	h.mu.Unlock()
	if !store {
		c.send()
		return
	}
	const fix = "its writes, if any, are not protected and run again on every retry; return the response from the store's Respond " +
		"(or write it inside InTx), or mount the route without RouteOptions.ClaimInHandler"
	if c.passThrough {
		x.rt.m.cfg.Logger.ErrorContext(x.r.Context(), "idem: the handler of a ClaimInHandler route streamed a response without the store's Respond; "+fix,
			x.attrs(slog.String("route", x.routeName()), slog.Int("status", c.status))...)
		return
	}
	x.rt.m.cfg.Logger.ErrorContext(x.r.Context(), "idem: the handler of a ClaimInHandler route answered without the store's Respond; answering 500 instead: "+fix,
		x.attrs(slog.String("route", x.routeName()), slog.Int("status", c.status))...)
	c.reopen()
	x.writeError(CodeInternalError, "")
}

// routeName names the request's route in a log line: the route's Name, the ServeMux
// pattern, or the method and path.
func (x *request) routeName() string {
	switch {
	case x.rt.name != "":
		return x.rt.name
	case x.r.Pattern != "":
		return x.r.Pattern
	}
	return x.r.Method + " " + x.r.URL.Path
}

// answerLater makes the middleware answer, once the handler has returned, what a claim
// made inside the handler found (Handle.AcquireForTx): the capture refuses the
// handler's writes meanwhile, without a word (the handler did nothing wrong).
func (x *request) answerLater(resp *Response, err error) {
	c := x.capture
	c.pending, c.pendingResp, c.pendingErr = true, resp, err
	c.frozen, c.answered = true, true
}

// reportLateWrites logs a handler's writes that came after a SPEC §7 helper's
// transaction had committed its response: the writes failed (errCaptureFrozen), and
// the client gets the response stored before them. (Writes after a transaction that
// failed are refused too, without a word: the middleware answers 503 for it.)
func (x *request) reportLateWrites() {
	if completed, _ := x.h.outcome(); completed && x.capture.lateWrite {
		x.rt.m.cfg.Logger.ErrorContext(x.r.Context(), "idem: the handler wrote after its transaction had fixed the response; "+
			"the writes were refused and the client gets the response the transaction stored", x.attrs()...)
	}
}

// observeClaimedInTx reports the claim made in the handler's transaction: its
// outcome, and its completion when the transaction ran one.
func (h *Handle) observeClaimedInTx(claimed, completed bool, failed error) {
	switch {
	case errors.Is(failed, ErrKeyInProgress):
		h.observeClaim(observe.OutcomeInProgress, false, h.claimStartedReal, nil)
	case claimed:
		h.observeClaim(observe.OutcomeAcquired, false, h.claimStartedReal, nil)
		switch {
		case completed:
			h.mu.Lock()
			params := h.params
			h.mu.Unlock()
			h.observeCompletion(completionResult(params), true, false, 0, nil)
		case failed != nil:
			h.observeCompletion(observe.CompletionFailed, true, false, 0, failed)
		default: // its response releases the key: the transaction recorded nothing
			h.observeRelease(0, nil)
		}
	}
}
