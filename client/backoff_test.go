package client

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Retry-After is read in both its forms, delay-seconds and HTTP-date; anything else
// is ignored.
func TestRetryAfterParsesSecondsAndHTTPDate(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{"99999999999999999999", maxDuration, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"Monday, 30-Nov-26 12:00:05 GMT", 5 * time.Second, true}, // RFC 850
		{"Mon Nov 30 12:00:07 2026", 7 * time.Second, true},       // asctime
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},    // in the past: no wait
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"2026-11-30T12:00:05Z", 0, false},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// Exponential backoff with full jitter waits within [0, min(cap, base·2ⁿ)] for any
// base, cap, retry number and random draw.
func TestBackoffStaysWithinBounds(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		base := time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "base"))
		limit := time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "cap"))
		n := rapid.IntRange(-1, 200).Draw(t, "n")
		rnd := func(k int64) int64 {
			if k <= 0 {
				t.Fatalf("rnd(%d): the bound of a draw must be positive", k)
			}
			return rapid.Int64Range(0, k-1).Draw(t, "draw")
		}
		bound := math.Min(float64(limit), math.Ldexp(float64(base), max(n, 0)))
		for _, b := range []Backoff{ExponentialBackoff(base, limit, rnd), ExponentialBackoff(base, limit, nil)} {
			if d := b(n, nil); d < 0 || float64(d) > bound {
				t.Fatalf("backoff(%d) with base %v, cap %v = %v, want within [0, %v]", n, base, limit, d, time.Duration(bound))
			}
		}
		if d := DefaultBackoff(n, nil); d < 0 || d > min(DefaultBackoffCap, backoffBound(DefaultBackoffBase, DefaultBackoffCap, n)) {
			t.Fatalf("DefaultBackoff(%d) = %v", n, d)
		}
	})
}

// The bound grows as base·2ⁿ until it reaches the cap, and never overflows.
func TestBackoffBoundDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	base, limit := 100*time.Millisecond, 5*time.Second
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second}
	for n, w := range want {
		if got := backoffBound(base, limit, n); got != w {
			t.Errorf("bound(%d) = %v, want %v", n, got, w)
		}
	}
	if got := backoffBound(time.Duration(math.MaxInt64), time.Duration(math.MaxInt64), 1000); got != time.Duration(math.MaxInt64) {
		t.Errorf("huge bound = %v", got)
	}
}

// Pacing waits what the server asked for, capped, or else the backoff, and refuses a
// wait that would end after the context's deadline.
func TestPacingDelayTakesTheHintCappedOrTheBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fixed := Backoff(func(n int, _ *http.Response) time.Duration { return time.Duration(n+1) * time.Millisecond })
	p := Pacing{Backoff: fixed, MaxRetryAfter: 2 * time.Second}
	for _, tc := range []struct {
		n      int
		hint   time.Duration
		hinted bool
		want   time.Duration
	}{
		{0, 0, false, time.Millisecond},
		{2, 0, false, 3 * time.Millisecond},
		{2, 0, true, 0},
		{0, time.Second, true, time.Second},
		{0, time.Hour, true, 2 * time.Second},
	} {
		if got, err := p.Delay(ctx, tc.n, nil, tc.hint, tc.hinted); got != tc.want || err != nil {
			t.Errorf("Delay(n=%d, hint=%v, %v) = %v, %v; want %v", tc.n, tc.hint, tc.hinted, got, err, tc.want)
		}
	}
	if got, _ := (Pacing{}).Delay(ctx, 0, nil, time.Hour, true); got != DefaultMaxRetryAfter {
		t.Errorf("zero Pacing capped a one-hour hint at %v, want DefaultMaxRetryAfter", got)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := p.Delay(short, 0, nil, 2*time.Second, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a wait past the deadline: %v, want context.DeadlineExceeded", err)
	}
}
