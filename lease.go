package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
)

// beatTimer is the part of the *time.Timer of time.AfterFunc that the heartbeat uses;
// tests replace it with one they fire by hand.
type beatTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

func newRealBeat(d time.Duration, f func()) beatTimer { return time.AfterFunc(d, f) }

// heartbeat renews the lease of one claim while its operation runs (SPEC §5, Lease).
// When a renewal finds the token gone, or the lease reaches its end (less a margin,
// [leaseMargin]) without a renewal having succeeded, it cancels the operation's
// context with cause [ErrLeaseLost] and stops, so that the operation never runs on
// beside a caller that took its key over. Each renewal's context ends at that moment
// too.
//
// It is two timers rather than a goroutine with a ticker: the beat, armed for
// Config.Heartbeat and re-armed after each renewal, and the lease's end, armed at the
// first beat (or at once, when the heartbeat is not shorter than the lease less the
// margin) and pushed back by each renewal that succeeds. Most operations finish long
// before the first beat, and then the heartbeat cost one timer.
type heartbeat struct {
	run heartbeatRun

	mu       sync.Mutex
	stopped  bool
	timer    beatTimer // the next renewal
	leaseEnd beatTimer // the lease's end less the margin; nil until armed
	// ctx is the renewals' context, made at the first beat. abort cancels a renewal
	// in progress when the heartbeat stops: the completion that follows must not wait
	// for it (a SQLite renewal may be queued behind the very transaction that is
	// about to complete the record).
	ctx     context.Context
	abort   context.CancelFunc
	running sync.WaitGroup // a renewal in progress
	// finished is set by stopAndWait: the operation ended, and a renewal under way
	// is called off for that reason, not because the lease was lost.
	finished bool
}

// heartbeatRun is what one heartbeat needs.
type heartbeatRun struct {
	h *Handle
	// ttl is the record's TTL, as Handle.SetTTL may change it; guarded by the
	// heartbeat's mu.
	ttl time.Duration
	// deadline is when the lease ends at the latest, by the middleware's clock: the
	// lease counted from a moment before the claim (or the last renewal) started, so
	// that it never overestimates what the store granted. realDeadline is the same
	// moment by the host's clock, which bounds the renewals' contexts; the two differ
	// only when tests inject a clock. Both are guarded by the heartbeat's mu.
	deadline     time.Time
	realDeadline time.Time
	cancel       context.CancelCauseFunc
}

// startHeartbeat arms hb, whose run is set: its first beat, and the end of the lease
// granted at the claim unless the first beat comes before it.
func (g *Guard) startHeartbeat(hb *heartbeat) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.timer = g.newBeat(g.cfg.Heartbeat, hb.beat)
	if g.cfg.Heartbeat >= hb.run.cutoff().Sub(g.localNow()) {
		hb.armLeaseEnd()
	}
}

// armLeaseEnd arms the timer of the lease's end, or re-arms it after a renewal. When
// the end has passed already (a beat that came late), no timer is armed: the renewal
// under way decides, and its failure cancels the operation. The caller holds mu.
func (hb *heartbeat) armLeaseEnd() {
	g := hb.run.h.g
	left := hb.run.cutoff().Sub(g.localNow())
	switch {
	case left <= 0:
	case hb.leaseEnd == nil:
		hb.leaseEnd = g.newLeaseTimer(left, hb.leaseEnds)
	default:
		hb.leaseEnd.Reset(left)
	}
}

// cutoff is when the operation is cancelled unless a renewal succeeds first: the
// lease's end less the margin. The caller holds the heartbeat's mu (or owns it).
func (run *heartbeatRun) cutoff() time.Time {
	return run.deadline.Add(-leaseMargin(run.h.g.cfg.Lease))
}

// leaseEnds runs when the lease reaches its end less the margin: unless a renewal
// pushed the end back meanwhile, it stops the heartbeat, calls off a renewal in
// progress and cancels the operation with cause ErrLeaseLost.
func (hb *heartbeat) leaseEnds() {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return
	}
	h := hb.run.h
	if left := hb.run.cutoff().Sub(h.g.localNow()); left > 0 {
		hb.leaseEnd.Reset(left) // a renewal succeeded meanwhile
		return
	}
	h.g.cfg.Logger.ErrorContext(&h.detached, "idem: the lease ends without a successful renewal; cancelling the operation",
		h.attrs()...)
	hb.loseLocked(observe.LeaseExpired)
}

// loseLocked stops the heartbeat, calls off a renewal in progress and cancels the
// operation with cause ErrLeaseLost, once. The caller holds mu.
func (hb *heartbeat) loseLocked(cause observe.LeaseLostCause) {
	if hb.stopped {
		return
	}
	hb.stopped = true
	hb.timer.Stop()
	if hb.leaseEnd != nil {
		hb.leaseEnd.Stop()
	}
	hb.run.cancel(ErrLeaseLost)
	hb.run.h.observeLeaseLost(cause)
	if hb.abort != nil {
		hb.abort()
	}
}

// lose is loseLocked for a caller that does not hold mu.
func (hb *heartbeat) lose(cause observe.LeaseLostCause) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.loseLocked(cause)
}

// beat renews the lease once, then re-arms the timer unless the heartbeat is over.
func (hb *heartbeat) beat() {
	hb.mu.Lock()
	if hb.stopped {
		hb.mu.Unlock()
		return
	}
	if hb.ctx == nil {
		// The renewals must go on when the caller goes away and the operation keeps
		// working, so they do not inherit the caller's cancellation.
		hb.ctx, hb.abort = context.WithCancel(&hb.run.h.detached)
	}
	if hb.leaseEnd == nil {
		hb.armLeaseEnd()
	}
	ctx := hb.ctx
	hb.running.Add(1) // before stopAndWait's Wait: stopped is set under mu
	hb.mu.Unlock()
	defer hb.running.Done()

	if !hb.run.renew(ctx, hb) {
		return
	}
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if !hb.stopped {
		hb.timer.Reset(hb.run.h.g.cfg.Heartbeat)
	}
}

func (hb *heartbeat) isFinished() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.finished
}

func (hb *heartbeat) isStopped() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.stopped
}

// renew renews the lease once and reports whether the heartbeat goes on. A renewal
// that ends after the heartbeat was stopped changes nothing: the record is being
// completed or released, and the operation must not be cancelled for it.
func (run *heartbeatRun) renew(ctx context.Context, hb *heartbeat) bool {
	g := run.h.g
	started, realStarted := g.localNow(), time.Now()
	// The renewal ends at the next beat, or at the lease's end less the margin when
	// that is sooner: a renewal that answers later cannot save the operation.
	hb.mu.Lock()
	h := run.h
	p := idemstore.RenewParams{Scope: h.scope, Key: h.key, Token: h.claim.Token, Lease: g.cfg.Lease, TTL: run.ttl, Now: g.storeNow()}
	end := run.realDeadline.Add(-leaseMargin(g.cfg.Lease))
	hb.mu.Unlock()
	if next := realStarted.Add(g.cfg.Heartbeat); next.Before(end) {
		end = next
	}
	callCtx, cancel := context.WithDeadline(ctx, end)
	callStart := run.h.storeCallStart()
	_, err := g.cfg.Store.RecordRenew(callCtx, &p)
	cancel()
	if err != nil && ctx.Err() != nil && hb.isFinished() {
		// Called off: the operation ended (its completion or release stopped the
		// heartbeat) while the renewal was under way. That is not the store failing,
		// and an observer must not count it as an error. (A renewal called off by the
		// lease's end is one: the store did not answer in time.)
		if g.hooks.renewed != nil {
			g.hooks.renewed(err)
		}
		return false
	}
	run.h.observeStoreCall(observe.StoreOpRenew, callStart, err)
	if g.hooks.renewed != nil {
		defer g.hooks.renewed(err)
	}
	if err == nil {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		if hb.stopped {
			return false
		}
		run.deadline, run.realDeadline = started.Add(g.cfg.Lease), realStarted.Add(g.cfg.Lease)
		hb.armLeaseEnd()
		return true
	}
	if hb.isStopped() {
		return false
	}
	run.h.observeRenewalFailed(err)
	hb.mu.Lock()
	cutoff := run.cutoff()
	hb.mu.Unlock()
	switch {
	case errors.Is(err, ErrLeaseLost):
		g.cfg.Logger.WarnContext(ctx, "idem: lease lost while the operation runs; cancelling it", run.h.attrs()...)
		hb.lose(observe.LeaseTakenOver)
		return false
	case !g.localNow().Before(cutoff):
		g.cfg.Logger.ErrorContext(ctx, "idem: lease ran out while renewals failed; cancelling the operation",
			run.h.attrs(slog.Any("error", err))...)
		hb.lose(observe.LeaseExpired)
		return false
	default:
		g.cfg.Logger.WarnContext(ctx, "idem: lease renewal failed; retrying at the next beat",
			run.h.attrs(slog.Any("error", err))...)
		return true
	}
}

// stopAndWait stops the heartbeat and waits until a renewal in progress has ended, so
// that no renewal races the completion or release that follows. Safe to call more
// than once.
func (hb *heartbeat) stopAndWait() {
	hb.mu.Lock()
	if !hb.stopped {
		hb.stopped, hb.finished = true, true
		hb.timer.Stop()
		if hb.leaseEnd != nil {
			hb.leaseEnd.Stop()
		}
		if hb.abort != nil {
			hb.abort()
		}
	}
	hb.mu.Unlock()
	hb.running.Wait()
}
