package client

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Defaults of the backoff and of Retry-After.
const (
	// DefaultBackoffBase is the bound of the first wait of [DefaultBackoff].
	DefaultBackoffBase = 100 * time.Millisecond
	// DefaultBackoffCap is the largest wait of [DefaultBackoff].
	DefaultBackoffCap = 5 * time.Second
	// DefaultMaxRetryAfter caps the wait a server can ask for with Retry-After.
	DefaultMaxRetryAfter = 30 * time.Second
)

// Backoff returns how long to wait before the next attempt when the server sent no
// Retry-After. n is the number of retries made so far (0 before the first retry);
// resp is the response that is being retried, or nil after a connection error.
type Backoff func(n int, resp *http.Response) time.Duration

// DefaultBackoff is [ExponentialBackoff] with base [DefaultBackoffBase] and cap
// [DefaultBackoffCap]: a uniformly random wait in [0, min(5s, 100ms·2ⁿ)].
func DefaultBackoff(n int, resp *http.Response) time.Duration {
	return defaultBackoff(n, resp)
}

var defaultBackoff = ExponentialBackoff(DefaultBackoffBase, DefaultBackoffCap, nil)

// ExponentialBackoff returns an exponential backoff with full jitter: before retry n
// (from 0) it waits a uniformly random duration in [0, min(limit, base·2ⁿ)], so that
// clients that failed together do not retry together. rnd(k) must return a uniform
// integer in [0, k); nil means math/rand/v2's Int64N. It panics when base or limit
// is negative.
func ExponentialBackoff(base, limit time.Duration, rnd func(k int64) int64) Backoff {
	if base < 0 || limit < 0 {
		panic("client: ExponentialBackoff: base and limit must not be negative")
	}
	if rnd == nil {
		rnd = rand.Int64N
	}
	return func(n int, _ *http.Response) time.Duration {
		d := backoffBound(base, limit, n)
		if d <= 0 {
			return 0
		}
		return time.Duration(rnd(int64(d) + 1))
	}
}

// backoffBound is min(limit, base·2ⁿ), without overflowing.
func backoffBound(base, limit time.Duration, n int) time.Duration {
	if n < 0 {
		n = 0
	}
	if base == 0 {
		return 0
	}
	if n >= 62 || base > limit>>n {
		return limit
	}
	return min(limit, base<<n)
}

// Pacing is how a logical request waits between its attempts: what the server asked
// for, capped, or else a backoff. [Transport] paces its retries with one, and so does
// the gRPC client interceptor of package grpcidem, so that both wait alike. The zero
// value uses the defaults.
type Pacing struct {
	// Backoff is the wait before a retry when the server asked for none. Defaults to
	// [DefaultBackoff].
	Backoff Backoff
	// MaxRetryAfter caps the wait a server can ask for. Defaults to
	// [DefaultMaxRetryAfter] when 0.
	MaxRetryAfter time.Duration
}

// Delay returns the wait before retry n (from 0) of a logical request whose last
// attempt produced resp (nil after a connection error, and outside HTTP): hint, capped
// at MaxRetryAfter, when the server asked for a wait (hinted: HTTP's Retry-After,
// gRPC's RetryInfo), and Backoff(n, resp) otherwise. It returns an error wrapping
// [context.DeadlineExceeded] when the wait would end after ctx's deadline, since the
// next attempt could not start in time.
func (p Pacing) Delay(ctx context.Context, n int, resp *http.Response, hint time.Duration, hinted bool) (time.Duration, error) {
	d := hint
	switch {
	case hinted && p.MaxRetryAfter > 0:
		d = min(d, p.MaxRetryAfter)
	case hinted:
		d = min(d, DefaultMaxRetryAfter)
	case p.Backoff != nil:
		d = p.Backoff(n, resp)
	default:
		d = DefaultBackoff(n, resp)
	}
	return d, deadlineAllows(ctx, d)
}

// Sleep waits d before the next attempt, or until ctx ends and then returns its cause.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// retryAfter returns the wait a response asks for with Retry-After, in either of its
// forms (RFC 9110 §10.2.3): delay-seconds or an HTTP-date, measured from now. A date
// in the past means no wait. ok is false when the header is absent or malformed.
func retryAfter(resp *http.Response, now time.Time) (d time.Duration, ok bool) {
	if resp == nil {
		return 0, false
	}
	return parseRetryAfter(resp.Header.Get("Retry-After"), now)
}

func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				return maxDuration, true
			}
			return 0, false
		}
		if secs > uint64(maxDuration/time.Second) {
			return maxDuration, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(now)), true
}

const maxDuration = time.Duration(1<<63 - 1)
