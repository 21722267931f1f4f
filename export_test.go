package idem

import "time"

// ManualTicker drives the heartbeats of one Middleware by hand: every Tick is received
// by exactly one running heartbeat.
type ManualTicker struct{ ch chan time.Time }

func (t *ManualTicker) C() <-chan time.Time { return t.ch }
func (t *ManualTicker) Stop()               {}

// Tick makes one heartbeat renew its lease; it blocks until one receives it.
func (t *ManualTicker) Tick() { t.ch <- time.Time{} }

// UseManualTicker replaces m's heartbeat ticker with a ManualTicker.
func UseManualTicker(m *Middleware) *ManualTicker {
	t := &ManualTicker{ch: make(chan time.Time)}
	m.newTicker = func(time.Duration) ticker { return t }
	return t
}

// OnRenew calls f after each lease renewal of m's heartbeats.
func OnRenew(m *Middleware, f func(err error)) { m.hooks.renewed = f }

// OnWait calls f when a duplicate starts waiting for an in-flight request.
func OnWait(m *Middleware, f func()) { m.hooks.waiting = f }

// ErrCaptureFrozen is errCaptureFrozen, for tests.
var ErrCaptureFrozen = errCaptureFrozen

// TryTick ticks only if a heartbeat is waiting for a tick right now.
func (t *ManualTicker) TryTick() bool {
	select {
	case t.ch <- time.Time{}:
		return true
	default:
		return false
	}
}

// ReplayCacheLen returns how many entries m's replay cache holds (0 when off).
func ReplayCacheLen(m *Middleware) int {
	if m.cache == nil {
		return 0
	}
	return m.cache.len()
}
