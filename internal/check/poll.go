package check

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

// sendUntilFinal sends r, and sends it again while the answer says that the key's
// first request is still running (request_in_progress, or an in-flight status with
// Retry-After), waiting as [env.pollWait] says, for at most the request timeout. It
// returns every exchange, the final one last.
func (e *env) sendUntilFinal(ctx context.Context, r request) []*Exchange {
	return e.sendWhile(ctx, r, e.inFlightRetry, e.cfg.Timeout)
}

// sendWhile sends r, and sends it again while again says so of the answer, for at
// most d, waiting as [env.pollWait] says in between.
func (e *env) sendWhile(ctx context.Context, r request, again func(*Exchange) bool, d time.Duration) []*Exchange {
	deadline := time.Now().Add(d)
	label := r.label
	var xs []*Exchange
	for attempt := 1; ; attempt++ {
		x := e.send(ctx, r)
		xs = append(xs, x)
		if !again(x) || !time.Now().Before(deadline) {
			return xs
		}
		wait := min(e.pollWait(x, attempt), max(time.Until(deadline), minPoll))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return xs
		case <-t.C:
		}
		r.label = fmt.Sprintf("%s (attempt %d, after an in-flight answer)", label, attempt+1)
	}
}

// pollWait is the wait before asking again after the attempt-th answer x said the key
// is in flight: its Retry-After in seconds, between 50 ms and PollMax; without one,
// PollInterval doubled for each attempt before, up to PollMax (100 ms, 200 ms, 400 ms
// … 2 s by default: a key held for 28 s costs about 20 requests, not 280).
func (e *env) pollWait(x *Exchange, attempt int) time.Duration {
	if x.Response != nil {
		if secs, err := strconv.Atoi(x.Response.Header.Get("Retry-After")); err == nil && secs >= 0 {
			return min(max(time.Duration(secs)*time.Second, minPoll), e.cfg.PollMax)
		}
	}
	wait := e.cfg.PollInterval
	for i := 1; i < attempt && wait < e.cfg.PollMax; i++ {
		wait *= 2
	}
	return min(wait, e.cfg.PollMax)
}

// inFlightRetry reports whether x asks for the same request later: 409
// request_in_progress, or an in-flight status with Retry-After and no other code.
func (e *env) inFlightRetry(x *Exchange) bool {
	if x.Response == nil {
		return false
	}
	if x.Response.Code == idem.CodeRequestInProgress {
		return true
	}
	return x.Response.Code == "" && x.retryAfter() && e.cfg.Profile.inFlight(x.status())
}

// knowReplays reports whether the endpoint answers a retry of a completed key with
// that key's first answer: what the replay check found, or, when it did not run
// (--only, --skip), what one retry of the first request gets, whose exchanges are
// then returned for the evidence of the check that asked.
func (e *env) knowReplays(ctx context.Context) (bool, []*Exchange) {
	if e.replayKnown {
		return e.replays, nil
	}
	xs := e.sendUntilFinal(ctx, request{label: "a retry of the first request (does the endpoint replay a completed key?)", body: e.body, keys: []string{e.fixtureKey}})
	e.setReplays(xs[len(xs)-1])
	return e.replays, xs
}

// setReplays records what a retry of the first request, on the first instance, got:
// a replay when its answer carries the first one's content (body, Location,
// resource), whatever its status; a new resource, unmarked, when the endpoint ran
// the retry again as if it ignored the key (the later checks are then skipped, with
// a hint).
func (e *env) setReplays(retry *Exchange) {
	e.replayKnown = true
	e.replays = carries(e.fixture, retry)
	if e.replays {
		return
	}
	e.noReplay = retry.describe()
	if retry.ok() {
		e.noReplay += " (" + identity(retry) + ", another resource)"
		if !retry.replayed() {
			e.naive = fmt.Sprintf("the endpoint ran a retry with the same %s again, as if it ignored the key: is --key-header %s the header it reads?", e.cfg.KeyHeader, e.cfg.KeyHeader)
		}
	}
}

// noReplayReason says, for a check that cannot judge, that the endpoint replays no
// completed key and what the retry of the first request got.
func (e *env) noReplayReason() string {
	return fmt.Sprintf("the endpoint replays no completed key (a retry of the first request got %s; see replay)", e.noReplay)
}
