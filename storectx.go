package idem

import (
	"context"
	"sync"
	"time"
)

// The contexts of store calls (SPEC §9, bounded time). Every call made before the work
// runs (the claim, the polls of an in-flight wait) ends at a deadline StoreTimeout
// away; the completion and the release after the work are bounded by the lease and
// outlive the caller's cancellation.

// callCtx is context.WithDeadline(parent, deadline) for one store call, made without
// an allocation: it lives in the request, and the channel, timer and link to the
// parent that Done needs are made only when a store asks for Done (the in-memory store
// never does; a network store's allocations dwarf them). Err reads the clock while
// Done was never asked for, which is what a timer would have told it.
//
// A callCtx serves one call: once the call returned, stop it and never reuse it, as a
// store may keep watching the channel it was given for a moment.
type callCtx struct {
	parent   context.Context
	deadline time.Time

	mu         sync.Mutex
	ended      callEnd       // set when done is closed
	done       chan struct{} // made by the first Done
	timer      *time.Timer
	stopParent func() bool
}

// callEnd is why a callCtx's channel closed: a byte rather than an error, so that the
// context, which lives in every request, stays small.
type callEnd uint8

const (
	callRunning  callEnd = iota
	callCanceled         // stopped after the call returned
	callTimedOut         // its own deadline passed
	callParent           // the parent ended: Err is the parent's
)

// start readies c for one call under parent, ending at deadline at the latest.
func (c *callCtx) start(parent context.Context, deadline time.Time) {
	c.parent, c.deadline = parent, deadline
}

func (c *callCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if end := c.endNow(); end != callRunning {
		c.closeLocked(end)
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.cancel(callTimedOut) })
	if c.parent.Done() != nil {
		c.stopParent = context.AfterFunc(c.parent, func() { c.cancel(callParent) })
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := c.ended
	if c.done == nil {
		end = c.endNow()
	}
	switch end {
	case callCanceled:
		return context.Canceled
	case callTimedOut:
		return context.DeadlineExceeded
	case callParent:
		return c.parent.Err() // once set, a context's Err never changes
	}
	return nil
}

// endNow is how the context has ended at this moment, before anyone watches Done.
func (c *callCtx) endNow() callEnd {
	if c.parent.Err() != nil {
		return callParent
	}
	if !time.Now().Before(c.deadline) {
		return callTimedOut
	}
	return callRunning
}

func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

func (c *callCtx) String() string { return "idem.storeCall" }

func (c *callCtx) cancel(end callEnd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended == callRunning {
		c.closeLocked(end)
	}
}

func (c *callCtx) closeLocked(end callEnd) {
	c.ended = end
	close(c.done)
}

// stop releases the timer and the link to the parent once the call returned.
func (c *callCtx) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.stopParent != nil {
		c.stopParent()
	}
	if c.done != nil && c.ended == callRunning {
		c.closeLocked(callCanceled)
	}
}

// detachedCtx is context.WithoutCancel(parent): its values, never done. It lives in
// the request, so that detaching costs no allocation.
type detachedCtx struct{ parent context.Context }

func (*detachedCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedCtx) Done() <-chan struct{}       { return nil }
func (*detachedCtx) Err() error                  { return nil }
func (c *detachedCtx) Value(key any) any         { return c.parent.Value(key) }
func (c *detachedCtx) String() string            { return "idem.detached" }
