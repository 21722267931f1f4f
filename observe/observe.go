package observe

import (
	"context"
	"time"
)

// Observer is told what the guard and the middleware do (SPEC §15): every claim's
// outcome, every completion and release, every failed renewal and lost lease, every
// store call with its duration, and the steps and resumes of resumable operations
// (SPEC §13). It is a struct of optional funcs, as
// net/http/httptrace's ClientTrace is: a nil Observer, or a nil func, costs nothing.
// Set it as idem.Config.Observer or idem.GuardConfig.Observer.
//
// The funcs are called synchronously on the goroutine doing the work (the request's,
// or a heartbeat's timer), possibly concurrently: they must be safe for concurrent use
// and quick (count, observe a histogram, add a span event), never block.
//
// Events carry what metrics and traces need for labels and attributes — an outcome,
// a store operation, a route name, a duration, an error — and never a key, a body or
// a lock token; KeyHash is a short hash of (scope, key), for correlating logs and
// traces, never for a metric label. Each event's Context is the caller's, for an
// adapter's parent span. The adapters of package idemprom (Prometheus:
// idem_claims_total{route, outcome}, idem_store_duration_seconds{op}, ...) and
// idemotel (OpenTelemetry spans and metrics) are built on it; [MultiObserver] tells
// several observers, such as one of them and the application's own.
type Observer struct {
	// Claimed is called once for every keyed request or idem.Guard.Begin that reaches the
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
	// was lost (cause idem.ErrLeaseLost).
	LeaseLost func(LeaseLostEvent)
	// StoreCall is called after every store call the guard makes, with its duration
	// and error: claims, polls of an in-flight wait, completions, releases, renewals,
	// the results saved by idem.Step and the queries of a idem.Completer. (A completion or a
	// step inside the application's transaction, SPEC §7 and §13, is the store
	// package's call and is reported by Completed with InTx, or by Step; the
	// background watch of a claim cut off by StoreTimeout is not reported.)
	StoreCall func(StoreCallEvent)
	// Step is called for every step of a resumable operation (SPEC §13) that
	// committed, returned its saved result instead of running (a resume), or failed
	// to commit.
	Step func(StepEvent)
	// Resumed is called for every record a idem.Completer resumed, failed to resume,
	// found taken by another caller, or found without a resume function (at every
	// attempt, which such a record gets with the backoff of a failure).
	Resumed func(ResumeEvent)
	// Unfinished is called at the end of every pass of a idem.Completer with the store's
	// unfinished operations (SPEC §13): how many, and the oldest one's age. Every
	// process's completer counts the whole store, so each reports the same numbers.
	Unfinished func(UnfinishedEvent)
}

// Outcome is what a claim found ([ClaimEvent.Outcome]); its values are fit for a metric
// label.
type Outcome string

// The outcomes of a claim.
const (
	// OutcomeAcquired: the key was absent or expired (or freed while waiting); the
	// caller runs the operation.
	OutcomeAcquired Outcome = "acquired"
	// OutcomeTookOver: the key's holder let its lease lapse (it died or stalled); the
	// caller takes the key over and runs the operation again, resuming after its last
	// committed step (SPEC §5.3, §13).
	OutcomeTookOver Outcome = "took_over"
	// OutcomeResumed: the key's holder released it after one of its steps committed
	// (it answered an error, such as a 503 for a processor that was down), which
	// ends the lease and keeps the record; the caller takes the key and resumes the
	// operation after its last committed step (SPEC §13). Nothing died.
	OutcomeResumed Outcome = "resumed"
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
	// OutcomeUnknown: the key's holder died under the policy [LapseUnknown]; the
	// record answers outcome_unknown until an operator resolves it (SPEC §13). The
	// claim that found the lease lapsed stored that answer.
	OutcomeUnknown Outcome = "outcome_unknown"
	// OutcomeQuotaExceeded: the call's scope reached a bound of its own (SPEC §19:
	// calls under way, or bytes stored in the window); nothing was claimed (429
	// quota_exceeded). Err is the idem.QuotaError naming the bound.
	OutcomeQuotaExceeded Outcome = "quota_exceeded"
)

// ClaimEvent is a claim's outcome (Observer.Claimed).
type ClaimEvent struct {
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do) without its cancellation: its values, such as a trace's
	// span for an adapter's parent span. It is not for deadlines, nor to keep.
	Context context.Context
	// Route names the operation: the middleware route's idem.RouteOptions.Name (or the
	// request's ServeMux pattern), or idem.Call.Name.
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
	// Err is the store's error of OutcomeStoreError, or the bound of
	// OutcomeQuotaExceeded.
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
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do) without its cancellation: its values, such as a trace's
	// span for an adapter's parent span. It is not for deadlines, nor to keep.
	Context context.Context
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
	// StoreDuration is the time of the completion's store call; zero when InTx (the
	// application's transaction made it).
	StoreDuration time.Duration
	// Err is the failure of CompletionLeaseLost and CompletionFailed.
	Err error
}

// ReleaseEvent is a release of a key (Observer.Released).
type ReleaseEvent struct {
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do) without its cancellation: its values, such as a trace's
	// span for an adapter's parent span. It is not for deadlines, nor to keep.
	Context context.Context
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Duration is the operation's time, from its claim to the end of the release.
	Duration time.Duration
	// StoreDuration is the time of the release's store call; zero when the
	// application's transaction released the key (a idem.RouteOptions.ClaimInHandler
	// route whose response releases it).
	StoreDuration time.Duration
	// Err is the release's failure: idem.ErrLeaseLost when the key was no longer held
	// (taken over, or completed by a §7 transaction), or the store's error (the key
	// frees when the lease lapses).
	Err error
}

// RenewalEvent is a lease renewal that failed (Observer.RenewalFailed).
type RenewalEvent struct {
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do) without its cancellation: its values, such as a trace's
	// span for an adapter's parent span. It is not for deadlines, nor to keep.
	Context context.Context
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Err is the renewal's error: idem.ErrLeaseLost when the key was taken over.
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
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do) without its cancellation: its values, such as a trace's
	// span for an adapter's parent span. It is not for deadlines, nor to keep.
	Context context.Context
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
	StoreOpClaim         StoreOp = "claim"          // Store.RecordClaim
	StoreOpWait          StoreOp = "wait"           // Store.RecordGet, polling an in-flight key
	StoreOpLookup        StoreOp = "lookup"         // Store.RecordGet, a route's read of its key while retries are frequent
	StoreOpComplete      StoreOp = "complete"       // Store.RecordComplete
	StoreOpRelease       StoreOp = "release"        // Store.RecordRelease
	StoreOpRenew         StoreOp = "renew"          // Store.RecordRenew
	StoreOpStep          StoreOp = "step"           // Store.RecordStep, saving a result of idem.Step
	StoreOpListResumable StoreOp = "list_resumable" // Store.RecordListResumable, a Completer's query
	// StoreOpCountUnfinished is Store.RecordCountUnfinished, a Completer's count of
	// unfinished operations.
	StoreOpCountUnfinished StoreOp = "count_unfinished"
)

// StoreCallEvent is one store call (Observer.StoreCall).
type StoreCallEvent struct {
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do) without its cancellation: its values, such as a trace's
	// span for an adapter's parent span. It is not for deadlines, nor to keep.
	Context context.Context
	// Route is as in [ClaimEvent].
	Route string
	// Op is the call.
	Op StoreOp
	// Duration is the call's time, by the host's clock.
	Duration time.Duration
	// Err is the call's error, nil on success. idem.ErrLeaseLost and [ErrNotFound] are
	// answers of the store, not failures of it.
	Err error
}

// StepResult is how a step ended ([StepEvent.Result]); its values are fit for a metric
// label.
type StepResult string

// The results of a step.
const (
	// StepCommitted: the step's result (and, with a store package's step helper, its
	// writes) committed with the record's new recovery point.
	StepCommitted StepResult = "committed"
	// StepSaved: the step had committed in an earlier run of the operation (before
	// its holder died or released the key); its saved result was returned without
	// running it again.
	StepSaved StepResult = "saved"
	// StepLeaseLost: the fence found the key taken over; nothing committed and the
	// operation's context is cancelled.
	StepLeaseLost StepResult = "lease_lost"
	// StepFailed: the step's transaction did not commit, or saving its result failed.
	StepFailed StepResult = "failed"
)

// StepEvent is a step of a resumable operation (Observer.Step).
type StepEvent struct {
	// Context is the caller's context (the request's, or the one given to
	// idem.Guard.Begin or idem.Do; a Completer's for a resume) without its cancellation: its
	// values, such as a trace's span for an adapter's parent span. It is not for
	// deadlines, nor to keep.
	Context context.Context
	// Route and KeyHash are as in [ClaimEvent].
	Route   string
	KeyHash string
	// Step is the step's name, as the operation gave it.
	Step string
	// Result says how the step ended.
	Result StepResult
	// Err is the failure of StepLeaseLost and StepFailed.
	Err error
}

// ResumeResult is what a idem.Completer did with a resumable record
// ([ResumeEvent.Result]); its values are fit for a metric label.
type ResumeResult string

// The results of a resume.
const (
	// ResumeResumed: the completer took the record over, ran its resume function and
	// stored the result.
	ResumeResumed ResumeResult = "resumed"
	// ResumeFailed: the takeover, the resume function or the completion failed; the
	// record is kept and tried again after a backoff.
	ResumeFailed ResumeResult = "failed"
	// ResumeTaken: another process's completer, or the client's retry, held or
	// finished the record first.
	ResumeTaken ResumeResult = "taken"
	// ResumeNoFunction: the record's operation has no resume function in this process
	// (idem.Guard.RegisterResume); it waits for the client's retry, or another process's
	// completer, and this one looks again after the backoff of a failure.
	ResumeNoFunction ResumeResult = "no_function"
)

// UnfinishedEvent is what a idem.Completer's pass counted of the store's unfinished
// operations (Observer.Unfinished): records in flight after a step committed, which
// never expire until they are completed or an operator settles them (SPEC §13).
type UnfinishedEvent struct {
	// Context is the context of the completer's pass.
	Context context.Context
	// Count is the number of unfinished operations in the store, those running now
	// included.
	Count int
	// OldestAge is how long the oldest of them has existed (since its key was
	// claimed); 0 when there is none.
	OldestAge time.Duration
}

// ResumeEvent is a record a idem.Completer found resumable (Observer.Resumed).
type ResumeEvent struct {
	// Context is the context of the completer's pass (idem.Completer.Run or
	// idem.Completer.Pass).
	Context context.Context
	// Route is the record's operation name (idem.Call.Name, idem.RouteOptions.Name), as the
	// Route of the operation's other events; KeyHash is as in [ClaimEvent].
	Route   string
	KeyHash string
	// RecoveryPoint is the record's last committed step, where the resume starts.
	RecoveryPoint string
	// Result says what the completer did.
	Result ResumeResult
	// Duration is the resume's time, from the takeover to the end of the completion;
	// zero when nothing ran.
	Duration time.Duration
	// Err is the failure of ResumeFailed.
	Err error
}

// Multi returns an Observer that tells each of observers of every event, in
// their order: say, a metrics adapter's and the application's own. Nil observers and
// nil funcs are skipped; it returns nil when no func is left, so that it costs
// nothing then either.
func Multi(observers ...*Observer) *Observer {
	m := &Observer{
		Claimed:       fanOut(observers, func(o *Observer) func(ClaimEvent) { return o.Claimed }),
		Completed:     fanOut(observers, func(o *Observer) func(CompletionEvent) { return o.Completed }),
		Released:      fanOut(observers, func(o *Observer) func(ReleaseEvent) { return o.Released }),
		RenewalFailed: fanOut(observers, func(o *Observer) func(RenewalEvent) { return o.RenewalFailed }),
		LeaseLost:     fanOut(observers, func(o *Observer) func(LeaseLostEvent) { return o.LeaseLost }),
		StoreCall:     fanOut(observers, func(o *Observer) func(StoreCallEvent) { return o.StoreCall }),
		Step:          fanOut(observers, func(o *Observer) func(StepEvent) { return o.Step }),
		Resumed:       fanOut(observers, func(o *Observer) func(ResumeEvent) { return o.Resumed }),
		Unfinished:    fanOut(observers, func(o *Observer) func(UnfinishedEvent) { return o.Unfinished }),
	}
	if m.Claimed == nil && m.Completed == nil && m.Released == nil && m.RenewalFailed == nil &&
		m.LeaseLost == nil && m.StoreCall == nil && m.Step == nil && m.Resumed == nil && m.Unfinished == nil {
		return nil
	}
	return m
}

// fanOut returns a func calling field of each observer that has it, or nil when none
// has.
func fanOut[E any](observers []*Observer, field func(*Observer) func(E)) func(E) {
	var fs []func(E)
	for _, o := range observers {
		if o != nil && field(o) != nil {
			fs = append(fs, field(o))
		}
	}
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(e E) {
		for _, f := range fs {
			f(e)
		}
	}
}
