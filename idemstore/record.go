package idemstore

import (
	"bytes"
	"net/http"
	"time"
)

// State is the state of a stored record (SPEC §5).
type State string

const (
	// StateInFlight marks a record whose request is executing under a lease.
	StateInFlight State = "in_flight"
	// StateCompleted marks a record that holds the final response of its operation.
	StateCompleted State = "completed"
)

// FingerprintVersion is the version of the fingerprint algorithm this package computes.
// Records store the version they were fingerprinted with; see [Fingerprint.Matches].
const FingerprintVersion = 1

// KeyedVersionOffset is added to the version of a keyed fingerprint (SPEC §19): one
// whose sum is an HMAC, under the MAC secret of a keyring, of the version and sum of a
// fingerprint of that version (version 1001 keys version 1). Keyed and plain
// fingerprints are of different versions, and so never compared: records fingerprinted
// before a keyring was configured keep working until they expire (SPEC §4).
const KeyedVersionOffset = 1000

// Fingerprint identifies the parameters of a request (SPEC §4): a SHA-256 sum and the
// version of the canonicalisation that produced it, or with a keyring an HMAC of them
// (a keyed fingerprint, [Fingerprint.Keyed]).
type Fingerprint struct {
	// Version is the fingerprint algorithm's version, [FingerprintVersion] for new ones.
	Version int
	// Sum is the SHA-256 of the canonical request (keyed: its HMAC).
	Sum [32]byte
}

// Keyed reports whether f is a keyed fingerprint: its version is
// [KeyedVersionOffset] or more.
func (f Fingerprint) Keyed() bool { return f.Version >= KeyedVersionOffset }

// Matches reports whether a request fingerprinted as f may be served by a record
// fingerprinted as stored. Fingerprints of different versions cannot be compared; they
// are taken to match, so that a change of canonicalisation never turns a retry of an old
// record into key_reused (SPEC §4).
func (f Fingerprint) Matches(stored Fingerprint) bool {
	if f.Version != stored.Version {
		return true
	}
	return f.Sum == stored.Sum
}

// Response is a response as the store keeps it.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the stored headers only (the allow-list of Config.StoredHeaders).
	Header http.Header
	// Body is the body, byte for byte.
	Body []byte
	// NotStored is true when the operation completed but its response was not kept
	// (the handler flushed, or the body exceeded the storage limit). Duplicates then get
	// 409 response_not_stored, and the operation is never executed again.
	NotStored bool
	// OutcomeUnknown is true when the record was completed by a claim under the policy
	// [LapseUnknown] (SPEC §13): its holder died, and whether its operation's foreign
	// effects happened is unknown. Repeats get 500 outcome_unknown
	// (idem.ErrOutcomeUnknown) until an operator resolves the key. Status is 500; there is
	// no header or body: the answer is written by whoever replays it.
	OutcomeUnknown bool
}

// Equal reports whether two responses are the same, byte for byte.
func (r *Response) Equal(o *Response) bool {
	if r == nil || o == nil {
		return r == o
	}
	if r.Status != o.Status || r.NotStored != o.NotStored || r.OutcomeUnknown != o.OutcomeUnknown ||
		!bytes.Equal(r.Body, o.Body) || len(r.Header) != len(o.Header) {
		return false
	}
	for k, v := range r.Header {
		w, ok := o.Header[k]
		if !ok || len(v) != len(w) {
			return false
		}
		for i := range v {
			if v[i] != w[i] {
				return false
			}
		}
	}
	return true
}

// Record is one idempotency record, identified by (Scope, Key) (SPEC §5).
type Record struct {
	// Scope is the principal the key belongs to (SPEC §3).
	Scope string
	// Key is the idempotency key as parsed (unquoted).
	Key string
	// ID is set by the claim that creates the record and kept across takeovers. This
	// release derives it from the request ([RecordIDFor]: scope, key, fingerprint),
	// so it is unique per request, not per record: a record the same request makes
	// again (after a release, a failover that lost the first, an expiry) has the same
	// id, and so the same derived keys ([Record.DerivedKey], SPEC §13). Records of
	// idem 0.2.0 and older have random ids.
	ID string
	// Fingerprint identifies the request that created the record.
	Fingerprint Fingerprint
	// State is in flight or completed.
	State State
	// Token is the lock token of the current holder; empty once completed, and empty
	// in flight when the holder released a record whose recovery point advanced: the
	// record then waits, with its lease ended, for a retry or the idem.Completer to resume
	// it (SPEC §13).
	Token string
	// LeaseEnd is when the holder's lease lapses (in flight only).
	LeaseEnd time.Time
	// Response is the stored response (completed only).
	Response *Response
	// RecoveryPoint is the name of the last step of the operation that committed
	// (SPEC §13); empty until a step commits. A record whose recovery point advanced is
	// never deleted by a release: its lease is ended instead, so that the operation
	// resumes after its last committed step.
	RecoveryPoint string
	// Steps holds the results saved by the committed steps, as the idem.Handle encodes
	// them (a JSON array of {"step", "result"} objects, in commit order); empty until a
	// step commits. Stores keep it byte for byte.
	Steps []byte
	// Operation names the operation that wrote the record's steps (idem.Call.Name,
	// idem.RouteOptions.Name), so that the idem.Completer finds its resume function; empty
	// until a step commits, or when the operation has no name.
	Operation string
	// CreatedAt is when the key was claimed (kept across takeovers).
	CreatedAt time.Time
	// ExpiresAt is when the record stops existing, whether or not it was deleted yet:
	// created_at + ttl once completed (completion + ttl for an operation whose
	// recovery point advanced), max(created_at + ttl, lease_end) in flight (§8). An
	// unfinished record ([Record.Unfinished]) does not expire, whatever it says.
	ExpiresAt time.Time
}

// Unfinished reports whether the record is an unfinished operation (SPEC §13): in
// flight after one of its steps committed. Such a record never expires and no cleaner
// deletes it until it is completed or an operator settles it, so that a retry or the
// idem.Completer always finds it, with its record id and its derived keys.
func (r *Record) Unfinished() bool { return r.State == StateInFlight && r.RecoveryPoint != "" }

// Expired reports whether the record counts as absent at now (SPEC §8): its
// ExpiresAt passed, and it is not an unfinished operation.
func (r *Record) Expired(now time.Time) bool { return !r.Unfinished() && !now.Before(r.ExpiresAt) }

// LeaseLive reports whether an in-flight record's holder still holds its lease at now.
func (r *Record) LeaseLive(now time.Time) bool {
	return r.State == StateInFlight && now.Before(r.LeaseEnd)
}

// HeldBy reports whether a fenced operation (complete, release, renew) by the holder of
// token may change the record: the token must match and the record must still be in
// flight (SPEC §5, fencing). A lapsed lease that nobody took over still counts as held.
func (r *Record) HeldBy(token string) bool {
	return r.State == StateInFlight && token != "" && r.Token == token
}

// InFlightExpiresAt is the expiry of an in-flight record: max(created + ttl, leaseEnd).
func InFlightExpiresAt(created time.Time, ttl time.Duration, leaseEnd time.Time) time.Time {
	e := created.Add(ttl)
	if leaseEnd.After(e) {
		return leaseEnd
	}
	return e
}

// CompletedExpiresAt is the expiry of a completed record: created + ttl.
func CompletedExpiresAt(created time.Time, ttl time.Duration) time.Time {
	return created.Add(ttl)
}

// CompletionExpiresAt is the expiry of the record r completed at now with ttl (SPEC
// §8, §13): created + ttl, or, when its recovery point advanced, now + ttl (never
// earlier than created + ttl). An operation that outlived its TTL unfinished keeps
// its result for a whole TTL after it finished.
func (r *Record) CompletionExpiresAt(now time.Time, ttl time.Duration) time.Time {
	e := CompletedExpiresAt(r.CreatedAt, ttl)
	if r.RecoveryPoint != "" && now.Add(ttl).After(e) {
		return now.Add(ttl)
	}
	return e
}
