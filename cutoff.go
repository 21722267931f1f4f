package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// Claims cut off by StoreTimeout (SPEC §9). A claim whose store call ran out of time
// answered the caller 503, but its request may still reach the store later: a healed
// partition, or a stalled connection, delivers it, and the claim then holds the key
// under a lease that nobody renews, so that every retry meets request_in_progress
// until that lease lapses (30 s by default). The guard watches such a claim in the
// background and releases it, fenced by its own token, if it lands: its token is
// random and was never given to anyone, so the release can only ever free the cut-off
// claim itself, and a claim that never landed just finds the key absent or someone
// else's.
//
// The watch is best effort and bounded: it never delays the request (it runs on a
// goroutine of its own), at most maxCutOffWatches run per guard at once (a claim cut
// off beyond that is left to its lease), and each ends at the cut-off claim's lease
// end at the latest, every store call under StoreTimeout.

// Bounds of the watch of cut-off claims.
const (
	// maxCutOffWatches bounds the watches of one guard running at once. During a long
	// outage every keyed request is cut off; the first ones are enough to cover a
	// healed partition's few late claims, and the rest are not worth the store calls.
	maxCutOffWatches = 16
	// The backoff between two looks at the key.
	cutOffPollMin = 100 * time.Millisecond
	cutOffPollMax = 2 * time.Second
)

// cutOff reports whether a claim that failed with err may have reached the store: its
// call ended because its context did (deadline or cancellation, callEnded) or because
// of a timeout the store's client reports (a read timeout).
func cutOff(err error, callEnded bool) bool {
	if err == nil {
		return false
	}
	var timeout interface{ Timeout() bool }
	return callEnded || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &timeout) && timeout.Timeout()
}

// watchCutOff starts the background watch of h's claim, which was cut off, unless
// maxCutOffWatches watches run already.
func (g *Guard) watchCutOff(h *Handle) {
	select {
	case g.cutOffs <- struct{}{}:
	default:
		g.cfg.Logger.DebugContext(&h.detached, "idem: a claim was cut off, and too many are watched already; "+
			"if it reaches the store, the key waits for its lease", h.attrs()...)
		return
	}
	w := cutOffWatch{
		g:     g,
		ctx:   context.WithoutCancel(h.detached.parent),
		p:     idemstore.ReleaseParams{Scope: h.scope, Key: h.key, Token: h.claim.Token},
		until: h.claimStartedReal.Add(g.cfg.Lease),
	}
	go w.run()
}

// cutOffWatch watches one cut-off claim.
type cutOffWatch struct {
	g     *Guard
	ctx   context.Context // the caller's values, never done
	p     idemstore.ReleaseParams
	until time.Time // the claim's lease end, by the host's clock: after it there is nothing to free
}

// run looks at the key with a backoff until the cut-off claim is released, or is
// known not to hold the key, or its lease ended.
func (w cutOffWatch) run() {
	released := false
	defer func() {
		<-w.g.cutOffs
		if w.g.hooks.cutOffWatched != nil {
			w.g.hooks.cutOffWatched(released)
		}
	}()
	for backoff := cutOffPollMin; ; backoff = min(2*backoff, cutOffPollMax) {
		left := time.Until(w.until)
		if left <= 0 {
			return
		}
		t := time.NewTimer(min(backoff, left))
		<-t.C
		var done bool
		if done, released = w.look(); done {
			return
		}
	}
}

// look reads the key once, and releases it when the cut-off claim holds it. done
// reports that there is nothing more to watch: released, or the key is someone
// else's (completed, or held under another token; the late claim could not take it
// now).
func (w cutOffWatch) look() (done, released bool) {
	g := w.g
	ctx, cancel := context.WithDeadline(w.ctx, callDeadline(g.cfg.StoreTimeout, w.until))
	defer cancel()
	rec, err := g.cfg.Store.RecordGet(ctx, &idemstore.GetParams{Scope: w.p.Scope, Key: w.p.Key, Now: g.storeNow()})
	switch {
	case err != nil:
		return false, false // absent (not landed yet, or never will), or the store is still away
	case rec.Token != w.p.Token:
		return true, false
	}
	p := w.p
	p.Now = g.storeNow()
	switch err := g.cfg.Store.RecordRelease(ctx, &p); {
	case err == nil:
		g.cfg.Logger.InfoContext(w.ctx, "idem: a claim cut off by the store timeout reached the store after all; released it, so that a retry need not wait for its lease",
			slog.String("key_hash", keyHash(w.p.Scope, w.p.Key)))
		return true, true
	case errors.Is(err, ErrLeaseLost):
		return true, false
	}
	return false, false
}
