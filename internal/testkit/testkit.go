// Package testkit holds the small synchronisation helpers that tests across the
// module share: a settable clock to inject as Config.Clock, gates that hold a handler
// until the test lets it go, and a buffer that concurrent loggers may write to. Tests
// use them instead of sleeping.
package testkit

import (
	"strings"
	"sync"
	"time"
)

// Clock is a time that only moves when the test says so; its Now is safe for
// concurrent use (pass it as idem.Config.Clock).
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Gate holds one named handler: Entered is closed when the handler reaches the gate,
// and the handler goes on once the test closes Proceed.
type Gate struct{ Entered, Proceed chan struct{} }

// Gates are gates by name, set by the test and passed by handlers.
type Gates struct {
	mu    sync.Mutex
	gates map[string]Gate
}

// Add sets a gate for the handler that will pass name.
func (g *Gates) Add(name string) Gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates == nil {
		g.gates = map[string]Gate{}
	}
	gate := Gate{Entered: make(chan struct{}), Proceed: make(chan struct{})}
	g.gates[name] = gate
	return gate
}

// Pass is called by a handler named name: when the test set a gate for it, it
// signals Entered and waits for Proceed; otherwise it returns at once.
func (g *Gates) Pass(name string) {
	g.mu.Lock()
	gate, ok := g.gates[name]
	g.mu.Unlock()
	if ok {
		close(gate.Entered)
		<-gate.Proceed
	}
}

// Buffer is a strings.Builder that concurrent writers (log handlers) may share.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
