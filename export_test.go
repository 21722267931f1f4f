package idem

import (
	"slices"
	"sync"
	"time"
)

// ManualTicker drives the heartbeats of one Middleware by hand: every Tick fires
// exactly one armed heartbeat timer.
type ManualTicker struct {
	mu    sync.Mutex
	armed []*manualBeat
	ready chan struct{} // signalled when a timer is armed
}

type manualBeat struct {
	t     *ManualTicker
	f     func()
	armed bool
	d     time.Duration // as last armed
}

func (b *manualBeat) Reset(d time.Duration) bool {
	b.t.mu.Lock()
	defer b.t.mu.Unlock()
	b.d = d
	was := b.armed
	if !was {
		b.armed = true
		b.t.armed = append(b.t.armed, b)
		select {
		case b.t.ready <- struct{}{}:
		default:
		}
	}
	return was
}

func (b *manualBeat) Stop() bool {
	b.t.mu.Lock()
	defer b.t.mu.Unlock()
	was := b.armed
	if was {
		b.armed = false
		b.t.armed = slices.DeleteFunc(b.t.armed, func(o *manualBeat) bool { return o == b })
	}
	return was
}

// fire runs one armed timer's function, as time.AfterFunc would, and reports whether
// there was one.
func (t *ManualTicker) fire() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.armed) == 0 {
		return false
	}
	b := t.armed[0]
	t.armed = t.armed[1:]
	b.armed = false
	go b.f()
	return true
}

// Tick makes one heartbeat renew its lease; it blocks until one is armed.
func (t *ManualTicker) Tick() {
	for !t.fire() {
		<-t.ready
	}
}

// TryTick ticks only if a heartbeat is armed right now.
func (t *ManualTicker) TryTick() bool { return t.fire() }

// Armed waits until a timer is armed and returns the duration it was armed for.
func (t *ManualTicker) Armed() time.Duration {
	for {
		t.mu.Lock()
		if len(t.armed) > 0 {
			d := t.armed[0].d
			t.mu.Unlock()
			return d
		}
		t.mu.Unlock()
		<-t.ready
	}
}

func newManualTicker() (*ManualTicker, func(d time.Duration, f func()) beatTimer) {
	t := &ManualTicker{ready: make(chan struct{}, 1)}
	return t, func(d time.Duration, f func()) beatTimer {
		b := &manualBeat{t: t, f: f}
		b.Reset(d)
		return b
	}
}

// UseManualTicker replaces m's heartbeat timers with ones a ManualTicker fires.
func UseManualTicker(m *Middleware) *ManualTicker {
	t, newTimer := newManualTicker()
	m.g.newBeat = newTimer
	return t
}

// UseManualLeaseTimers replaces the timers of m's lease ends (the moment a handler
// whose renewals failed is cancelled) with ones a ManualTicker fires.
func UseManualLeaseTimers(m *Middleware) *ManualTicker {
	t, newTimer := newManualTicker()
	m.g.newLeaseTimer = newTimer
	return t
}

// OnRenew calls f after each lease renewal of m's heartbeats.
func OnRenew(m *Middleware, f func(err error)) { m.g.hooks.renewed = f }

// OnWait calls f when a duplicate starts waiting for an in-flight request.
func OnWait(m *Middleware, f func()) { m.g.hooks.waiting = f }

// OnCutOffWatched calls f when the background watch of a claim cut off by
// StoreTimeout ends, with whether it released the claim.
func OnCutOffWatched(m *Middleware, f func(released bool)) { m.g.hooks.cutOffWatched = f }

// CutOffWatches returns how many watches of cut-off claims m's guard runs now.
func CutOffWatches(m *Middleware) int { return len(m.g.cutOffs) }

// MaxCutOffWatches is maxCutOffWatches, for tests.
const MaxCutOffWatches = maxCutOffWatches

// ErrCaptureFrozen is errCaptureFrozen, for tests.
var ErrCaptureFrozen = errCaptureFrozen

// ReplayCacheLen returns how many entries m's replay cache holds (0 when off).
func ReplayCacheLen(m *Middleware) int {
	if m.g.cache == nil {
		return 0
	}
	return m.g.cache.len()
}

// EncodeResponse and DecodeResponse are what a sealed response holds, for tests.
var (
	EncodeResponse = encodeResponse
	DecodeResponse = decodeResponse
)

// StateValidity is how long a call may act on one read of the store's state.
const StateValidity = stateValidity
