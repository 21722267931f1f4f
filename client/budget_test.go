package client

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// For any sequence of first attempts, retries, re-sends and elapsed time, the budget
// never holds more than burst, a retry never leaves it negative, and what it grants
// (retries) and charges (re-sends) never exceeds ratio·requests + floor·elapsed +
// burst by more than the debt the re-sends left.
func TestBudgetArithmetic(t *testing.T) {
	t.Parallel()
	const eps = 1e-6
	rapid.Check(t, func(t *rapid.T) {
		ratio := rapid.Float64Range(0, 2).Draw(t, "ratio")
		floor := rapid.Float64Range(0, 10).Draw(t, "floor")
		burst := rapid.IntRange(0, 20).Draw(t, "burst")
		clock := newFrozenClock()
		b := newBudget(ratio, floor, burst, clock.Now)
		var requests, granted, charged int
		var elapsed time.Duration
		t.Repeat(map[string]func(*rapid.T){
			"first attempt": func(t *rapid.T) {
				b.Deposit()
				requests++
			},
			"retry": func(t *rapid.T) {
				before := b.Tokens()
				if b.Withdraw() {
					granted++
					if b.Tokens() < -eps {
						t.Fatalf("a granted retry left %v tokens", b.Tokens())
					}
				} else if before >= 1-tokenSlack {
					t.Fatalf("retry refused with %v tokens", before)
				}
			},
			"re-send": func(t *rapid.T) {
				n := rapid.IntRange(1, 3).Draw(t, "resends")
				b.charge(n)
				charged += n
			},
			"time passes": func(t *rapid.T) {
				d := time.Duration(rapid.Int64Range(0, int64(5*time.Second)).Draw(t, "elapsed"))
				clock.Advance(d)
				elapsed += d
			},
			"": func(t *rapid.T) {
				tokens := b.Tokens()
				if tokens > float64(burst)+eps {
					t.Fatalf("%v tokens, more than burst %d", tokens, burst)
				}
				if charged == 0 && tokens < -eps {
					t.Fatalf("%v tokens without any re-send", tokens)
				}
				limit := ratio*float64(requests) + floor*elapsed.Seconds() + float64(burst)
				if float64(granted+charged)+tokens > limit+eps {
					t.Fatalf("granted %d + charged %d + %v tokens left > %v (ratio %v·%d requests + floor %v·%v + burst %d)",
						granted, charged, tokens, limit, ratio, requests, floor, elapsed, burst)
				}
			},
		})
	})
}

// The defaults: a budget starts with burst tokens and earns the floor per second.
func TestBudgetRefillsAtFloorUpToBurst(t *testing.T) {
	t.Parallel()
	clock := newFrozenClock()
	b := newBudget(DefaultBudgetRatio, DefaultBudgetFloor, DefaultBudgetBurst, clock.Now)
	for range DefaultBudgetBurst {
		if !b.Withdraw() {
			t.Fatalf("a new budget refused one of its first %d retries", DefaultBudgetBurst)
		}
	}
	if b.Withdraw() {
		t.Fatal("an empty budget granted a retry")
	}
	clock.Advance(time.Second)
	if !b.Withdraw() || b.Withdraw() {
		t.Fatal("one second did not earn exactly one retry")
	}
	for range 10 {
		b.Deposit()
	}
	if !b.Withdraw() {
		t.Fatal("10 requests at ratio 0.1 did not earn a retry")
	}
	clock.Advance(time.Hour)
	if got := b.Tokens(); got != DefaultBudgetBurst {
		t.Fatalf("after an hour %v tokens, want burst %d", got, DefaultBudgetBurst)
	}
}
