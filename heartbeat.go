package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// ticker is the part of *time.Ticker the heartbeat uses; tests replace it with one
// they drive by hand.
type ticker interface {
	C() <-chan time.Time
	Stop()
}

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

func newRealTicker(d time.Duration) ticker { return realTicker{time.NewTicker(d)} }

// heartbeat renews the lease of one claim while its handler runs (SPEC §5, Lease).
// When a renewal finds the token gone, or renewals keep failing until the lease has
// run out, it cancels the handler's context with cause [ErrLeaseLost] and exits.
type heartbeat struct {
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
	// abort cancels a renewal in progress when the heartbeat stops: the completion
	// that follows must not wait for it (a SQLite renewal may be queued behind the
	// very transaction that is about to complete the record).
	abort context.CancelFunc
}

// heartbeatRun is what one heartbeat needs.
type heartbeatRun struct {
	m      *Middleware
	params RecordRenewParams
	// deadline is when the lease ends at the latest, by the middleware's clock: the
	// lease counted from a moment before the claim (or the last renewal) started, so
	// that it never overestimates what the store granted.
	deadline time.Time
	cancel   context.CancelCauseFunc
	logAttrs []any
}

func (m *Middleware) startHeartbeat(ctx context.Context, run *heartbeatRun) *heartbeat {
	// The renewals must go on when the client goes away and the handler keeps working,
	// so they do not inherit the request's cancellation.
	ctx, abort := context.WithCancel(context.WithoutCancel(ctx))
	hb := &heartbeat{stop: make(chan struct{}), done: make(chan struct{}), abort: abort}
	t := m.newTicker(m.cfg.Heartbeat)
	go func() {
		defer close(hb.done)
		defer t.Stop()
		for {
			select {
			case <-hb.stop:
				return
			case <-t.C():
			}
			if !run.renew(ctx, hb.stop) {
				return
			}
		}
	}()
	return hb
}

// renew renews the lease once and reports whether the heartbeat goes on. A renewal
// that ends after the heartbeat was stopped changes nothing: the record is being
// completed or released, and the handler must not be cancelled for it.
func (run *heartbeatRun) renew(ctx context.Context, stop <-chan struct{}) bool {
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
	select {
	case <-stop:
		return false
	default:
	}
	switch {
	case err == nil:
		run.deadline = started.Add(m.cfg.Lease)
		return true
	case errors.Is(err, ErrLeaseLost):
		m.cfg.Logger.WarnContext(ctx, "idem: lease lost while the handler runs; cancelling it", run.logAttrs...)
		run.cancel(ErrLeaseLost)
		return false
	case !m.localNow().Before(run.deadline):
		m.cfg.Logger.ErrorContext(ctx, "idem: lease ran out while renewals failed; cancelling the handler",
			append(run.logAttrs, slog.Any("error", err))...)
		run.cancel(ErrLeaseLost)
		return false
	default:
		m.cfg.Logger.WarnContext(ctx, "idem: lease renewal failed; retrying at the next beat",
			append(run.logAttrs, slog.Any("error", err))...)
		return true
	}
}

// stopAndWait stops the heartbeat and waits until it has exited, so that no renewal
// races the completion or release that follows. Safe to call more than once.
func (hb *heartbeat) stopAndWait() {
	hb.stopOnce.Do(func() {
		close(hb.stop)
		hb.abort()
	})
	<-hb.done
}
