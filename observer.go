package idem

import (
	"time"

	"github.com/idem-go/idem/observe"
)

// The observer's calls, each a no-op when the observer or its func is nil.

func (h *Handle) observing() bool { return h.g.cfg.Observer != nil }

// observeClaim reports the claim's outcome, begun at start.
func (h *Handle) observeClaim(o observe.Outcome, waited bool, start time.Time, err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.Claimed != nil {
		ob.Claimed(observe.ClaimEvent{Context: &h.detached, Route: h.route, KeyHash: h.keyHash, Outcome: o,
			Waited: waited, Duration: time.Since(start), Err: err})
	}
}

// observeCompletion reports a completion whose store call took storeDur (zero in a
// SPEC §7 transaction).
func (h *Handle) observeCompletion(r observe.CompletionResult, inTx, expired bool, storeDur time.Duration, err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.Completed != nil {
		ob.Completed(observe.CompletionEvent{Context: &h.detached, Route: h.route, KeyHash: h.keyHash,
			Result: r, InTx: inTx, Expired: expired, Duration: time.Since(h.claimStartedReal),
			StoreDuration: storeDur, Err: err})
	}
}

// observeRelease reports a release whose store call took storeDur.
func (h *Handle) observeRelease(storeDur time.Duration, err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.Released != nil {
		ob.Released(observe.ReleaseEvent{Context: &h.detached, Route: h.route, KeyHash: h.keyHash,
			Duration: time.Since(h.claimStartedReal), StoreDuration: storeDur, Err: err})
	}
}

func (h *Handle) observeRenewalFailed(err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.RenewalFailed != nil {
		ob.RenewalFailed(observe.RenewalEvent{Context: &h.detached, Route: h.route, KeyHash: h.keyHash, Err: err})
	}
}

func (h *Handle) observeLeaseLost(cause observe.LeaseLostCause) {
	if ob := h.g.cfg.Observer; ob != nil && ob.LeaseLost != nil {
		ob.LeaseLost(observe.LeaseLostEvent{Context: &h.detached, Route: h.route, KeyHash: h.keyHash, Cause: cause})
	}
}

// observeStep reports how step ended.
func (h *Handle) observeStep(step string, r observe.StepResult, err error) {
	if h.g == nil {
		return
	}
	if ob := h.g.cfg.Observer; ob != nil && ob.Step != nil {
		ob.Step(observe.StepEvent{Context: &h.detached, Route: h.route, KeyHash: h.keyHash, Step: step, Result: r, Err: err})
	}
}

// storeCallStart returns the time a store call starts when there is an observer, and
// the zero time otherwise (no clock read).
func (h *Handle) storeCallStart() time.Time {
	if h.g.cfg.Observer != nil {
		return time.Now()
	}
	return time.Time{}
}

// observeStoreCall reports a store call that began at start (zero: not observed) and
// returns its duration.
func (h *Handle) observeStoreCall(op observe.StoreOp, start time.Time, err error) time.Duration {
	if start.IsZero() {
		return 0
	}
	d := time.Since(start)
	if ob := h.g.cfg.Observer; ob.StoreCall != nil {
		ob.StoreCall(observe.StoreCallEvent{Context: &h.detached, Route: h.route, Op: op, Duration: d, Err: err})
	}
	return d
}
