package client

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Defaults of the [Budget] a [Transport] makes when it is given none.
const (
	// DefaultBudgetRatio is the fraction of extra load retries may add: each logical
	// request earns 0.1 retry.
	DefaultBudgetRatio = 0.1
	// DefaultBudgetFloor is the number of retries per second the budget grants even
	// when there is little traffic to earn them, so that a client making one request
	// a minute can still retry it.
	DefaultBudgetFloor = 1.0
	// DefaultBudgetBurst is the largest number of retries the budget can hold, and
	// what a new budget starts with.
	DefaultBudgetBurst = 10
)

// ErrBudgetExhausted is wrapped by the error of a request whose retry the [Budget]
// refused; the error's message names [Transport.Budget] and [NewBudget], which size
// it.
var ErrBudgetExhausted = errors.New("retry budget exhausted")

// Budget is a token bucket that limits the retries of every request that shares it
// (a client, or several). A budget starts with burst tokens and never holds more.
// Each first attempt of a logical request deposits ratio tokens; time deposits
// floorPerSecond tokens a second; each retry withdraws one, and is refused when less
// than one is left. So over any period retries are at most
// ratio·requests + floorPerSecond·seconds + burst.
//
// A [Transport] takes a token for the retry of a failure (a 5xx, a 429, a timeout) and
// of a broken connection after a request's first; waiting for a server that refuses
// connections, or for a key in progress (409 request_in_progress), takes none (see
// [Transport]: [Transport.MaxWait] bounds it). So a server restart spends at most one
// token per request in flight beyond the first retry each, and none while it is down.
//
// The http.Transport's own re-sends of a request (see [Transport]) take a token
// before they happen, as retries do, and do not happen when none is left. The few
// that net/http makes without asking (body-less requests idempotent by method, HTTP/2
// requests the server refused unprocessed) are charged once detected and may overdraw
// the bucket, which then refuses retries until deposits repay the debt.
//
// A Budget is safe for concurrent use.
type Budget struct {
	ratio, floor, burst float64
	now                 func() time.Time // injected by tests

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// NewBudget returns a full budget: retries may add ratio extra requests per logical
// request (0.1 is 10%), plus floorPerSecond retries a second, holding at most burst.
// It panics when an argument is negative or not a number.
func NewBudget(ratio, floorPerSecond float64, burst int) *Budget {
	return newBudget(ratio, floorPerSecond, burst, time.Now)
}

func newBudget(ratio, floorPerSecond float64, burst int, now func() time.Time) *Budget {
	switch {
	case !(ratio >= 0) || math.IsInf(ratio, 0):
		panic(fmt.Sprintf("client: NewBudget: ratio must be a non-negative number, got %v", ratio))
	case !(floorPerSecond >= 0) || math.IsInf(floorPerSecond, 0):
		panic(fmt.Sprintf("client: NewBudget: floorPerSecond must be a non-negative number, got %v", floorPerSecond))
	case burst < 0:
		panic(fmt.Sprintf("client: NewBudget: burst must not be negative, got %d", burst))
	}
	return &Budget{ratio: ratio, floor: floorPerSecond, burst: float64(burst), now: now,
		tokens: float64(burst), last: now()}
}

// Tokens returns the number of retries the budget would grant now (negative while it
// repays re-sends it could not cover).
func (b *Budget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	return b.tokens
}

// Deposit credits the first attempt of a logical request: call it once per logical
// request, before its first attempt. [Transport] does; so does the gRPC client
// interceptor of package grpcidem, which shares the budget's arithmetic.
func (b *Budget) Deposit() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	b.tokens = min(b.burst, b.tokens+b.ratio)
}

// Withdraw takes one token for a retry, and reports false, taking nothing, when the
// budget holds less than one: the retry must not happen.
func (b *Budget) Withdraw() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	if b.tokens < 1-tokenSlack {
		return false
	}
	b.tokens--
	return true
}

// charge takes n tokens for re-sends that already happened, overdrawing if need be.
func (b *Budget) charge(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	b.tokens -= float64(n)
}

// tokenSlack absorbs floating-point rounding, so that ten deposits of 0.1 earn a
// retry.
const tokenSlack = 1e-9

func (b *Budget) refillLocked() {
	now := b.now()
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(b.burst, b.tokens+b.floor*elapsed.Seconds())
		b.last = now
	}
}
