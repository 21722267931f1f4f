package idem

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
)

// Bounds per principal (SPEC §19): one scope may have at most MaxInFlightPerScope
// keyed operations under way in a process, and store at most MaxStoredBytesPerScope
// bytes of results per QuotaWindow there; past either a new call is refused with a
// [*QuotaError] (the middleware answers 429 quota_exceeded with Retry-After) and
// nothing is claimed. They are per process: N processes sharing a store let a scope
// have N times as much.

// ErrQuotaExceeded: the call's scope reached a bound of [GuardConfig] (or [Config]):
// MaxInFlightPerScope or MaxStoredBytesPerScope. Nothing was claimed; retry after
// [QuotaError.RetryAfter]. Errors matching it are [*QuotaError]s.
var ErrQuotaExceeded = errors.New("idem: the scope's quota is exceeded")

// The bounds a [QuotaError] names.
const (
	// QuotaInFlight is MaxInFlightPerScope.
	QuotaInFlight = "in_flight"
	// QuotaStoredBytes is MaxStoredBytesPerScope.
	QuotaStoredBytes = "stored_bytes"
)

// QuotaError is the error of a call refused because its scope reached a bound. It
// matches [ErrQuotaExceeded].
type QuotaError struct {
	// Limit names the bound: [QuotaInFlight] or [QuotaStoredBytes].
	Limit string
	// RetryAfter is when the bound may let a call of the scope through: RetryAfter
	// of the config for the operations in flight, the rest of the window for the
	// stored bytes.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	return "idem: the scope's quota of " + e.Limit + " is exceeded; retry after " + e.RetryAfter.String()
}

// Is reports whether target is [ErrQuotaExceeded].
func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }

// quotas counts, per scope, the keyed operations under way and the bytes of results
// stored in the current window (a fixed window: the counts start again at every
// window's start, and scopes that stored nothing since are forgotten, so that memory
// stays bounded by the scopes that are active).
type quotas struct {
	maxInFlight int   // <= 0: none
	maxBytes    int64 // <= 0: none
	window      time.Duration
	retryIn     time.Duration

	mu          sync.Mutex
	inFlight    map[string]int
	windowStart time.Time
	stored      map[string]int64
}

func newQuotas(c GuardConfig) *quotas {
	q := &quotas{maxInFlight: c.MaxInFlightPerScope, maxBytes: c.MaxStoredBytesPerScope, window: c.QuotaWindow,
		retryIn: c.RetryAfter, inFlight: map[string]int{}, stored: map[string]int64{}}
	if q.maxInFlight <= 0 && q.maxBytes <= 0 {
		return nil
	}
	return q
}

// enter counts an operation of scope under way, or returns the bound that refuses
// it. over says that the scope stored its bytes' worth in this window: the operation
// is counted, but may only replay (Guard.admit).
func (q *quotas) enter(scope string, now time.Time) (over *QuotaError) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.maxInFlight > 0 && q.inFlight[scope] >= q.maxInFlight {
		return &QuotaError{Limit: QuotaInFlight, RetryAfter: q.retryIn}
	}
	q.inFlight[scope]++
	if q.maxBytes > 0 {
		q.roll(now)
		if q.stored[scope] >= q.maxBytes {
			return &QuotaError{Limit: QuotaStoredBytes, RetryAfter: q.windowStart.Add(q.window).Sub(now)}
		}
	}
	return nil
}

// leave ends an operation of scope that enter counted.
func (q *quotas) leave(scope string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := q.inFlight[scope] - 1; n > 0 {
		q.inFlight[scope] = n
	} else {
		delete(q.inFlight, scope)
	}
}

// store counts n bytes of a result of scope stored now.
func (q *quotas) store(scope string, n int64, now time.Time) {
	if q.maxBytes <= 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.roll(now)
	q.stored[scope] += n
}

// roll starts a new window when the current one ended. Called under mu.
func (q *quotas) roll(now time.Time) {
	if now.Sub(q.windowStart) < q.window && !now.Before(q.windowStart) {
		return
	}
	q.windowStart = now
	clear(q.stored)
}

// storedSize is what a result costs the quota of stored bytes: its body and its
// header fields.
func storedSize(resp *Response) int64 {
	if resp == nil {
		return 0
	}
	n := int64(len(resp.Body))
	for k, vs := range resp.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}

// admit counts h's call against its scope's bounds before its claim. It returns an
// answer instead when the call may not claim: a *QuotaError (logged and observed), or,
// when the scope stored its bytes' worth in this window, the key's completed record
// read from the store (a retry is still replayed, since a replay stores nothing). When
// it returns neither, the call claims as usual and h.leaveQuota must be called when it
// ends.
func (g *Guard) admit(ctx context.Context, h *Handle) (*Response, error) {
	q := g.quota
	if q == nil {
		return nil, nil
	}
	qerr := q.enter(h.scope, g.localNow())
	if qerr == nil {
		h.quotaEntered = true
		return nil, nil
	}
	if qerr.Limit == QuotaStoredBytes {
		h.quotaEntered = true
		defer h.leaveQuota()
		// Over the stored bytes: a key already completed is replayed all the same.
		res, found, err := h.lookup(ctx)
		if err == nil && h.refusedRecord != nil {
			err, h.refusedRecord = h.refusedRecord, nil
			return nil, h.transitionFailed(ctx, err, false, time.Now())
		}
		switch {
		case err != nil:
			h.observeClaim(observe.OutcomeStoreError, false, time.Now(), err)
			return nil, g.storeError(ctx, h, "lookup", err)
		case found && res != nil && res.Outcome == idemstore.ClaimCompleted:
			rec, err := h.open(ctx, res.Record)
			if err != nil {
				return nil, h.openFailed(ctx, err, false, false, time.Now())
			}
			g.cacheRecord(h, rec)
			h.observeClaim(replayOutcome(rec.Response, observe.OutcomeReplayed), false, time.Now(), nil)
			return replayOf(rec.Response)
		case found && res != nil:
			h.observeClaim(observe.OutcomeKeyReused, false, time.Now(), nil)
			return nil, ErrKeyReused
		}
	}
	h.observeClaim(observe.OutcomeQuotaExceeded, false, time.Now(), qerr)
	g.cfg.Logger.WarnContext(ctx, "idem: a scope reached its bound; refusing its new operations (429 quota_exceeded) until it frees up",
		h.attrs(slog.String("limit", qerr.Limit), slog.String("scope_hash", keyHash(h.scope, "")),
			slog.String("retry_after", strconv.FormatFloat(qerr.RetryAfter.Seconds(), 'f', 0, 64)+"s"))...)
	return nil, qerr
}

// leaveQuota ends the call's count against its scope's bounds, once.
func (h *Handle) leaveQuota() {
	if h.quotaEntered {
		h.quotaEntered = false
		h.g.quota.leave(h.scope)
	}
}

// storedQuota counts the bytes of a result h stored against its scope's bound.
func (h *Handle) storedQuota(resp *Response) {
	if q := h.g.quota; q != nil {
		q.store(h.scope, storedSize(resp), h.g.localNow())
	}
}
