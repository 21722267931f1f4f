package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/logsummary"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
)

// Guard runs operations at most once per (scope, key): the state machine of SPEC §5
// (claim, bounded in-flight wait, takeover of a lapsed lease, replay, mismatch, the
// lease and its heartbeat, fenced completion and release) without HTTP (SPEC §16). The
// [Middleware] is built on it, and so are [Do] and [DoTx] for plain functions; other
// adapters (a gRPC interceptor, a queue consumer) use [Guard.Begin].
//
// A Guard is safe for concurrent use. Build one with [NewGuard].
type Guard struct {
	cfg   GuardConfig // validated, defaults applied
	name  string      // of the config, for panics: "GuardConfig" or "Config"
	cache *replayCache

	// newBeat arms a heartbeat's timer (time.AfterFunc), and newLeaseTimer the timer
	// of a lease's end; tests fire them by hand.
	newBeat, newLeaseTimer func(d time.Duration, f func()) beatTimer
	// hooks signal tests; all nil in production.
	hooks testHooks

	// resumes are the resume functions of named operations and their TTLs, for
	// Completers.
	resumeMu sync.RWMutex
	resumes  map[string]resumer

	// cutOffs holds a token per running watch of a cut-off claim (cutoff.go).
	cutOffs chan struct{}

	// quota counts the calls and stored bytes of each scope (quota.go); nil without
	// bounds.
	quota *quotas

	// state is what the process knows of the store's state (storestate.go), shared
	// by its guards on the store, read again on the claim path when it is
	// StoreStateRefresh old.
	state *storeStateCache
}

// testHooks let tests wait on events instead of sleeping.
type testHooks struct {
	renewed       func(err error)     // after each lease renewal
	waiting       func()              // when a duplicate starts waiting for an in-flight request
	cutOffWatched func(released bool) // when the watch of a cut-off claim ends
}

// GuardConfig configures a [Guard]. Store is required; every other field has a
// default. [Config] holds the same fields for the middleware.
type GuardConfig struct {
	// Store keeps the records. Required.
	Store idemstore.Store

	// TTL is how long a record lives after its creation; a [Call] may override it. It
	// must be longer than Lease and at most [MaxTTL] (NewGuard panics otherwise): a record whose TTL ran out
	// before its operation finished would be completed already expired, and a repeat
	// would execute again. Defaults to [DefaultTTL].
	TTL time.Duration

	// Lease is how long a claim holds its key without renewal before another caller
	// may take it over. The work's context is cancelled with cause [ErrLeaseLost] at
	// the lease's end less a margin (Lease/10, at most [MaxLeaseMargin]) unless a
	// renewal succeeded by then. Defaults to [DefaultLease].
	Lease time.Duration

	// Heartbeat is how often the lease is renewed while the work runs; it must be
	// shorter than Lease. Defaults to Lease/3.
	Heartbeat time.Duration

	// InFlightWait is how long a repeat of an operation that is still executing waits
	// for it to finish, polling the store with a short backoff, before it gets
	// [ErrKeyInProgress]. The whole wait, store calls included, ends within
	// InFlightWait + StoreTimeout. Defaults to [DefaultInFlightWait] (0: no wait).
	InFlightWait time.Duration

	// StoreTimeout bounds each store call made before the work runs: the claim and
	// each poll of an in-flight wait. A call that does not answer in time fails with
	// [ErrStoreUnavailable]; a claim cut off that way that reaches the store later is
	// released in the background, so that a repeat need not wait for its lease.
	// Defaults to [DefaultStoreTimeout].
	StoreTimeout time.Duration

	// RetryAfter is the wait suggested to a caller that finds its key in progress
	// ([InProgressError.RetryAfter]). Defaults to [DefaultRetryAfter].
	RetryAfter time.Duration

	// ReplayCacheSize, when positive, keeps up to this many completed results in an
	// in-process cache, so that a repeat served from it costs no store call; see
	// [Config.ReplayCacheSize]. Defaults to [DefaultReplayCacheSize] (0, off).
	ReplayCacheSize int

	// Logger receives the guard's logs. Keys are logged as a short hash, never in
	// full; results are never logged. Repeated warnings and errors are summarised, one
	// line and a count per 10 s.
	// Defaults to [slog.Default].
	Logger *slog.Logger

	// Clock, when set, replaces the store's clock for every lease and expiry decision
	// (tests only; see [Config.Clock]). Defaults to nil: the store's clock decides.
	Clock func() time.Time

	// Observer is told of every claim's outcome, completion, release, failed renewal,
	// lost lease and store call (SPEC §15). Defaults to nil, which costs nothing.
	Observer *observe.Observer

	// MaxInFlightPerScope bounds the calls of one scope (principal) under way in this
	// process at once, from their claim to their end, waiting duplicates included:
	// past it a call gets a [*QuotaError] ([ErrQuotaExceeded]; the middleware answers
	// 429 quota_exceeded with Retry-After), and nothing is claimed (SPEC §19). It is
	// per process: N processes on one store let a scope have N times as many.
	// Negative: no bound. Defaults to [DefaultMaxInFlightPerScope].
	MaxInFlightPerScope int
	// MaxStoredBytesPerScope bounds the bytes of results (bodies and stored header
	// fields) one scope stores in this process per QuotaWindow: once its results of
	// the window reach it, its new calls get a [*QuotaError] until the window ends,
	// nothing claimed, while a repeat of a completed call is still replayed (one
	// primary-key read). Per process, like MaxInFlightPerScope. Negative: no bound.
	// Defaults to [DefaultMaxStoredBytesPerScope].
	MaxStoredBytesPerScope int64
	// QuotaWindow is the window of MaxStoredBytesPerScope: the counts start again at
	// each window's start. Defaults to [DefaultQuotaWindow].
	QuotaWindow time.Duration
	// Seal, when set, seals records (SPEC §19): the stored responses' status, headers
	// and body and the results steps save are sealed in the core, above the store,
	// bound to their record, and every fingerprint stored is keyed (an HMAC). A record
	// that cannot be opened fails closed with [ErrRecordUnreadable]. Make it with
	// [OpenKeyring] on the same store (NewGuard panics on a keyring without a MAC
	// secret). Defaults to nil: records are stored in clear.
	Seal *seal.Keyring
}

// NewGuard returns a Guard for cfg. It panics with a message naming the field when cfg
// is invalid (a programmer's mistake): "idem: GuardConfig.Store is required".
func NewGuard(cfg GuardConfig) *Guard { return newGuard(cfg, "GuardConfig") }

// newGuard validates c, whose fields are reported as name.Field, and applies defaults.
func newGuard(c GuardConfig, name string) *Guard {
	if c.Store == nil {
		panic("idem: " + name + ".Store is required")
	}
	nonNegative(name, "TTL", c.TTL)
	nonNegative(name, "Lease", c.Lease)
	nonNegative(name, "Heartbeat", c.Heartbeat)
	nonNegative(name, "RetryAfter", c.RetryAfter)
	nonNegative(name, "InFlightWait", c.InFlightWait)
	nonNegative(name, "StoreTimeout", c.StoreTimeout)
	if c.ReplayCacheSize < 0 {
		panic(fmt.Sprintf("idem: %s.ReplayCacheSize must not be negative, got %d", name, c.ReplayCacheSize))
	}
	nonNegative(name, "QuotaWindow", c.QuotaWindow)
	setDefault(&c.MaxInFlightPerScope, DefaultMaxInFlightPerScope)
	setDefault(&c.MaxStoredBytesPerScope, DefaultMaxStoredBytesPerScope)
	setDefault(&c.QuotaWindow, DefaultQuotaWindow)
	setDefault(&c.TTL, DefaultTTL)
	setDefault(&c.Lease, DefaultLease)
	setDefault(&c.Heartbeat, c.Lease/3)
	setDefault(&c.RetryAfter, DefaultRetryAfter)
	setDefault(&c.StoreTimeout, DefaultStoreTimeout)
	if c.Heartbeat >= c.Lease {
		panic(fmt.Sprintf("idem: %s.Heartbeat (%v) must be shorter than %s.Lease (%v)", name, c.Heartbeat, name, c.Lease))
	}
	checkTTL(name+".TTL", c.TTL, name, c.Lease)
	if c.Seal != nil && !c.Seal.Keyed() {
		panic("idem: " + name + ".Seal keys no fingerprint (it was made without a MAC secret): make it with idem.OpenKeyring on the store")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// Under an outage every call fails alike: one line per failure and interval.
	c.Logger = slog.New(logsummary.New(c.Logger.Handler(), 0))
	g := &Guard{cfg: c, name: name, newBeat: newRealBeat, newLeaseTimer: newRealBeat,
		cutOffs: make(chan struct{}, maxCutOffWatches)}
	if c.ReplayCacheSize > 0 {
		g.cache = newReplayCache(c.ReplayCacheSize)
	}
	g.quota = newQuotas(c)
	g.state = stateCacheFor(c.Store, c.Clock != nil)
	return g
}

// checkTTL panics unless ttl is a valid TTL (ttlError).
func checkTTL(field string, ttl time.Duration, cfgName string, lease time.Duration) {
	if err := ttlError(field, ttl, cfgName, lease); err != nil {
		panic(err.Error())
	}
}

// ttlError reports why ttl, the value of field, is not a TTL: it must outlive lease (a
// record that expires before its lease can end would be completed already expired,
// and its retry would execute again) and be at most MaxTTL (what every store
// represents).
func ttlError(field string, ttl time.Duration, cfgName string, lease time.Duration) error {
	switch {
	case ttl <= lease:
		return fmt.Errorf("idem: %s (%v) must be longer than %s.Lease (%v): a record completed after its TTL is expired at birth, and a retry executes again", field, ttl, cfgName, lease)
	case ttl > MaxTTL:
		return fmt.Errorf("idem: %s (%v) is longer than idem.MaxTTL (%v, about 100 years), the longest expiry every store represents; use MaxTTL for records that must outlive everything", field, ttl, MaxTTL)
	}
	return nil
}

// CheckTTL reports whether calls of g may use ttl as their [Call.TTL]: zero (the
// guard's TTL), or longer than the guard's lease and at most [MaxTTL]. [Guard.Begin]
// panics on such a TTL; an adapter that takes a TTL in its own configuration (a
// queue consumer's) checks it with CheckTTL when it is built.
func (g *Guard) CheckTTL(ttl time.Duration) error {
	if ttl == 0 {
		return nil
	}
	if ttl < 0 {
		return fmt.Errorf("idem: a TTL must not be negative, got %v", ttl)
	}
	return ttlError("the TTL", ttl, g.name, g.cfg.Lease)
}

// leaseMargin is how long before its lease ends a holder stops: Lease/10, at most
// MaxLeaseMargin. It covers the timer's lateness, the cancellation reaching the work,
// and a bounded skew between this host's clock and the store's.
func leaseMargin(lease time.Duration) time.Duration { return min(lease/10, MaxLeaseMargin) }

func nonNegative(name, field string, d time.Duration) {
	if d < 0 {
		panic(fmt.Sprintf("idem: %s.%s must not be negative, got %v", name, field, d))
	}
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Call is one operation for [Guard.Begin]: the key it runs under and the fingerprint
// of its input.
type Call struct {
	// Scope is the principal the key belongs to (SPEC §3): nothing of one scope is
	// ever replayed to another. Required.
	Scope string
	// Key is the idempotency key. Required.
	Key string
	// Fingerprint identifies the operation's input; a repeat with another fingerprint
	// gets [ErrKeyReused]. Use [FingerprintInput] or [FingerprintJSON] for a
	// function's input, [FingerprintRequest] for an HTTP request.
	Fingerprint Fingerprint
	// TTL overrides GuardConfig.TTL for this record; like it, it must be longer than
	// the lease and at most [MaxTTL] ([Guard.CheckTTL]). Defaults to GuardConfig.TTL.
	TTL time.Duration
	// Name is the operation's stable identifier, in the Observer's events (a metric
	// label, such as "invoice.send": keep it to a small set of values) and in the
	// record's steps (SPEC §13), which keep it so that the [Completer] finds the
	// operation's resume function ([Guard.RegisterResume]) when its holder died, or
	// released it, after a step committed: keep it stable across deploys while
	// operations are unfinished. Defaults to "": the record's steps are resumed only
	// by a repeat of the call, never by the completer.
	Name string

	// OnLapse says what a call does that finds the key in flight with its holder's
	// lease lapsed: take it over and run the operation again, resuming after its last
	// committed step ([LapseTakeOver]), or get [ErrOutcomeUnknown] until an operator
	// resolves the key ([LapseUnknown], for foreign effects that cannot be
	// deduplicated; SPEC §13). Defaults to [LapseTakeOver].
	OnLapse LapsePolicy
}

// Begin claims c's key (SPEC §5) and returns exactly one of:
//
//   - an acquired claim (h): the caller runs the operation under h.Context(), then
//     stores its result with [Handle.SetResponse] and [Handle.Complete], or releases
//     the key with [Handle.Release] so that a repeat executes afresh;
//   - a replay (replay): the stored result of an earlier execution;
//   - an error: [ErrKeyInvalid] (a key longer than [MaxKeyLength] bytes, or with a
//     control character), [ErrKeyReused] (another fingerprint), an [*InProgressError] matching
//     [ErrKeyInProgress] (executing elsewhere; with InFlightWait, after waiting),
//     [ErrResponseNotStored] (completed, result not kept), a [*StoreError] matching
//     [ErrStoreUnavailable] (the store failed or did not answer within StoreTimeout),
//     a [*QuotaError] matching [ErrQuotaExceeded] (the scope reached a bound of its
//     own, SPEC §19: nothing claimed), [ErrScopeRequired] or [ErrKeyRequired].
//
// The operation's context, h.Context(), is a child of ctx: it ends when ctx does, and
// with cause [ErrLeaseLost] when the lease is lost. Pass context.WithoutCancel(ctx) to
// let the operation run on when the caller goes away, as the middleware does. Begin
// panics when c.TTL is not a TTL ([Guard.CheckTTL]).
func (g *Guard) Begin(ctx context.Context, c Call) (h *Handle, replay *Response, err error) {
	if g == nil {
		panic("idem: Guard.Begin (or Do, DoTx) on a nil *Guard: build one with idem.NewGuard, or take a middleware's with Middleware.Guard")
	}
	switch {
	case c.Scope == "" || c.Scope == idemstore.ReservedScope:
		return nil, nil, ErrScopeRequired
	case c.Key == "":
		return nil, nil, ErrKeyRequired
	}
	if err := checkCallKey(c.Key); err != nil {
		return nil, nil, err
	}
	if !c.OnLapse.Valid() {
		panic(fmt.Sprintf("idem: Call.OnLapse is not a known policy: %v", c.OnLapse))
	}
	h = &Handle{route: c.Name, operation: c.Name}
	h.claim.OnLapse = c.OnLapse
	h.init(g, ctx, c.Scope, c.Key, g.keyed(c.Fingerprint), g.callTTL(c.TTL, "Call.TTL"))
	if replay, err = g.cached(h); replay != nil || err != nil {
		return nil, replay, err
	}
	if replay, err = g.admit(ctx, h); replay != nil || err != nil {
		return nil, replay, err
	}
	if replay, err = g.claim(ctx, h); replay != nil || err != nil {
		h.leaveQuota()
		return nil, replay, err
	}
	h.start(ctx)
	return h, nil, nil
}

// checkCallKey refuses a Call's key that no adapter could pass: longer than
// MaxKeyLength bytes, or holding an ASCII control character, which would break every
// log line and listing that shows it. (The HTTP key is stricter, SPEC §3; a function's
// key, a message id or a job id, may hold spaces and any UTF-8.) The error never
// contains the key.
func checkCallKey(key string) error {
	if len(key) > MaxKeyLength {
		return fmt.Errorf("%w: key is %d bytes, at most %d allowed", ErrKeyInvalid, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: control character 0x%02x at byte %d", ErrKeyInvalid, c, i+1)
		}
	}
	return nil
}

// callTTL is ttl, or the guard's TTL when zero; it panics, naming field, when ttl does
// not outlive the lease.
func (g *Guard) callTTL(ttl time.Duration, field string) time.Duration {
	if ttl == 0 {
		return g.cfg.TTL
	}
	if ttl < 0 {
		panic(fmt.Sprintf("idem: %s must not be negative, got %v", field, ttl))
	}
	checkTTL(field, ttl, g.name, g.cfg.Lease)
	return ttl
}

// storeNow is the Now of store parameters: zero, so that the store's clock decides,
// unless a Clock is injected.
func (g *Guard) storeNow() time.Time {
	if g.cfg.Clock != nil {
		return g.cfg.Clock()
	}
	return time.Time{}
}

// localNow is the guard's own reading of time.
func (g *Guard) localNow() time.Time {
	if g.cfg.Clock != nil {
		return g.cfg.Clock()
	}
	return time.Now()
}

// cached answers h's call from the replay cache, when there is one and it holds a
// completed record of the key with a matching fingerprint.
func (g *Guard) cached(h *Handle) (*Response, error) {
	if g.cache == nil {
		return nil, nil
	}
	if resp, ok := g.cache.get(h.scope, h.key, h.claim.Fingerprint, g.localNow()); ok {
		if h.observing() {
			h.observeClaim(replayOutcome(resp, observe.OutcomeReplayedFromCache), false, time.Now(), nil)
		}
		return replayOf(resp)
	}
	return nil, nil
}

// replayOutcome is the outcome of a claim that found resp stored: o, or
// OutcomeNotStored.
func replayOutcome(resp *Response, o observe.Outcome) observe.Outcome {
	switch {
	case resp == nil || resp.NotStored:
		return observe.OutcomeNotStored
	case resp.OutcomeUnknown:
		return observe.OutcomeUnknown
	}
	return o
}

// replayOf is the answer of Begin for a completed record's response.
func replayOf(resp *Response) (*Response, error) {
	switch {
	case resp == nil || resp.NotStored:
		return nil, ErrResponseNotStored
	case resp.OutcomeUnknown:
		return nil, ErrOutcomeUnknown
	}
	return resp, nil
}

// claim runs the claim loop of SPEC §5 for h's call: it claims the key, and when the
// key is in flight waits up to InFlightWait for its outcome, polling the store. It
// returns a replay or an error, or neither when h acquired the key.
func (g *Guard) claim(ctx context.Context, h *Handle) (*Response, error) {
	return g.claimFrom(ctx, h, nil)
}

// claimFrom is claim whose first store call's answer is first, when not nil: what a
// SPEC §7 transaction found of the key (a completed record, one in flight, another
// fingerprint's), which needs no second asking.
func (g *Guard) claimFrom(ctx context.Context, h *Handle, first *idemstore.ClaimResult) (*Response, error) {
	// waitUntil is set when the key is first found in flight; every store call after
	// that ends by waitUntil + StoreTimeout (stopAt).
	var waitUntil, stopAt, start time.Time
	if h.observing() {
		start = time.Now()
	}
	waited := false
	backoff := waitPollMin
	for {
		res, err := first, error(nil)
		if first == nil {
			res, err = h.claimKey(ctx, stopAt)
		}
		first = nil
		if err != nil {
			h.observeClaim(observe.OutcomeStoreError, waited, start, err)
			return nil, g.storeError(ctx, h, "claim", err)
		}
		if res.Outcome == idemstore.ClaimAcquired || res.Outcome == idemstore.ClaimCompleted {
			rec, err := h.open(ctx, res.Record)
			if err != nil {
				return nil, h.openFailed(ctx, err, res.Outcome == idemstore.ClaimAcquired, waited, start)
			}
			if rec != res.Record {
				opened := *res
				opened.Record = rec
				res = &opened
			}
		}
		switch res.Outcome {
		case idemstore.ClaimAcquired:
			o := observe.OutcomeAcquired
			switch {
			case res.Released:
				// Its holder answered (an error) after a step committed: nothing died.
				o = observe.OutcomeResumed
				g.cfg.Logger.InfoContext(ctx, "idem: resuming an operation its holder released after a step committed",
					h.attrs(slog.String("recovery_point", res.Record.RecoveryPoint))...)
			case res.TookOver && res.Record.RecoveryPoint != "":
				o = observe.OutcomeTookOver
				g.cfg.Logger.InfoContext(ctx, "idem: took over a key whose lease lapsed; resuming after its last committed step",
					h.attrs(slog.String("recovery_point", res.Record.RecoveryPoint))...)
			case res.TookOver:
				o = observe.OutcomeTookOver
				g.cfg.Logger.InfoContext(ctx, "idem: took over a key whose holder's lease lapsed; executing again", h.attrs()...)
			}
			h.acquired(res.Record)
			h.tookOver = res.TookOver
			h.observeClaim(o, waited, start, nil)
			return nil, nil
		case idemstore.ClaimCompleted:
			if res.MarkedUnknown {
				g.cfg.Logger.WarnContext(ctx, "idem: the key's holder died and its operation cannot be repeated safely (policy unknown); "+
					"answering outcome_unknown until an operator resolves the key (idem keys resolve)", h.attrs()...)
			}
			g.cacheRecord(h, res.Record)
			h.observeClaim(replayOutcome(res.Record.Response, observe.OutcomeReplayed), waited, start, nil)
			return replayOf(res.Record.Response)
		case idemstore.ClaimMismatch:
			h.observeClaim(observe.OutcomeKeyReused, waited, start, nil)
			return nil, ErrKeyReused
		}
		if waitUntil.IsZero() {
			waitUntil = time.Now().Add(g.cfg.InFlightWait)
			stopAt = waitUntil.Add(g.cfg.StoreTimeout)
		}
		waited = waited || g.cfg.InFlightWait > 0
		rec, again, err := h.await(ctx, waitUntil, stopAt, &backoff)
		if rec != nil && err == nil && h.claim.Fingerprint.Matches(rec.Fingerprint) {
			if rec, err = h.open(ctx, rec); err != nil {
				return nil, h.openFailed(ctx, err, false, waited, start)
			}
		}
		switch {
		case err != nil:
			h.observeClaim(observe.OutcomeStoreError, waited, start, err)
			return nil, g.storeError(ctx, h, "wait", err)
		case rec != nil && !h.claim.Fingerprint.Matches(rec.Fingerprint):
			h.observeClaim(observe.OutcomeKeyReused, waited, start, nil)
			return nil, ErrKeyReused
		case rec != nil:
			g.cacheRecord(h, rec)
			h.observeClaim(replayOutcome(rec.Response, observe.OutcomeWaitedThenReplayed), waited, start, nil)
			return replayOf(rec.Response)
		case !again:
			h.observeClaim(observe.OutcomeInProgress, waited, start, nil)
			return nil, &InProgressError{RetryAfter: g.cfg.RetryAfter}
		}
	}
}

// storeError logs a failed store call before the work and returns it as a
// *StoreError: the call fails closed (SPEC §9).
func (g *Guard) storeError(ctx context.Context, h *Handle, op string, err error) error {
	if errors.Is(err, ErrStoreTooNew) {
		// Refused before any store call; logged once, when the state was read.
		return &StoreError{Op: "state", Err: err}
	}
	level := slog.LevelError
	if ctx.Err() != nil {
		level = slog.LevelInfo // the caller went away; the store may be fine
	}
	g.cfg.Logger.Log(ctx, level, "idem: store "+op+" failed", h.attrs(slog.Any("error", err))...)
	return &StoreError{Op: op, Err: err}
}

// cacheRecord puts a completed record read from the store in the replay cache, when
// there is one. The record is the caller's own copy (Store contract), so its response
// is kept as is.
func (g *Guard) cacheRecord(h *Handle, rec *idemstore.Record) {
	// An outcome_unknown answer is never cached: an operator's resolution must reach
	// every process at once.
	if g.cache == nil || rec == nil || rec.State != idemstore.StateCompleted || rec.Response == nil || rec.Response.OutcomeUnknown {
		return
	}
	g.cache.put(h.scope, h.key, rec.Fingerprint, rec.Response, rec.ExpiresAt, g.localNow())
}

// Backoff of a repeat polling for the first execution's outcome.
const (
	waitPollMin = 5 * time.Millisecond
	waitPollMax = 200 * time.Millisecond
)

// claimKey claims h's key afresh (a new token) under StoreTimeout,
// ending by stopAt at the latest when that is set (SPEC §9, bounded time). A claim
// cut off that way may still reach the store: the guard watches for it in the
// background and releases it (cutoff.go).
func (h *Handle) claimKey(ctx context.Context, stopAt time.Time) (*idemstore.ClaimResult, error) {
	g := h.g
	h.newClaim()
	h.claim.LikelyNew, h.likelyNew = h.likelyNew, false
	deadline := callDeadlineFrom(h.claimStartedReal, g.cfg.StoreTimeout, stopAt)
	if err := g.checkStoreState(ctx, h.claimStarted(), deadline); err != nil {
		return nil, err
	}
	start := h.storeCallStart()
	var res *idemstore.ClaimResult
	var err error
	var ended bool // the call's context ended before it returned
	if !h.firstCallUsed {
		h.firstCallUsed = true
		h.firstCall.start(ctx, deadline)
		res, err = g.cfg.Store.RecordClaim(&h.firstCall, &h.claim)
		ended = err != nil && h.firstCall.Err() != nil
		h.firstCall.stop()
	} else {
		cctx, cancel := context.WithDeadline(ctx, deadline)
		res, err = g.cfg.Store.RecordClaim(cctx, &h.claim)
		ended = err != nil && cctx.Err() != nil
		cancel()
	}
	h.observeStoreCall(observe.StoreOpClaim, start, err)
	if cutOff(err, ended) {
		g.watchCutOff(h)
	}
	return res, err
}

// newClaim readies the params of a claim with a fresh token and the record id of
// the request (idemstore.RecordIDFor: every claim of one request creates the same id,
// and so the same derived keys, SPEC §13).
func (h *Handle) newClaim() {
	g := h.g
	token, id := newClaimIDs(h.scope, h.key, h.claim.Fingerprint)
	h.claimStartedReal = time.Now()
	h.claim = idemstore.ClaimParams{
		Scope: h.scope, Key: h.key, Fingerprint: h.claim.Fingerprint, Token: token, RecordID: id,
		Lease: g.cfg.Lease, TTL: h.claim.TTL, OnLapse: h.claim.OnLapse, Now: g.storeNow(), // the TTL as SetTTL may have set it
	}
}

// claimStarted is when the claim began by the guard's clock: the injected time its
// params carry, or the host's clock.
func (h *Handle) claimStarted() time.Time {
	if h.g.cfg.Clock != nil {
		return h.claim.Now
	}
	return h.claimStartedReal
}

// callDeadline is the deadline of a store call starting now: timeout away, or stopAt
// when that is earlier.
func callDeadline(timeout time.Duration, stopAt time.Time) time.Time {
	return callDeadlineFrom(time.Now(), timeout, stopAt)
}

// callDeadlineFrom is callDeadline for a call starting at now.
func callDeadlineFrom(now time.Time, timeout time.Duration, stopAt time.Time) time.Time {
	d := now.Add(timeout)
	if !stopAt.IsZero() && stopAt.Before(d) {
		return stopAt
	}
	return d
}

// await polls the record of an in-flight operation until it completes (rec), goes
// away or its lease lapses (again: claim once more), or until the wait ends (neither).
// Each poll runs under StoreTimeout and ends by stopAt. The backoff carries over
// between calls, so that a lease that looks lapsed to this host but not to the store
// does not make it claim in a tight loop.
func (h *Handle) await(ctx context.Context, until, stopAt time.Time, backoff *time.Duration) (rec *idemstore.Record, again bool, err error) {
	g := h.g
	if time.Until(until) <= 0 {
		return nil, false, nil
	}
	if g.hooks.waiting != nil && *backoff == waitPollMin {
		g.hooks.waiting()
	}
	for {
		left := time.Until(until)
		if left <= 0 {
			return nil, false, nil
		}
		t := time.NewTimer(min(*backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false, ctx.Err()
		case <-t.C:
		}
		*backoff = min(2**backoff, waitPollMax)
		rec, err := h.poll(ctx, stopAt)
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			return nil, true, nil
		case err != nil:
			return nil, false, err
		case rec.State == idemstore.StateCompleted:
			return rec, false, nil
		case !g.localNow().Before(rec.LeaseEnd):
			// Perhaps lapsed; the claim asks the store's clock.
			return nil, true, nil
		}
	}
}

// lookup reads h's key before an operation that claims it in its own transaction (a
// [RouteOptions.ClaimInHandler] route), under StoreTimeout, and says what a claim would
// find there without asking the store again: a completed record of the call's
// fingerprint (ClaimCompleted), or a live record of another (ClaimMismatch). It
// returns nil, nil when no live record is there (the operation's transaction claims
// the key), and nil with found set when one is there whose fate the store's clock must
// decide (in flight: live, or a lapsed lease to take over): then the caller claims it
// the usual way.
func (h *Handle) lookup(ctx context.Context) (res *idemstore.ClaimResult, found bool, err error) {
	g := h.g
	ctx, cancel := context.WithDeadline(ctx, callDeadline(g.cfg.StoreTimeout, time.Time{}))
	defer cancel()
	start := h.storeCallStart()
	rec, err := g.cfg.Store.RecordGet(ctx, &idemstore.GetParams{Scope: h.scope, Key: h.key, Now: g.storeNow()})
	h.observeStoreCall(observe.StoreOpLookup, start, err)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case !h.claim.Fingerprint.Matches(rec.Fingerprint):
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimMismatch, Record: rec}, true, nil
	case rec.State == idemstore.StateCompleted:
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec}, true, nil
	}
	return nil, true, nil
}

// poll reads the record of an in-flight operation under StoreTimeout, ending by
// stopAt.
func (h *Handle) poll(ctx context.Context, stopAt time.Time) (*idemstore.Record, error) {
	g := h.g
	ctx, cancel := context.WithDeadline(ctx, callDeadline(g.cfg.StoreTimeout, stopAt))
	defer cancel()
	start := h.storeCallStart()
	rec, err := g.cfg.Store.RecordGet(ctx, &idemstore.GetParams{Scope: h.scope, Key: h.key, Now: g.storeNow()})
	h.observeStoreCall(observe.StoreOpWait, start, err)
	return rec, err
}

// newToken returns a fresh lock token: 16 random bytes in hex.
func newToken() string {
	var h [32]byte
	return string(appendToken(h[:0]))
}

// appendToken appends a fresh lock token to b: 16 random bytes in hex.
func appendToken(b []byte) []byte {
	var r [16]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand since Go 1.24)
	for _, c := range r {  // hex.Encode, two digits per lookup
		b = append(b, hexPairs[2*int(c)], hexPairs[2*int(c)+1])
	}
	return b
}

// newClaimIDs returns a fresh lock token and the record id of the request (scope,
// key, fp), in one string (one allocation for the claim's two).
func newClaimIDs(scope, key string, fp Fingerprint) (token, id string) {
	var buf [32 + idemstore.RecordIDLen]byte
	s := string(idemstore.AppendRecordID(appendToken(buf[:0]), scope, key, fp))
	return s[:32], s[32:]
}

// hexPairs holds the two lower-case hex digits of every byte value, in order.
var hexPairs = func() (t [512]byte) {
	for i := range 256 {
		hex.Encode(t[2*i:], []byte{byte(i)})
	}
	return t
}()

// InProgressError is the error of a call whose key is held by an operation still
// executing (SPEC §5.2). It matches [ErrKeyInProgress].
type InProgressError struct {
	// RetryAfter is how long the caller should wait before trying again
	// (GuardConfig.RetryAfter).
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return "idem: a request with this idempotency key is in progress; retry after " + e.RetryAfter.String()
}

// Is reports whether target is [ErrKeyInProgress].
func (e *InProgressError) Is(target error) bool { return target == ErrKeyInProgress }

// StoreError is a store call that failed (or timed out) on the way to running an
// operation. It matches [ErrStoreUnavailable] and unwraps to the store's error.
type StoreError struct {
	// Op is the call that failed: "claim", "wait" (a poll of an in-flight wait),
	// "complete" or "release"; "state" when the store's state refused the call
	// before any store call ([ErrStoreTooNew]).
	Op string
	// Err is the store's error.
	Err error
}

func (e *StoreError) Error() string { return "idem: store " + e.Op + " failed: " + e.Err.Error() }

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports whether target is [ErrStoreUnavailable].
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }
