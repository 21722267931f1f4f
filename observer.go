package idem

import (
	"time"
)

// Observer is told what the guard and the middleware do (SPEC §15): every claim's
// outcome, every completion and release, every failed renewal and lost lease, and
// every store call with its duration. It is a struct of optional funcs, as
// net/http/httptrace's ClientTrace is: a nil Observer, or a nil func, costs nothing.
// Set it as [Config.Observer] or [GuardConfig.Observer].
//
// The funcs are called synchronously on the goroutine doing the work (the request's,
// or a heartbeat's timer), possibly concurrently: they must be safe for concurrent use
// and quick (count, observe a histogram, add a span event), never block.
//
// Events carry what metrics and traces need for labels and attributes — an outcome,
// a store operation, a route name, a duration, an error — and never a key, a body or
// a lock token; KeyHash is a short hash of (scope, key), for correlating logs and
// traces, never for a metric label. Adapters such as a Prometheus collector map them
// to, say, idem_claims_total{route, outcome}, idem_completions_total{route, result},
// idem_releases_total{route}, idem_lease_lost_total{route, cause} and
// idem_store_duration_seconds{op} (with an error label from Err).
type Observer struct {
	// Claimed is called once for every keyed request or [Guard.Begin] that reaches the
	// claim, with its outcome.
	Claimed func(ClaimEvent)
	// Completed is called when a claim that ran its operation ends by storing the
	// result, or failing to (Result says which).
	Completed func(CompletionEvent)
	// Released is called after every release of a key (a releasing status, an
	// operation's error or panic, a failed SPEC §7 transaction).
	Released func(ReleaseEvent)
	// RenewalFailed is called after every lease renewal that failed, including one
	// that found the key taken over.
	RenewalFailed func(RenewalEvent)
	// LeaseLost is called when an operation's context is cancelled because its lease
	// was lost (cause [ErrLeaseLost]).
	LeaseLost func(LeaseLostEvent)
	// StoreCall is called after every store call the guard makes, with its duration
	// and error: claims, polls of an in-flight wait, completions, releases and
	// renewals. (A completion inside the application's transaction, SPEC §7, is the
	// store package's call and is reported by Completed with InTx.)
	StoreCall func(StoreCallEvent)
}

// Outcome is what a claim found ([ClaimEvent.Outcome]); its values are fit for a metric
// label.
type Outcome string

// The outcomes of a claim.
const (
	// OutcomeAcquired: the key was absent or expired (or freed while waiting); the
	// caller runs the operation.
	OutcomeAcquired Outcome = "acquired"
	// OutcomeTookOver: the key's holder let its lease lapse; the caller takes the key
	// over and runs the operation again (SPEC §5.3).
	OutcomeTookOver Outcome = "took_over"
	// OutcomeReplayed: the stored result, read from the store.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeReplayedFromCache: the stored result, from the replay cache, without a
	// store call.
	OutcomeReplayedFromCache Outcome = "replayed_cache"
	// OutcomeWaitedThenReplayed: the key was in flight; the caller waited
	// (InFlightWait) and got the result once it was stored.
	OutcomeWaitedThenReplayed Outcome = "waited_replayed"
	// OutcomeNotStored: the key's operation completed without its result kept
	// (response_not_stored).
	OutcomeNotStored Outcome = "not_stored"
	// OutcomeKeyReused: the key was used with another fingerprint (key_reused).
	OutcomeKeyReused Outcome = "key_reused"
	// OutcomeInProgress: the key is held by an operation still running
	// (request_in_progress), after waiting when InFlightWait is set.
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeStoreError: a store call failed or timed out (store_unavailable).
	OutcomeStoreError Outcome = "store_error"
)

// ClaimEvent is a claim's outcome (Observer.Claimed).
type ClaimEvent struct {
	// Route names the operation: the middleware route's [RouteOptions.Name] (or the
	// request's ServeMux pattern), or [Call.Name].
	Route string
	// KeyHash is a short hash of (scope, key); never a metric label.
	KeyHash string
	// Outcome is what the claim found.
	Outcome Outcome
	// Waited is true when the caller waited for an operation in flight (InFlightWait)
	// before this outcome.
	Waited bool
	// Duration is the claim's time, store calls and waiting included.
	Duration time.Duration
	// Err is the store's error of OutcomeStoreError.
	Err error
}

// CompletionResult is how a completion ended ([CompletionEvent.Result]); its values
// are fit for a metric label.
type CompletionResult string

// The results of a completion.
const (
	// CompletionStored: the result is stored; repeats replay it.
	CompletionStored CompletionResult = "stored"
	// CompletionNotStored: the operation completed, its response was not kept
	// (streamed or too large): repeats get response_not_stored.
	CompletionNotStored CompletionResult = "not_stored"
	// CompletionLeaseLost: another caller took the key over first; the result was not
	// stored and must not be used (503).
	CompletionLeaseLost CompletionResult = "lease_lost"
	// CompletionFailed: the SPEC §7 transaction did not commit (nothing was done; the
	// key is released), or the store failed to record the result (it stands,
	// unstored; the key frees when the lease lapses). Err says which.
	CompletionFailed CompletionResult = "failed"
)

// CompletionEvent is the end of a claim that stored its result, or failed to
// (Observer.Completed).
type CompletionEvent struct {
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Result says how the completion ended.
	Result CompletionResult
	// InTx is true when the completion ran inside the application's transaction
	// (SPEC §7).
	InTx bool
	// Expired is true when the record was stored after its TTL ran out (the operation
	// ran longer than the TTL): it counts as absent already, and a repeat executes
	// again.
	Expired bool
	// Duration is the operation's time, from its claim to the end of its completion.
	Duration time.Duration
	// Err is the failure of CompletionLeaseLost and CompletionFailed.
	Err error
}

// ReleaseEvent is a release of a key (Observer.Released).
type ReleaseEvent struct {
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Duration is the operation's time, from its claim to the end of the release.
	Duration time.Duration
	// Err is the release's failure: [ErrLeaseLost] when the key was no longer held
	// (taken over, or completed by a §7 transaction), or the store's error (the key
	// frees when the lease lapses).
	Err error
}

// RenewalEvent is a lease renewal that failed (Observer.RenewalFailed).
type RenewalEvent struct {
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Err is the renewal's error: [ErrLeaseLost] when the key was taken over.
	Err error
}

// LeaseLostCause says why a lease was lost ([LeaseLostEvent.Cause]).
type LeaseLostCause string

// The causes of a lost lease.
const (
	// LeaseTakenOver: a renewal found the key no longer held (another caller took it
	// over after the lease lapsed).
	LeaseTakenOver LeaseLostCause = "taken_over"
	// LeaseExpired: the lease reached its end (less the margin) without a successful
	// renewal (the store failed or stalled).
	LeaseExpired LeaseLostCause = "expired"
)

// LeaseLostEvent is an operation cancelled because its lease was lost
// (Observer.LeaseLost).
type LeaseLostEvent struct {
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Cause says why.
	Cause LeaseLostCause
}

// StoreOp names a store call ([StoreCallEvent.Op]); its values are fit for a metric
// label.
type StoreOp string

// The store calls the guard makes.
const (
	StoreOpClaim    StoreOp = "claim"    // Store.RecordClaim
	StoreOpWait     StoreOp = "wait"     // Store.RecordGet, polling an in-flight key
	StoreOpComplete StoreOp = "complete" // Store.RecordComplete
	StoreOpRelease  StoreOp = "release"  // Store.RecordRelease
	StoreOpRenew    StoreOp = "renew"    // Store.RecordRenew
)

// StoreCallEvent is one store call (Observer.StoreCall).
type StoreCallEvent struct {
	// Route is as in [ClaimEvent].
	Route string
	// Op is the call.
	Op StoreOp
	// Duration is the call's time, by the host's clock.
	Duration time.Duration
	// Err is the call's error, nil on success. [ErrLeaseLost] and [ErrNotFound] are
	// answers of the store, not failures of it.
	Err error
}

// The observer's calls, each a no-op when the observer or its func is nil.

func (h *Handle) observing() bool { return h.g.cfg.Observer != nil }

// observeClaim reports the claim's outcome, begun at start.
func (h *Handle) observeClaim(o Outcome, waited bool, start time.Time, err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.Claimed != nil {
		ob.Claimed(ClaimEvent{Route: h.route, KeyHash: h.keyHash, Outcome: o, Waited: waited,
			Duration: time.Since(start), Err: err})
	}
}

func (h *Handle) observeCompletion(r CompletionResult, inTx bool, err error) {
	h.observeCompletionExpired(r, inTx, false, err)
}

func (h *Handle) observeCompletionExpired(r CompletionResult, inTx, expired bool, err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.Completed != nil {
		ob.Completed(CompletionEvent{Route: h.route, KeyHash: h.keyHash, Result: r, InTx: inTx,
			Expired: expired, Duration: time.Since(h.claimStartedReal), Err: err})
	}
}

func (h *Handle) observeRelease(err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.Released != nil {
		ob.Released(ReleaseEvent{Route: h.route, KeyHash: h.keyHash,
			Duration: time.Since(h.claimStartedReal), Err: err})
	}
}

func (h *Handle) observeRenewalFailed(err error) {
	if ob := h.g.cfg.Observer; ob != nil && ob.RenewalFailed != nil {
		ob.RenewalFailed(RenewalEvent{Route: h.route, KeyHash: h.keyHash, Err: err})
	}
}

func (h *Handle) observeLeaseLost(cause LeaseLostCause) {
	if ob := h.g.cfg.Observer; ob != nil && ob.LeaseLost != nil {
		ob.LeaseLost(LeaseLostEvent{Route: h.route, KeyHash: h.keyHash, Cause: cause})
	}
}

// storeCallStart returns the time a store call starts when StoreCall is observed, and
// the zero time otherwise (no clock read).
func (h *Handle) storeCallStart() time.Time {
	if ob := h.g.cfg.Observer; ob != nil && ob.StoreCall != nil {
		return time.Now()
	}
	return time.Time{}
}

// observeStoreCall reports a store call that began at start (zero: not observed).
func (h *Handle) observeStoreCall(op StoreOp, start time.Time, err error) {
	if start.IsZero() {
		return
	}
	h.g.cfg.Observer.StoreCall(StoreCallEvent{Route: h.route, Op: op, Duration: time.Since(start), Err: err})
}
