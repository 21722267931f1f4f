// Package admin is what an operator's tool needs of an idempotency store beyond
// [idemstore.Store] (SPEC §15): read one record whatever its state, list records, delete
// one key or every key of a scope — a customer's erasure request — and settle a key
// whose outcome is unknown or whose operation is unfinished (SPEC §13). The `idem
// keys` command is built on it.
//
// Every store package (store/sqlite, store/postgres, store/redis, store/memory)
// implements [idemstore.Store], and runs the one conformance suite in admin/admintest. A store
// declares what it cannot do through [Store.AdminCapabilities] (Redis cannot list: it
// keeps only a digest of each scope and key).
//
// Nothing here is needed to serve requests: the middleware uses [idemstore.Store] only.
package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// Store is the operator's view of an idempotency store. Methods are named
// noun-then-verb and take a params struct, as [idemstore.Store]'s are; time-dependent
// decisions use the store's clock unless the params carry a non-zero Now (tests).
// Errors are normalised at the store's edge as [idemstore.Store]'s are: a missing record is
// [idemstore.ErrNotFound].
type Store interface {
	// RecordInspect reads the record of (Scope, Key) in any state, expired or not
	// (until it is deleted), with the store's time of the read. An absent record is
	// [idemstore.ErrNotFound]. The response's headers and body are returned only when
	// params.Body is set; its status and size always are.
	RecordInspect(ctx context.Context, params *RecordInspectParams) (*RecordInspectResult, error)

	// RecordList returns up to params.Limit records in (scope, key) order, starting
	// after (params.AfterScope, params.AfterKey), optionally of one scope and one state.
	// Expired records that are not deleted yet are listed too. Without a scope it
	// leaves out idem's own records ([idemstore.ReservedScope]: the MAC secret, the
	// store's state, the releases that served it), which a list of that scope
	// shows. It never returns
	// response headers, bodies or step results (Steps), but the recovery point and
	// operation name. A store whose AdminCapabilities().List is false
	// returns an error wrapping [errors.ErrUnsupported] that says why.
	RecordList(ctx context.Context, params *RecordListParams) (*RecordListResult, error)

	// RecordDelete deletes the record of (Scope, Key) in any state, expired or not. An
	// absent record is [idemstore.ErrNotFound]. A record in flight under a live lease is
	// refused with [ErrLeaseLive] unless params.Force: its request is executing, and a
	// retry sent after the delete would execute again beside it. Deleting it anyway is
	// safe for the store — the holder's fenced completion then fails, and its SPEC §7
	// transaction rolls back — but not for effects outside the store. An unfinished
	// operation's record ([idemstore.Record.Unfinished]) is refused with [ErrUnfinished] unless
	// params.Abandon: its committed steps stay done and nothing will finish them, and
	// the key's next request starts a new operation (whose outside calls carry the same
	// derived keys when it has the same parameters, SPEC §13). The lease
	// is judged first: a live unfinished record needs both.
	RecordDelete(ctx context.Context, params *RecordDeleteParams) error

	// RecordDeleteScope deletes every record of params.Scope, in bounded batches (each
	// one short transaction or script), and leaves every other scope untouched. Records
	// in flight under a live lease are kept and counted unless params.Force, and
	// unfinished operations unless params.Abandon. On an error it returns what it
	// deleted so far with the error.
	RecordDeleteScope(ctx context.Context, params *RecordDeleteScopeParams) (*RecordDeleteScopeResult, error)

	// RecordResolve settles the record of (Scope, Key), once the operator knows what its
	// operation did: one that a claim under the policy [idem.LapseUnknown] completed as
	// outcome unknown, or an unfinished operation ([idemstore.Record.Unfinished], SPEC §13) that
	// nothing can finish (its foreign system gone, its resume function removed). With
	// params.Response nil it releases the key (deletes the record: the next request
	// with the key executes afresh); otherwise it completes the record with
	// params.Response, which every repeat then gets: an outcome-unknown record keeps its
	// expiry, an unfinished one expires its TTL (expires_at − created_at) after the
	// resolution. It checks and changes the record in one atomic step. An absent or
	// expired record is [idemstore.ErrNotFound]; an unfinished one whose lease is live (its
	// operation is running now) is [ErrLeaseLive]; any other record is
	// [ErrNotOutcomeUnknown]; all stay untouched (RecordDelete removes those).
	RecordResolve(ctx context.Context, params *RecordResolveParams) error

	// AdminCapabilities declares what this store can and cannot do.
	AdminCapabilities() Capabilities
}

// Capabilities declares what a [Store] can do, so that tools and the conformance
// suite adapt without type switches.
type Capabilities struct {
	// List is true when RecordList works. Redis cannot list: it keys each record by a
	// digest of its scope and key, and keeps neither.
	List bool
}

// ErrLeaseLive is returned by [Store.RecordDelete] for a record in flight under a
// live lease, which it deletes only when forced.
var ErrLeaseLive = errors.New("idem admin: record is in flight under a live lease")

// ErrNotOutcomeUnknown is returned by [Store.RecordResolve] for a record whose
// outcome is known and whose operation is not unfinished (completed with a response,
// or in flight before any step committed): there is nothing to resolve, and the
// record is untouched.
var ErrNotOutcomeUnknown = errors.New("idem admin: the record's outcome is not unknown, nor is its operation unfinished")

// ErrUnfinished is returned by [Store.RecordDelete] for an unfinished operation's
// record ([idemstore.Record.Unfinished]), which it deletes only when told to abandon it.
var ErrUnfinished = errors.New("idem admin: the record is an unfinished operation")

// StateOutcomeUnknown, as [RecordListParams.State], lists the completed records
// whose outcome is unknown (SPEC §13): those [Store.RecordResolve] resolves. It is not
// a state of its own: such records are completed, with [Record.OutcomeUnknown] set.
const StateOutcomeUnknown idemstore.State = "outcome_unknown"

// StateUnfinished, as [RecordListParams.State], lists the unfinished operations (SPEC
// §13): records in flight whose recovery point advanced, whether their lease is live
// or not, which never expire until they are completed or settled. It is not a state
// of its own: such records are in flight, with a RecoveryPoint.
const StateUnfinished idemstore.State = "unfinished"

// Limits of [RecordListParams.Limit].
const (
	// DefaultListLimit is the number of records a list returns when Limit is 0.
	DefaultListLimit = 100
	// MaxListLimit is the largest Limit.
	MaxListLimit = 1000
)

// DefaultDeleteBatch is the number of records one batch of [Store.RecordDeleteScope]
// deletes when BatchSize is 0.
const DefaultDeleteBatch = 1000

// Record is one idempotency record as an operator sees it: everything but the lock
// token, and the response's headers and body only when asked for.
type Record struct {
	// Scope and Key identify the record (SPEC §3).
	Scope string
	Key   string
	// ID is the record id: derived from the request by the claim that created the
	// record (the same for every record of one request; random for records of idem
	// 0.2.0 and older), kept across takeovers (SPEC §13).
	ID string
	// State is in flight or completed.
	State idemstore.State
	// Fingerprint identifies the request that created the record (SPEC §4).
	Fingerprint idem.Fingerprint
	// CreatedAt is when the key was claimed.
	CreatedAt time.Time
	// ExpiresAt is when the record stops counting (SPEC §8), unless it is an
	// unfinished operation, which never expires; it may still be listed until it is
	// deleted.
	ExpiresAt time.Time
	// LeaseEnd is when the holder's lease lapses (in flight only; zero otherwise).
	LeaseEnd time.Time
	// RecoveryPoint is the last committed step of a resumable handler (SPEC §13).
	RecoveryPoint string
	// Operation names the operation whose steps wrote the record (SPEC §13).
	Operation string
	// Steps are the results the committed steps saved, in the encoding of
	// [idemstore.Record.Steps]: only from RecordInspect.
	Steps []byte
	// OutcomeUnknown is true when the record was completed as outcome unknown (SPEC
	// §13): repeats get 500 outcome_unknown until RecordResolve.
	OutcomeUnknown bool
	// Status is the stored response's status (completed only).
	Status int
	// NotStored is true when the operation completed but its response was not kept
	// (SPEC §6).
	NotStored bool
	// BodySize is the stored response body's length in bytes.
	BodySize int
	// Header and Body are the stored response's headers and body: only from
	// RecordInspect with Body set, and only for a completed record.
	Header http.Header
	Body   []byte
}

// Unfinished reports whether the record is an unfinished operation (SPEC §13): in
// flight after one of its steps committed. It never expires.
func (r *Record) Unfinished() bool {
	return r.State == idemstore.StateInFlight && r.RecoveryPoint != ""
}

// Expired reports whether the record counts as absent at now (SPEC §8): its
// ExpiresAt passed, and it is not an unfinished operation.
func (r *Record) Expired(now time.Time) bool { return !r.Unfinished() && !now.Before(r.ExpiresAt) }

// DerivedKey returns the derived key of the outside call made at step by the record's
// operation (SPEC §13, [idemstore.Record.DerivedKey]): what a card processor or idem
// proxy's upstream was sent.
func (r *Record) DerivedKey(step string) string { return idemstore.DeriveKey(r.ID, step) }

// LeaseLive reports whether the record is in flight under a live lease at now.
func (r *Record) LeaseLive(now time.Time) bool {
	return r.State == idemstore.StateInFlight && now.Before(r.LeaseEnd)
}

// FromRecord returns the operator's view of rec; with body set it keeps the response's
// headers and body (shared with rec, not copied).
func FromRecord(rec *idemstore.Record, body bool) *Record {
	r := &Record{
		Scope: rec.Scope, Key: rec.Key, ID: rec.ID, State: rec.State,
		Fingerprint: rec.Fingerprint, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt,
		RecoveryPoint: rec.RecoveryPoint, Operation: rec.Operation, Steps: rec.Steps,
	}
	if rec.State == idemstore.StateInFlight {
		r.LeaseEnd = rec.LeaseEnd
	}
	if resp := rec.Response; resp != nil {
		r.Status, r.NotStored, r.BodySize, r.OutcomeUnknown = resp.Status, resp.NotStored, len(resp.Body), resp.OutcomeUnknown
		if body {
			r.Header, r.Body = resp.Header, resp.Body
		}
	}
	return r
}

// RecordInspectParams are the parameters of [Store.RecordInspect].
type RecordInspectParams struct {
	Scope string
	Key   string
	// Body asks for the stored response's headers and body too.
	Body bool
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// RecordInspectResult is the answer of [Store.RecordInspect].
type RecordInspectResult struct {
	Record *Record
	// Now is the store's time at the read: compare ExpiresAt and LeaseEnd with it.
	Now time.Time
}

// RecordListParams are the parameters of [Store.RecordList].
type RecordListParams struct {
	// Scope, when not empty, lists that scope's records only.
	Scope string
	// State, when not empty, lists records in that state only: [idemstore.StateInFlight],
	// [idemstore.StateCompleted] (outcome unknown or not), [StateOutcomeUnknown] or
	// [StateUnfinished].
	State idemstore.State
	// AfterScope and AfterKey, when AfterKey is not empty, start the list after that
	// record (a cursor: the last record of the previous page).
	AfterScope string
	AfterKey   string
	// Limit bounds the number of records returned: 1 to [MaxListLimit]. Defaults to
	// [DefaultListLimit].
	Limit int
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// RecordListResult is the answer of [Store.RecordList].
type RecordListResult struct {
	// Records are in (scope, key) order, byte-wise.
	Records []*Record
	// More is true when records follow the last one: list again after it.
	More bool
	// Now is the store's time at the read.
	Now time.Time
}

// RecordDeleteParams are the parameters of [Store.RecordDelete].
type RecordDeleteParams struct {
	Scope string
	Key   string
	// Force deletes a record in flight under a live lease too.
	Force bool
	// Abandon deletes an unfinished operation's record too.
	Abandon bool
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// RecordDeleteScopeParams are the parameters of [Store.RecordDeleteScope].
type RecordDeleteScopeParams struct {
	// Scope is the scope whose records are deleted (never empty).
	Scope string
	// Force deletes records in flight under a live lease too.
	Force bool
	// Abandon deletes unfinished operations' records too.
	Abandon bool
	// BatchSize bounds the records one batch deletes. Defaults to
	// [DefaultDeleteBatch].
	BatchSize int
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// RecordResolveParams are the parameters of [Store.RecordResolve].
type RecordResolveParams struct {
	Scope string
	Key   string
	// Response, when set, completes the record with it (status, stored headers,
	// body); nil releases the key.
	Response *idem.Response
	// Now, when non-zero, replaces the store's clock (tests only).
	Now time.Time
}

// RecordDeleteScopeResult is the answer of [Store.RecordDeleteScope].
type RecordDeleteScopeResult struct {
	// Deleted is the number of records deleted.
	Deleted int
	// Kept is the number of records in flight under a live lease that were kept (0
	// when forced), unfinished ones kept without Abandon aside.
	Kept int
	// Unfinished is the number of unfinished operations that were kept (0 when
	// abandoned).
	Unfinished int
}

// ListLimit returns p.Limit with its default applied, or an error naming the field.
func (p *RecordListParams) ListLimit() (int, error) {
	switch {
	case p.Limit == 0:
		return DefaultListLimit, nil
	case p.Limit < 0 || p.Limit > MaxListLimit:
		return 0, errors.New("idem admin: RecordListParams.Limit must be between 1 and 1000")
	}
	return p.Limit, nil
}

// ResolveError is the error of a [Store.RecordResolve] that found nothing to resolve,
// given the record as read (nil when absent) at now: [idemstore.ErrNotFound] for an absent
// or expired record, [ErrLeaseLive] for an unfinished one whose lease is live,
// [ErrNotOutcomeUnknown] for any other, nil for a record whose outcome is unknown or
// an unfinished one waiting to be resumed.
func ResolveError(rec *idemstore.Record, now time.Time) error {
	switch {
	case rec == nil || rec.Expired(now):
		return idemstore.ErrNotFound
	case rec.Unfinished() && rec.LeaseLive(now):
		return ErrLeaseLive
	case rec.Unfinished():
		return nil
	case rec.Response == nil || !rec.Response.OutcomeUnknown:
		return ErrNotOutcomeUnknown
	}
	return nil
}

// DeleteError is the error of a [Store.RecordDelete] of rec, as read (nil when
// absent) at now with params p: [idemstore.ErrNotFound], [ErrLeaseLive] without Force,
// [ErrUnfinished] without Abandon, or nil when it may be deleted.
func DeleteError(rec *idemstore.Record, now time.Time, p *RecordDeleteParams) error {
	switch {
	case rec == nil:
		return idemstore.ErrNotFound
	case rec.LeaseLive(now) && !p.Force:
		return ErrLeaseLive
	case rec.Unfinished() && !p.Abandon:
		return ErrUnfinished
	}
	return nil
}

// ListFilter is a list's filter as a store applies it ([RecordListParams.Filter]).
type ListFilter struct {
	// State is the state to match, "" for any.
	State idemstore.State
	// OutcomeUnknown: only completed records whose outcome is unknown
	// ([StateOutcomeUnknown]).
	OutcomeUnknown bool
	// Unfinished: only unfinished operations ([StateUnfinished]); State is then
	// in flight.
	Unfinished bool
}

// Filter returns the list's filter as a store applies it.
func (p *RecordListParams) Filter() ListFilter {
	switch p.State {
	case StateOutcomeUnknown:
		return ListFilter{State: idemstore.StateCompleted, OutcomeUnknown: true}
	case StateUnfinished:
		return ListFilter{State: idemstore.StateInFlight, Unfinished: true}
	}
	return ListFilter{State: p.State}
}

// Matches reports whether rec passes the filter (for stores that filter in Go).
func (f ListFilter) Matches(rec *idemstore.Record) bool {
	switch {
	case f.State != "" && rec.State != f.State:
		return false
	case f.OutcomeUnknown && (rec.Response == nil || !rec.Response.OutcomeUnknown):
		return false
	case f.Unfinished && !rec.Unfinished():
		return false
	}
	return true
}

// Batch returns p.BatchSize with its default applied.
func (p *RecordDeleteScopeParams) Batch() int {
	if p.BatchSize <= 0 {
		return DefaultDeleteBatch
	}
	return p.BatchSize
}

// Validate checks that the scope is not empty: deleting "every record of no scope"
// is always a mistake.
func (p *RecordDeleteScopeParams) Validate() error {
	if p.Scope == "" {
		return errors.New("idem admin: RecordDeleteScopeParams.Scope is required")
	}
	return nil
}
