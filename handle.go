package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
)

// Handle is a claim on a (scope, key): the caller holds the key and runs the
// operation, while a heartbeat renews the lease. [Guard.Begin] returns it; the
// middleware puts it in the handler's context, where [FromContext] finds it.
//
// Operations use Context, Key, Scope and SetStore, and run resumable steps with
// [Step] (or a store package's step helper), RecoveryPoint and DerivedKey (SPEC §13).
// Adapters (the middleware, [Do], a
// gRPC interceptor) supply the result with SetResponse or SetResponder and end the
// claim with Complete or Release, exactly once. Store packages use PrepareCompletion,
// Completed and CompletionFailed to implement the SPEC §7 helper, which completes the
// record inside the application's own transaction.
type Handle struct {
	g     *Guard
	scope string
	key   string

	// The claim: its params (with the fingerprint, the TTL as SetTTL may change it,
	// the policy for a dead holder (Call.OnLapse, RouteOptions.OnLapse) and the token
	// it installs), when it began by the host's clock (claimStarted is
	// the guard's), and the record it returned when acquired.
	claim            idemstore.ClaimParams
	claimStartedReal time.Time
	// likelyNew is the hint of the next claim (idemstore.ClaimParams.LikelyNew), set
	// by a route that expects its key to be new and spent by that claim.
	likelyNew bool
	claimed   *idemstore.Record
	// firstCall is the context of the first claim, the only store call of most
	// calls; later calls make their own.
	firstCall callCtx

	// detached is the caller's context without its cancellation: the parent of the
	// renewals, the completion and the release, which must happen even when the
	// caller went away.
	detached detachedCtx
	// hctx is the operation's context: the work's context carrying the handle
	// without a context.WithValue. cancel ends it, with cause ErrLeaseLost when the
	// lease is lost.
	hctx   handleCtx
	cancel context.CancelCauseFunc
	hb     heartbeat
	// describer adds the adapter's attributes to log lines (the middleware's method
	// and path); nil adds none.
	describer describer
	// route names the operation in the Observer's events; keyHash is set when there
	// is an Observer.
	route, keyHash string

	complete idemstore.CompleteParams

	mu sync.Mutex
	// responder or response supplies the result that the completion stores.
	responder Responder
	response  *Response
	params    *idemstore.CompleteParams // the completion, when store
	stored    *Response                 // the response params store, in clear (params' is sealed under a keyring)
	// failed records how the §7 helper's transaction failed.
	failed error

	// operation names the operation for the record's steps (Call.Name,
	// RouteOptions.Name). steps is the operation's progress (SPEC §13), guarded by mu.
	operation string
	steps     stepState

	// The flags, together so that they take a word or two rather than one each.
	// tookOver: the claim took the key over from a lapsed lease; firstCallUsed: the
	// first claim's context is spent.
	tookOver, firstCallUsed bool
	// Guarded by mu: overridden says whether SetStore chose overrideStore for this
	// result; decided, that the result is frozen and the decision taken, store (true)
	// or release; done, that the §7 helper's transaction committed the completion.
	overridden, overrideStore, decided, store, done bool
	// ended is set by Complete or Release. managed marks the claim of a middleware
	// request, which the middleware ends when the handler returns. unknown (guarded
	// by mu) is set by SetOutcomeUnknown: the claim ends leaving the record to the
	// lapse policy instead of storing or releasing it.
	ended, managed, unknown bool
	// The claim of a [RouteOptions.ClaimInHandler] route: not made yet, the handler's
	// transaction makes it (inTx; false once a helper claimed under a lease), and made
	// by the transaction that last ran (claimedInTx).
	inTx, claimedInTx bool
	// quotaEntered: the call is counted against its scope's bounds (quota.go) until
	// leaveQuota.
	quotaEntered bool
}

// A Responder supplies, once, the result a [Handle] stores: the handle asks for it when
// the completion is prepared (by [Handle.PrepareCompletion] inside a SPEC §7
// transaction, or by [Handle.Complete]). The middleware's response capture is one: it
// freezes what the handler wrote.
type Responder interface {
	// Response returns the result to store and whether to store it (true) or release
	// the key so that a repeat executes afresh (false; [Handle.SetStore] overrides it).
	// The handle keeps resp until the claim ends; it must not change afterwards.
	Response() (resp *Response, store bool)
}

// routeNamer names the route of an adapter's request (the middleware's).
type routeNamer interface{ routeName() string }

// describer adds an adapter's log attributes.
type describer interface {
	attrs(extra ...any) []any
}

type handleKey struct{}

// handleCtx is the operation's context: ctx carrying the Handle, as NewContext would
// return it.
type handleCtx struct {
	context.Context
	h *Handle
}

func (c *handleCtx) Value(key any) any {
	if key == (handleKey{}) {
		return c.h
	}
	return c.Context.Value(key)
}

// FromContext returns the claim of the operation whose context is ctx, or nil when it
// runs without one (a request without an idempotency key, or a route with the
// middleware off). A handler on a route that requires a key (POST and PATCH by
// default) always gets one: a request without a key is refused before it runs.
func FromContext(ctx context.Context) *Handle {
	h, _ := ctx.Value(handleKey{}).(*Handle)
	return h
}

// NewContext returns ctx carrying h. The middleware calls it; tests may too.
func NewContext(ctx context.Context, h *Handle) context.Context {
	return context.WithValue(ctx, handleKey{}, h)
}

// init readies h for a call of g under ctx.
func (h *Handle) init(g *Guard, ctx context.Context, scope, key string, fp Fingerprint, ttl time.Duration) {
	h.g, h.scope, h.key = g, scope, key
	h.claim.Fingerprint, h.claim.TTL = fp, ttl
	h.detached = detachedCtx{ctx}
	if g.cfg.Observer != nil {
		// Before any event, which timers may send from other goroutines.
		h.keyHash = keyHash(scope, key)
	}
}

// start begins the operation of an acquired claim: its context, a child of parent
// that the lease's loss cancels, and the heartbeat.
func (h *Handle) start(parent context.Context) {
	g := h.g
	ctx, cancel := context.WithCancelCause(parent)
	h.cancel = cancel
	h.hctx = handleCtx{Context: ctx, h: h}
	h.hb.run = heartbeatRun{
		h:            h,
		ttl:          h.claim.TTL,
		deadline:     h.claimStarted().Add(g.cfg.Lease),
		realDeadline: h.claimStartedReal.Add(g.cfg.Lease),
		cancel:       cancel,
	}
	g.startHeartbeat(&h.hb)
}

// Context returns the operation's context: it carries the handle (for the store
// packages' §7 helpers) and is cancelled with cause [ErrLeaseLost] when the lease is
// lost, so that the operation never runs on beside a caller that took its key over.
func (h *Handle) Context() context.Context { return &h.hctx }

// Key returns the idempotency key, as parsed (unquoted).
func (h *Handle) Key() string { return h.key }

// Scope returns the principal the key belongs to.
func (h *Handle) Scope() string { return h.scope }

// Fingerprint returns the fingerprint of the operation's input (the request's, for
// the middleware): a record made by another input under the same key refuses it
// ([Fingerprint.Matches]). A backstop that keeps the key in the application's own
// database (package backstop) records it too.
func (h *Handle) Fingerprint() Fingerprint { return h.claim.Fingerprint }

// TTL returns how long the record lives after its creation: the route's or the
// Call's TTL, or the one [Handle.SetTTL] set.
func (h *Handle) TTL() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claim.TTL
}

// TookOver reports whether this claim took the key over from a holder whose lease
// lapsed (SPEC §5.3): the operation may have run before, in part.
func (h *Handle) TookOver() bool { return h.tookOver }

// RecordID returns the record's id: derived from the request (its scope, key and
// fingerprint, [idemstore.RecordIDFor]) by the claim that created the record, or the
// random id of a record made by idem 0.2.0 or older, and kept across takeovers (SPEC
// §13). It is empty on a
// [RouteOptions.ClaimInHandler] route, whose claim is not made yet.
func (h *Handle) RecordID() string {
	if h.claimed == nil {
		return ""
	}
	return h.claimed.ID
}

// SetStore overrides, for this result only, whether it is stored (true) or releases
// the key (false), whatever its status (SPEC §6).
func (h *Handle) SetStore(store bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.overridden, h.overrideStore = true, store
}

// SetOutcomeUnknown says that whether the operation happened is not known: a request
// was sent to a foreign system and its reply was lost (a reset, a timeout, a broken
// body). Neither storing a result nor releasing the key would be honest, so the claim
// ends as a holder's that died ends: the record is kept, under its record id (and so
// its derived keys, [Handle.DerivedKey]), with its lease ended now, and the call's
// lapse policy decides what a repeat gets (SPEC §5.3, §13): under [LapseUnknown] the
// record is marked outcome unknown at once (repeats get [ErrOutcomeUnknown], 500
// outcome_unknown, until an operator resolves the key), under [LapseTakeOver] the
// next repeat takes it over and runs the operation again under the same derived keys.
//
// It overrides SetStore and the result; it changes nothing once a §7 transaction
// completed the record. Behind the middleware, the client gets what the handler wrote
// (say that the outcome is unknown), and nothing of it is stored.
func (h *Handle) SetOutcomeUnknown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unknown = true
}

// outcomeUnknown reports whether SetOutcomeUnknown was called.
func (h *Handle) outcomeUnknown() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.unknown
}

// SetTTL sets how long this record lives after its creation, for this operation only
// (SPEC §8), in place of the route's or the Call's TTL: a handler that knows its
// result is worth keeping longer, or shorter, says so. Like every TTL it must be
// longer than the lease; otherwise SetTTL returns an error and changes nothing, as it
// does once the result is frozen for the completion.
func (h *Handle) SetTTL(d time.Duration) error {
	if h.g == nil {
		return errors.New("idem: Handle.SetTTL on a handle without a claim")
	}
	if lease := h.g.cfg.Lease; d <= lease {
		return fmt.Errorf("idem: Handle.SetTTL(%v): a TTL must be longer than the lease (%v), or the record is completed already expired", d, lease)
	}
	if d > MaxTTL {
		return fmt.Errorf("idem: Handle.SetTTL(%v): a TTL must be at most idem.MaxTTL (%v), the longest expiry every store represents", d, MaxTTL)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.decided {
		return errors.New("idem: Handle.SetTTL after the result was frozen for the completion")
	}
	h.claim.TTL = d
	// The renewals keep expires_at = max(created_at + TTL, lease end) with it.
	h.hb.mu.Lock()
	h.hb.run.ttl = d
	h.hb.mu.Unlock()
	return nil
}

// SetResponse sets the result the completion stores: resp, which must not change
// afterwards. It replaces a Responder. Call it before the completion is prepared
// ([Handle.Complete], or the §7 helper's [Handle.PrepareCompletion]); later calls
// change nothing, and so do calls by a handler behind the middleware, which stores
// what the handler writes.
func (h *Handle) SetResponse(resp *Response) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.decided && !h.managed {
		h.response, h.responder = resp, nil
	}
}

// SetResponder sets what supplies the result when the completion is prepared, for an
// adapter whose result is known only then (the middleware's capture of what the
// handler wrote). It replaces a response set by SetResponse. Like SetResponse, it
// changes nothing once the completion is prepared, or behind the middleware.
func (h *Handle) SetResponder(r Responder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.decided && !h.managed {
		h.responder, h.response = r, nil
	}
}

// PrepareCompletion is for store packages implementing the SPEC §7 helper. Called
// inside the application's transaction, after the operation produced its result, it
// stops the lease heartbeat, freezes the result and returns the fenced completion to
// run in that transaction. It returns nil params (and no error) when the result is not
// to be stored (its status releases the key, SPEC §6; or no result was set); the
// helper then just commits the application's writes and the key is released. It is
// one-shot: a second transaction of the same operation commits as a plain one.
//
// Behind the middleware it returns [ErrNoResponse] when the handler has written no
// response yet: the helper must roll back and return the error, and the middleware
// answers 500 (not stored, logged) whatever the handler writes afterwards. Storing
// the empty 200 that net/http would send instead is how a handler that writes its
// response after the transaction (the natural order, and the wrong one) would lose
// it for good.
func (h *Handle) PrepareCompletion() (*idemstore.CompleteParams, error) {
	if h.g == nil {
		return nil, nil
	}
	p, store, err := h.decide(true)
	if !store {
		p = nil
	}
	return p, err
}

// Completed tells the handle that the completion prepared by PrepareCompletion
// committed with the application's writes: the record is completed and is never
// released, whatever happens next.
func (h *Handle) Completed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
}

// CompletionFailed tells the handle that the transaction holding the completion did
// not commit (or the fenced completion found the key taken over, [ErrLeaseLost]). The
// caller then never receives the operation's result: the middleware answers 503
// store_unavailable, and Complete returns the failure.
func (h *Handle) CompletionFailed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = err
}

// outcome reports how a §7 transaction ended: completed, or failed with err.
func (h *Handle) outcome() (completed bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done, h.failed
}

// decide stops the heartbeat, freezes the result and applies the store policy, once;
// later calls return the same decision (or nothing, for a §7 helper: forTx).
func (h *Handle) decide(forTx bool) (*idemstore.CompleteParams, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.decided {
		if forTx {
			return nil, false, nil
		}
		return h.params, h.store, nil
	}
	h.decided = true
	h.hb.stopAndWait()
	if e, ok := h.responder.(emptiness); forTx && ok && e.empty() {
		e.refuseWrites()
		h.failed = ErrNoResponse
		return nil, false, ErrNoResponse
	}
	resp, store := h.response, h.response != nil
	if h.responder != nil {
		resp, store = h.responder.Response()
	}
	if h.overridden {
		store = h.overrideStore
	}
	h.store = store && resp != nil
	if h.store {
		h.stored = resp
		if k := h.g.cfg.Seal; k != nil {
			sealed, err := sealResponse(k, h.binding(), resp)
			if err != nil {
				// Not reachable: record ids are 32 hex digits.
				panic("idem: sealing a response: " + err.Error())
			}
			resp = sealed
		}
		h.complete = idemstore.CompleteParams{
			Scope: h.scope, Key: h.key, Token: h.claim.Token,
			Response: resp, TTL: h.claim.TTL, Now: h.g.storeNow(),
		}
		h.params = &h.complete
	}
	return h.params, h.store, nil
}

// emptiness is a Responder that can tell that nothing was written yet (the
// middleware's capture, before the handler wrote a status or a byte), and refuse the
// writes that come too late.
type emptiness interface {
	empty() bool
	refuseWrites()
}

// Complete ends the claim with its result: it stores the result set by SetResponse or
// supplied by the Responder (unless it releases the key: no result, or the Responder
// or SetStore said so), fenced by the lock token. It returns nil when the result is
// stored, by it or by a §7 transaction, or the key released as decided;
// [ErrLeaseLost] when another caller took the key over (the result must not be used:
// the repeat gets the winner's outcome); the §7 transaction's failure as reported to
// CompletionFailed (the key is released; nothing committed); or a [*StoreError] when
// the store failed to record the result (logged: the result stands, and the key frees
// when the lease lapses). The completion outlives ctx's cancellation and is bounded by
// the lease. A second call returns nil and changes nothing. A handler behind the
// middleware must not call it (it returns an error): the middleware ends the claim.
func (h *Handle) Complete() error {
	if ok, err := h.end(); !ok {
		return err
	}
	defer h.leaveQuota()
	defer h.cancel(nil)
	_, err := h.finish()
	return err
}

// Release ends the claim without a result: it deletes the in-flight record, fenced by
// the lock token, so that a repeat executes afresh (SPEC §6). A record whose recovery
// point advanced (a step committed, SPEC §13) is kept with its lease ended instead, so
// that a repeat or the [Completer] resumes it after its last committed step at once. A
// record completed by a §7 transaction is never released, and a key taken over is left
// to its new holder. A
// store's failure is logged and returned as a [*StoreError]: the key frees when the
// lease lapses. A second call, or a call after Complete, changes nothing. A handler
// behind the middleware must not call it (it returns an error; see SetStore).
func (h *Handle) Release() error {
	if ok, err := h.end(); !ok {
		return err
	}
	defer h.leaveQuota()
	defer h.cancel(nil)
	return h.abort()
}

// errManaged is the error of Complete and Release called by a handler behind the
// middleware, which ends the claim itself.
var errManaged = errors.New("idem: the middleware ends this claim when the handler returns; use SetStore to choose whether the response is stored")

// end marks the claim ended and reports whether it was not already, or errManaged.
func (h *Handle) end() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.managed:
		return false, errManaged
	case h.ended || h.g == nil:
		return false, nil
	}
	h.ended = true
	return true, nil
}

// ending is how a claim ended (Handle.finish).
type ending int

const (
	// endStored: the result is stored, by the completion or a §7 transaction.
	endStored ending = iota
	// endReleased: the result is not to be stored; the key is released.
	endReleased
	// endUnstored: the store failed to record the result; the result stands (its
	// effects happened) and the key frees when the lease lapses.
	endUnstored
	// endFailed: the result must not be used: the §7 transaction did not commit (the
	// key is released), or the lease was lost before the completion.
	endFailed
	// endUnknown: the operation's outcome is unknown (SetOutcomeUnknown): the record
	// is kept for the lapse policy, and the caller's answer says so.
	endUnknown
)

// finish stores the result or releases the key (SPEC §6, §7) and says how the claim
// ended, with the error of endUnstored and endFailed.
func (h *Handle) finish() (ending, error) {
	g := h.g
	h.hb.stopAndWait()
	completed, failed := h.outcome()
	switch {
	case completed: // a §7 transaction committed the record with the application's writes
		h.mu.Lock()
		params, stored := h.params, h.stored
		h.mu.Unlock()
		if params != nil {
			h.cacheCompleted(stored)
			h.storedQuota(params.Response)
		}
		expired := h.warnIfExpired()
		if h.observing() {
			h.observeCompletion(completionResult(params), true, expired, 0, nil)
		}
		return endStored, nil
	case failed != nil: // ... or did not commit: neither effects nor record exist
		if errors.Is(failed, ErrNoResponse) {
			g.cfg.Logger.ErrorContext(&h.detached, "idem: the handler's transaction was rolled back: it was to commit with the response, "+
				"but none was written yet; write the response inside the transaction's function (or return it from Respond's); answering 500", h.attrs(h.routeAttr()...)...)
		} else {
			g.cfg.Logger.WarnContext(&h.detached, "idem: the completing transaction failed; the result is not used",
				h.attrs(slog.Any("error", failed))...)
		}
		h.observeCompletion(observe.CompletionFailed, true, false, 0, failed)
		_ = h.release() // harmless if the commit happened after all: the record is completed
		return endFailed, failed
	}
	if h.outcomeUnknown() {
		return endUnknown, h.settleUnknown()
	}
	params, store, _ := h.decide(false)
	if !store {
		_ = h.release()
		return endReleased, nil
	}
	ctx, cancel := h.storeCtx()
	start := h.storeCallStart()
	err := g.cfg.Store.RecordComplete(ctx, params)
	took := h.observeStoreCall(observe.StoreOpComplete, start, err)
	cancel()
	switch {
	case err == nil:
		h.cacheCompleted(h.stored)
		h.storedQuota(params.Response)
		expired := h.warnIfExpired()
		if h.observing() {
			h.observeCompletion(completionResult(params), false, expired, took, nil)
		}
		return endStored, nil
	case errors.Is(err, ErrLeaseLost):
		// Another caller took the key over and executes (or executed) the operation;
		// the repeat gets its outcome.
		g.cfg.Logger.WarnContext(&h.detached, "idem: lease lost before the result was stored; the result is not used", h.attrs()...)
		h.observeCompletion(observe.CompletionLeaseLost, false, false, took, err)
		return endFailed, ErrLeaseLost
	default:
		// The operation's effects happened: its result stands, and the key frees when
		// the lease lapses. Failing the call would make the client retry and execute
		// the operation a second time.
		g.cfg.Logger.ErrorContext(&h.detached, "idem: storing the result failed; it is used unstored",
			h.attrs(slog.Any("error", err))...)
		h.observeCompletion(observe.CompletionFailed, false, false, took, err)
		return endUnstored, &StoreError{Op: "complete", Err: err}
	}
}

// completionResult is the result of a completion that stored params (none: the §7
// transaction committed without a prepared completion).
func completionResult(params *idemstore.CompleteParams) observe.CompletionResult {
	if params != nil && params.Response != nil && params.Response.NotStored {
		return observe.CompletionNotStored
	}
	return observe.CompletionStored
}

// abort releases the key after the operation failed or panicked, unless a §7
// transaction completed it.
func (h *Handle) abort() error {
	h.mu.Lock()
	h.decided = true // a Handle kept past the operation finds nothing more to complete
	h.mu.Unlock()
	h.hb.stopAndWait()
	if completed, _ := h.outcome(); !completed {
		if h.outcomeUnknown() {
			return h.settleUnknown()
		}
		return h.release()
	}
	return nil
}

// settleUnknown ends the claim of an operation whose outcome is unknown
// (SetOutcomeUnknown): it ends the lease now, fenced by the token, keeping the record
// as a holder that died leaves it, and under the policy LapseUnknown marks it outcome
// unknown at once, as the next repeat's claim would (so that `idem keys` lists it and
// an operator can resolve it before any repeat comes). A failure is logged and
// returned: the record is then settled when its lease lapses, in the same way.
func (h *Handle) settleUnknown() error {
	g := h.g
	h.mu.Lock()
	h.decided = true
	h.mu.Unlock()
	ctx, cancel := h.storeCtx()
	defer cancel()
	start := h.storeCallStart()
	_, err := g.cfg.Store.RecordRenew(ctx, &idemstore.RenewParams{Scope: h.scope, Key: h.key, Token: h.claim.Token, TTL: h.claim.TTL, Now: g.storeNow()})
	h.observeStoreCall(observe.StoreOpRenew, start, err)
	switch {
	case errors.Is(err, ErrLeaseLost):
		g.cfg.Logger.DebugContext(ctx, "idem: the outcome is unknown, and the key is no longer held", h.attrs()...)
		return nil
	case err != nil:
		g.cfg.Logger.WarnContext(ctx, "idem: ending the lease of an operation whose outcome is unknown failed; the record is kept and settled when the lease lapses",
			h.attrs(slog.Any("error", err))...)
		return &StoreError{Op: "renew", Err: err}
	}
	if h.claim.OnLapse != LapseUnknown {
		g.cfg.Logger.WarnContext(ctx, "idem: the operation's outcome is unknown; the record is kept, and the next repeat takes it over under the same record id and derived keys (policy take_over)",
			h.attrs(slog.String("record_id", h.RecordID()))...)
		return nil
	}
	mark := h.claim
	mark.Token = newToken()
	mark.Now = g.storeNow()
	start = h.storeCallStart()
	res, err := g.cfg.Store.RecordClaim(ctx, &mark)
	h.observeStoreCall(observe.StoreOpClaim, start, err)
	switch {
	case err != nil:
		g.cfg.Logger.WarnContext(ctx, "idem: marking an operation whose outcome is unknown failed; its record is kept, and the next repeat marks it",
			h.attrs(slog.Any("error", err))...)
		return &StoreError{Op: "claim", Err: err}
	case res.Outcome == idemstore.ClaimAcquired:
		// The record expired in between, and this claim made a new one: it must not
		// stay in flight with nobody to end it.
		_ = g.cfg.Store.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: h.scope, Key: h.key, Token: mark.Token, Now: g.storeNow()})
		return nil
	}
	g.cfg.Logger.WarnContext(ctx, "idem: the operation's outcome is unknown; the record is marked outcome_unknown until an operator resolves the key (idem keys resolve)",
		h.attrs(slog.String("record_id", h.RecordID()))...)
	return nil
}

// release deletes the in-flight record so that a repeat executes afresh. A failure is
// logged and returned: the key frees when the lease lapses. A key no longer held is
// not a failure.
func (h *Handle) release() error {
	g := h.g
	ctx, cancel := h.storeCtx()
	defer cancel()
	start := h.storeCallStart()
	err := g.cfg.Store.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: h.scope, Key: h.key, Token: h.claim.Token, Now: g.storeNow()})
	h.observeRelease(h.observeStoreCall(observe.StoreOpRelease, start, err), err)
	switch {
	case errors.Is(err, ErrLeaseLost):
		g.cfg.Logger.DebugContext(ctx, "idem: release found the key no longer held", h.attrs()...)
	case err != nil:
		g.cfg.Logger.WarnContext(ctx, "idem: releasing the key failed; it frees when the lease lapses",
			h.attrs(slog.Any("error", err))...)
		return &StoreError{Op: "release", Err: err}
	}
	return nil
}

// storeCtx is the context of the completion or release after the operation ran: they
// must happen even when the caller went away, within a bound. It is a callCtx, one
// allocation where context.WithTimeout makes four; the caller stops it once the call
// returned.
func (h *Handle) storeCtx() (context.Context, func()) {
	c := &callCtx{}
	c.start(&h.detached, time.Now().Add(h.g.cfg.Lease))
	return c, c.stop
}

// leaseLost reports whether the operation's context was cancelled because the lease
// was lost.
func (h *Handle) leaseLost() bool {
	return errors.Is(context.Cause(h.hctx.Context), ErrLeaseLost)
}

// cacheCompleted puts the result this process just stored in the replay cache, when
// there is one: it expires with the record (SPEC §8).
func (h *Handle) cacheCompleted(resp *Response) {
	g := h.g
	if g.cache == nil || h.claimed == nil {
		return
	}
	g.cache.put(h.scope, h.key, h.claimed.Fingerprint, cloneResponse(resp), h.completedExpiresAt(), g.localNow())
}

// completedExpiresAt is when the record that h completed just now expires: at its
// created_at + TTL, or a TTL after now when its recovery point advanced
// ([idemstore.Record.CompletionExpiresAt]), by the guard's clock.
func (h *Handle) completedExpiresAt() time.Time {
	rec := idemstore.Record{CreatedAt: h.claimed.CreatedAt, RecoveryPoint: h.RecoveryPoint()}
	return rec.CompletionExpiresAt(h.g.localNow(), h.claim.TTL)
}

// warnIfExpired logs a record completed after its TTL ran out: it counts as absent
// already, so a repeat executes the operation again (SPEC §8). The operation ran
// longer than the TTL, which should be longer than the slowest operation. (An
// operation whose recovery point advanced never completes expired: its TTL counts
// from the completion.) It reports whether it did.
func (h *Handle) warnIfExpired() bool {
	if h.claimed == nil || h.g.localNow().Before(h.completedExpiresAt()) {
		return false
	}
	h.g.cfg.Logger.WarnContext(&h.detached, "idem: record completed after its TTL: it is expired already, and a retry executes again; make the TTL longer than the operation runs",
		h.attrs(slog.Duration("ttl", h.claim.TTL))...)
	return true
}

// routeAttr names the route of a middleware request, for a log line about a mistake in
// its handler; none for other callers.
func (h *Handle) routeAttr() []any {
	if x, ok := h.describer.(routeNamer); ok {
		return []any{slog.String("route", x.routeName())}
	}
	return nil
}

// attrs are the attributes of every log line about the call, then extra: a hash of
// the key, never the key itself. They are built only when a line is logged.
func (h *Handle) attrs(extra ...any) []any {
	if h.describer != nil {
		return h.describer.attrs(extra...)
	}
	return append([]any{slog.String("key_hash", keyHash(h.scope, h.key))}, extra...)
}
