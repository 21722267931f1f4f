package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// beatTimer is the part of the *time.Timer of time.AfterFunc that the heartbeat uses;
// tests replace it with one they fire by hand.
type beatTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

func newRealBeat(d time.Duration, f func()) beatTimer { return time.AfterFunc(d, f) }

// heartbeat renews the lease of one claim while its handler runs (SPEC §5, Lease).
// When a renewal finds the token gone, or renewals keep failing until the lease has
// run out, it cancels the handler's context with cause [ErrLeaseLost] and stops.
//
// It is a timer armed for Config.Heartbeat and re-armed after each renewal, rather
// than a goroutine with a ticker: most handlers finish long before the first beat,
// and then the heartbeat cost one timer.
type heartbeat struct {
	run heartbeatRun

	mu      sync.Mutex
	stopped bool
	timer   beatTimer
	// ctx is the renewals' context, made at the first beat. abort cancels a renewal
	// in progress when the heartbeat stops: the completion that follows must not wait
	// for it (a SQLite renewal may be queued behind the very transaction that is
	// about to complete the record).
	ctx     context.Context
	abort   context.CancelFunc
	running sync.WaitGroup // a renewal in progress
}

// heartbeatRun is what one heartbeat needs.
type heartbeatRun struct {
	m      *Middleware
	x      *request // for log attributes
	params RecordRenewParams
	// deadline is when the lease ends at the latest, by the middleware's clock: the
	// lease counted from a moment before the claim (or the last renewal) started, so
	// that it never overestimates what the store granted.
	deadline time.Time
	cancel   context.CancelCauseFunc
}

// startHeartbeat arms hb, whose run is set.
func (m *Middleware) startHeartbeat(hb *heartbeat) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.timer = m.newBeat(m.cfg.Heartbeat, hb.beat)
}

// beat renews the lease once, then re-arms the timer unless the heartbeat is over.
func (hb *heartbeat) beat() {
	hb.mu.Lock()
	if hb.stopped {
		hb.mu.Unlock()
		return
	}
	if hb.ctx == nil {
		// The renewals must go on when the client goes away and the handler keeps
		// working, so they do not inherit the request's cancellation.
		hb.ctx, hb.abort = context.WithCancel(hb.run.x.detached())
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
		hb.timer.Reset(hb.run.m.cfg.Heartbeat)
	}
}

func (hb *heartbeat) isStopped() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.stopped
}

// renew renews the lease once and reports whether the heartbeat goes on. A renewal
// that ends after the heartbeat was stopped changes nothing: the record is being
// completed or released, and the handler must not be cancelled for it.
func (run *heartbeatRun) renew(ctx context.Context, hb *heartbeat) bool {
	m := run.m
	started := m.localNow()
	p := run.params
	p.Now = m.storeNow()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	_, err := m.cfg.Store.RecordRenew(ctx, &p)
	cancel()
	if m.hooks.renewed != nil {
		defer m.hooks.renewed(err)
	}
	if hb.isStopped() {
		return false
	}
	switch {
	case err == nil:
		run.deadline = started.Add(m.cfg.Lease)
		return true
	case errors.Is(err, ErrLeaseLost):
		m.cfg.Logger.WarnContext(ctx, "idem: lease lost while the handler runs; cancelling it", run.x.attrs()...)
		run.cancel(ErrLeaseLost)
		return false
	case !m.localNow().Before(run.deadline):
		m.cfg.Logger.ErrorContext(ctx, "idem: lease ran out while renewals failed; cancelling the handler",
			run.x.attrs(slog.Any("error", err))...)
		run.cancel(ErrLeaseLost)
		return false
	default:
		m.cfg.Logger.WarnContext(ctx, "idem: lease renewal failed; retrying at the next beat",
			run.x.attrs(slog.Any("error", err))...)
		return true
	}
}

// stopAndWait stops the heartbeat and waits until a renewal in progress has ended, so
// that no renewal races the completion or release that follows. Safe to call more
// than once.
func (hb *heartbeat) stopAndWait() {
	hb.mu.Lock()
	if !hb.stopped {
		hb.stopped = true
		hb.timer.Stop()
		if hb.abort != nil {
			hb.abort()
		}
	}
	hb.mu.Unlock()
	hb.running.Wait()
}
