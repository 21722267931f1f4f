package idemstore

import (
	"context"
	"errors"
	"time"
)

// Store keeps idempotency records durably and changes them atomically. Every store
// package (store/sqlite, store/postgres, store/redis, store/memory) implements it and
// passes the conformance suite in store/storetest.
//
// Methods are named noun-then-verb and take a params struct. Every time-dependent
// decision uses the store's own clock (clock_timestamp() in PostgreSQL, TIME in Redis,
// the host clock for SQLite) unless the params carry a non-zero Now, which tests use to
// inject time. Errors are normalised at each store's edge: a missing record is
// [ErrNotFound], a fenced operation whose token no longer holds the record is
// [ErrLeaseLost], and lock contention inside the store (such as SQLite's busy state) is
// retried within the context's deadline rather than returned.
//
// Ownership: a store does not keep params or anything they point to (a response's
// body and headers included) after the call returns (for a SPEC §7 completion, after
// the transaction ends); it copies what it stores. The middleware relies on this to
// pass responses that live in pooled buffers. A
// *Record or *Response that a store returns belongs to the caller, who may keep it
// (the middleware's replay cache does) and must not change it.
type Store interface {
	// RecordClaim atomically claims (Scope, Key) for a request fingerprinted
	// params.Fingerprint, in one store operation. When no live record exists (absent or
	// expired), or an in-flight record's lease lapsed and the fingerprint matches, it
	// installs an in-flight record held by params.Token and answers ClaimAcquired.
	// Otherwise it answers ClaimCompleted, ClaimInFlight or ClaimMismatch with the
	// existing record, which it leaves untouched, except that under params.OnLapse
	// [LapseUnknown] a lapsed lease is completed as outcome unknown instead of taken
	// over ([ClaimParams.Decide]). Of any number of concurrent claims of one
	// key, across goroutines and processes, exactly one is acquired (or marks it).
	RecordClaim(ctx context.Context, params *ClaimParams) (*ClaimResult, error)

	// RecordComplete stores the final response of the holder of params.Token and marks
	// the record completed, expiring at created_at + TTL, or, when its recovery point
	// advanced, at now + TTL ([Record.CompletionExpiresAt]: an operation that outlived
	// its TTL unfinished keeps its result a whole TTL). It is fenced: when the record
	// is no longer in flight under that token it changes nothing and returns
	// [ErrLeaseLost].
	RecordComplete(ctx context.Context, params *CompleteParams) error

	// RecordRelease deletes the in-flight record held by params.Token, so that a retry
	// executes afresh. Fenced like RecordComplete ([ErrLeaseLost]). A record whose
	// recovery point advanced (SPEC §13) is never deleted: its committed steps must not
	// run again. RecordRelease ends its lease instead (lease end = now, no holder: the
	// token is emptied), so that a retry or the idem.Completer takes it over at once and
	// resumes after its last committed step.
	RecordRelease(ctx context.Context, params *ReleaseParams) error

	// RecordRenew extends the lease of the holder of params.Token to now + Lease and
	// returns the new lease end. Fenced like RecordComplete ([ErrLeaseLost]).
	RecordRenew(ctx context.Context, params *RenewParams) (time.Time, error)

	// RecordGet reads one record by (Scope, Key). An absent or expired record is
	// [ErrNotFound]; an unfinished one ([Record.Unfinished]) never expires.
	RecordGet(ctx context.Context, params *GetParams) (*Record, error)

	// RecordDeleteExpired deletes up to params.Limit records whose expires_at is before
	// now − params.Retention and returns how many it deleted. It never deletes an
	// in-flight record whose lease is live, nor an unfinished operation's record
	// ([Record.Unfinished], SPEC §13). Stores that expire records themselves
	// (Capabilities.BatchedCleanup false) return 0, nil.
	RecordDeleteExpired(ctx context.Context, params *DeleteExpiredParams) (int, error)

	// RecordStep commits one step of the operation of the holder of params.Token (SPEC
	// §13): it sets the record's recovery point, saved step results and operation name.
	// Fenced like RecordComplete ([ErrLeaseLost]). A SQL store's package also runs it
	// inside the application's transaction, so that the step's writes and the recovery
	// point commit together (sqlite.Step, postgres.Step). A store whose
	// Capabilities().RecoveryPoints is false returns an error wrapping
	// [errors.ErrUnsupported].
	RecordStep(ctx context.Context, params *StepParams) error

	// RecordListResumable returns up to params.Limit records that the idem.Completer may
	// resume: in flight, their recovery point advanced, their lease lapsed (or ended by
	// a release), however long ago their TTL ran out (such a record never expires), in
	// (scope, key) order after (params.AfterScope, params.AfterKey). It never returns
	// responses. SQL stores answer it from an index of such records. A store whose
	// Capabilities().RecoveryPoints is false returns an error wrapping
	// [errors.ErrUnsupported].
	RecordListResumable(ctx context.Context, params *ListResumableParams) ([]*Record, error)

	// RecordCountUnfinished counts the unfinished operations of the whole store
	// ([Record.Unfinished]: in flight after a step committed, whether their lease is
	// live or not) and finds the oldest one's creation, so that every process's
	// idem.Completer reports the same numbers (SPEC §13, §15). SQL stores answer it from
	// the index of such records. A store whose Capabilities().RecoveryPoints is false
	// returns an error wrapping [errors.ErrUnsupported].
	RecordCountUnfinished(ctx context.Context, params *CountUnfinishedParams) (*CountUnfinishedResult, error)

	// Ping reports whether the store answers; /healthz uses it.
	Ping(ctx context.Context) error

	// Capabilities declares what this store can and cannot do.
	Capabilities() Capabilities
}

// Capabilities declares what a store can do, so that callers and the conformance suite
// adapt without type switches.
type Capabilities struct {
	// Transactions is true when the store package offers the SPEC §7 helper that
	// completes the record inside the application's own database transaction.
	Transactions bool
	// BatchedCleanup is true when expired records must be deleted by
	// RecordDeleteExpired; false when the store expires them itself (Redis TTLs).
	BatchedCleanup bool
	// MultiProcess is true when several processes may share the store (false for the
	// in-memory store).
	MultiProcess bool
	// RecoveryPoints is true when records carry recovery points and step results
	// (SPEC §13): RecordStep and RecordListResumable work, and a release keeps a record
	// whose recovery point advanced. False for Redis.
	RecoveryPoints bool
}

// ClaimParams are the parameters of [Store.RecordClaim].
type ClaimParams struct {
	// Scope is the authenticated principal (never empty).
	Scope string
	// Key is the parsed idempotency key.
	Key string
	// Fingerprint identifies the request.
	Fingerprint Fingerprint
	// Token is the fresh random lock token the claim installs when it acquires the key.
	Token string
	// RecordID is the record id installed when the claim creates a new record (ignored
	// on a takeover, which keeps the old one): the request's, [RecordIDFor].
	RecordID string
	// Lease is how long the claim holds the key before another request may take it over.
	Lease time.Duration
	// TTL is how long after creation the record lives (SPEC §8).
	TTL time.Duration
	// OnLapse is the operation's policy for a record in flight whose holder's lease
	// lapsed ([ClaimParams.Decide]): take it over, or, with [LapseUnknown],
	// complete it in the same atomic operation as outcome unknown (status 500,
	// Response.OutcomeUnknown, expiring at created_at + TTL) and answer ClaimCompleted
	// with it and MarkedUnknown.
	OnLapse LapsePolicy
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
	// LikelyNew is a hint: the caller expects no record of the key (the route's
	// requests seldom find one, or a read of the key just found none), so a store may
	// try the cheapest claim of a new key first (on PostgreSQL, a plain INSERT that
	// answers only the store's time) and fall back to its usual claim when the key is
	// there. It never changes the answer; a store may ignore it.
	LikelyNew bool
}

// ClaimOutcome is the answer of [Store.RecordClaim].
type ClaimOutcome int

const (
	// ClaimAcquired: the caller holds the key and must execute the operation.
	ClaimAcquired ClaimOutcome = iota
	// ClaimCompleted: the record holds a final response with a matching fingerprint.
	ClaimCompleted
	// ClaimInFlight: another holder's lease is live until Record.LeaseEnd.
	ClaimInFlight
	// ClaimMismatch: the key is used by a request with another fingerprint.
	ClaimMismatch
)

var claimOutcomeNames = [...]string{"acquired", "completed", "in_flight", "mismatch"}

func (o ClaimOutcome) String() string {
	if int(o) < len(claimOutcomeNames) {
		return claimOutcomeNames[o]
	}
	return "unknown"
}

// ClaimResult is the answer of [Store.RecordClaim].
type ClaimResult struct {
	// Outcome says what the claim found.
	Outcome ClaimOutcome
	// Record is the record after the claim: the caller's own in-flight record when
	// acquired, otherwise the existing record as found.
	Record *Record
	// TookOver is true when the claim acquired an in-flight record that had no live
	// holder: its holder's lease lapsed, or (Released) its holder released it after a
	// step committed.
	TookOver bool
	// Released is true, with TookOver, when the record had no holder because its
	// holder released it after a step committed (its token was empty, its lease
	// ended by the release, SPEC §13): the holder answered (an error), nothing died.
	// False for a lapsed lease.
	Released bool
	// MarkedUnknown is true when this claim completed the record as outcome unknown
	// (OnLapse [LapseUnknown]); the outcome is ClaimCompleted.
	MarkedUnknown bool
	// Now is the store's time at the claim.
	Now time.Time
}

// CompleteParams are the parameters of [Store.RecordComplete].
type CompleteParams struct {
	Scope string
	Key   string
	// Token is the holder's lock token.
	Token string
	// Response is the response to store.
	Response *Response
	// TTL sets expires_at = created_at + TTL, or now + TTL when the record's recovery
	// point advanced ([Record.CompletionExpiresAt]).
	TTL time.Duration
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// ReleaseParams are the parameters of [Store.RecordRelease].
type ReleaseParams struct {
	Scope string
	Key   string
	// Token is the holder's lock token.
	Token string
	// Now, when non-zero, replaces the store's clock (tests only): it is the lease end
	// of a record kept because its recovery point advanced.
	Now time.Time
}

// StepParams are the parameters of [Store.RecordStep]: what one committed step
// writes. idem.Handle.PrepareStep makes them.
type StepParams struct {
	Scope string
	Key   string
	// Token is the holder's lock token.
	Token string
	// RecoveryPoint is the step's name, the record's new recovery point.
	RecoveryPoint string
	// Steps is the record's step results after this step: the earlier ones and this
	// one's. The store keeps it byte for byte.
	Steps []byte
	// Operation is the name of the operation, kept for the idem.Completer; may be empty.
	Operation string
}

// ListResumableParams are the parameters of [Store.RecordListResumable].
type ListResumableParams struct {
	// AfterScope and AfterKey, when AfterKey is not empty, start the list after that
	// record (a cursor: the last record of the previous batch).
	AfterScope string
	AfterKey   string
	// Limit bounds how many records one call returns; it must be positive.
	Limit int
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// CountUnfinishedParams are the parameters of [Store.RecordCountUnfinished].
type CountUnfinishedParams struct {
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// CountUnfinishedResult is the answer of [Store.RecordCountUnfinished].
type CountUnfinishedResult struct {
	// Count is the number of unfinished operations.
	Count int
	// Oldest is the creation of the oldest unfinished operation; zero when Count is 0.
	Oldest time.Time
	// Now is the store's time of the count: Now − Oldest is the oldest one's age.
	Now time.Time
}

// OldestAge is how long the oldest unfinished operation has existed, 0 when there is
// none.
func (r *CountUnfinishedResult) OldestAge() time.Duration {
	if r.Count == 0 || r.Oldest.IsZero() {
		return 0
	}
	return max(r.Now.Sub(r.Oldest), 0)
}

// RenewParams are the parameters of [Store.RecordRenew].
type RenewParams struct {
	Scope string
	Key   string
	// Token is the holder's lock token.
	Token string
	// Lease is the new lease, counted from now.
	Lease time.Duration
	// TTL is the record's TTL, to keep expires_at = max(created_at + TTL, lease end).
	TTL time.Duration
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// GetParams are the parameters of [Store.RecordGet].
type GetParams struct {
	Scope string
	Key   string
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// DeleteExpiredParams are the parameters of [Store.RecordDeleteExpired].
type DeleteExpiredParams struct {
	// Retention keeps records this long after they expire.
	Retention time.Duration
	// Limit bounds how many records one call deletes.
	Limit int
	// MaxDuration, when non-zero, bounds how long a store that walks its records to
	// find the expired ones (PostgreSQL, which keeps no index of expiry: issue 41)
	// walks in one call: it stops by then and answers what it deleted, and the next
	// call walks on from there. Zero: the walk goes on until Limit records are
	// deleted or the whole table was walked. Stores that read an index of expiry
	// ignore it.
	MaxDuration time.Duration
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// ErrNotFound is returned by [Store.RecordGet] for an absent or expired record.
var ErrNotFound = errors.New("idem: record not found")

// ErrLeaseLost means the lock token no longer holds the record: another request took
// the key over after the lease lapsed, or the record was completed or released. Fenced
// store operations return it, and the handler's context is cancelled with it as cause
// when a lease renewal fails.
var ErrLeaseLost = errors.New("idem: lease lost")
