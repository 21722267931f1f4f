// Package memory is an in-memory [idem.Store] for tests and examples only.
//
// Do not use it in production: records live in one process's memory, so they vanish on
// restart and are invisible to every other process. It offers none of the durability that
// idempotency keys exist to provide (SPEC §1: "records live in a durable store, never only
// in memory"). Use store/sqlite, store/postgres or store/redis instead.
//
// Within one process it keeps the full contract of [idem.Store] — atomic claims, fenced
// completion, release and renewal, expiry — and passes the conformance suite in
// store/storetest. Every decision is taken by the pure state machine [idem.Decide] under
// one mutex. Records are copied in and out, so callers never alias stored bodies or
// headers.
package memory

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Store is an in-memory [idem.Store]. The zero value is not usable; call [New].
// It is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	records map[recordKey]*idem.Record
}

type recordKey struct{ scope, key string }

// New returns an empty in-memory store.
func New() *Store {
	return &Store{records: make(map[recordKey]*idem.Record)}
}

var _ idem.Store = (*Store)(nil)

// now returns the injected time when non-zero, else the host clock.
func now(injected time.Time) time.Time {
	if !injected.IsZero() {
		return injected
	}
	return time.Now()
}

// RecordClaim implements [idem.Store.RecordClaim].
func (s *Store) RecordClaim(ctx context.Context, p *idem.RecordClaimParams) (*idem.RecordClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now(p.Now)
	k := recordKey{p.Scope, p.Key}

	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[k]
	res := &idem.RecordClaimResult{Now: t}
	switch p.Decide(rec, t) {
	case idem.DecideClaim:
		leaseEnd := t.Add(p.Lease)
		rec = &idem.Record{
			Scope:       p.Scope,
			Key:         p.Key,
			ID:          p.RecordID,
			Fingerprint: p.Fingerprint,
			State:       idem.StateInFlight,
			Token:       p.Token,
			LeaseEnd:    leaseEnd,
			CreatedAt:   t,
			ExpiresAt:   idem.InFlightExpiresAt(t, p.TTL, leaseEnd),
		}
		s.records[k] = rec
		res.Outcome = idem.ClaimAcquired
	case idem.DecideTakeOver:
		// The record id, created_at and fingerprint stay: it is the same operation,
		// resumed by a new holder.
		rec.Token = p.Token
		rec.LeaseEnd = t.Add(p.Lease)
		rec.ExpiresAt = idem.InFlightExpiresAt(rec.CreatedAt, p.TTL, rec.LeaseEnd)
		res.Outcome = idem.ClaimAcquired
		res.TookOver = true
	case idem.DecideUnknown:
		// The holder died and its operation cannot be repeated safely: the record
		// answers outcome_unknown until an operator resolves it (SPEC §13).
		rec.State = idem.StateCompleted
		rec.Token = ""
		rec.LeaseEnd = time.Time{}
		rec.Response = &idem.Response{Status: 500, OutcomeUnknown: true}
		rec.ExpiresAt = rec.CompletionExpiresAt(t, p.TTL)
		res.Outcome = idem.ClaimCompleted
		res.MarkedUnknown = true
	case idem.DecideInFlight:
		res.Outcome = idem.ClaimInFlight
	case idem.DecideReplay:
		res.Outcome = idem.ClaimCompleted
	case idem.DecideMismatch:
		res.Outcome = idem.ClaimMismatch
	}
	res.Record = copyRecord(rec)
	return res, nil
}

// RecordComplete implements [idem.Store.RecordComplete].
func (s *Store) RecordComplete(ctx context.Context, p *idem.RecordCompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return idem.ErrLeaseLost
	}
	rec.ExpiresAt = rec.CompletionExpiresAt(now(p.Now), p.TTL)
	rec.RecoveryPoint = "" // it says where an unfinished operation stands; the steps' results stay
	rec.State = idem.StateCompleted
	rec.Token = ""
	rec.LeaseEnd = time.Time{}
	rec.Response = copyResponse(p.Response)
	return nil
}

// RecordRelease implements [idem.Store.RecordRelease].
func (s *Store) RecordRelease(ctx context.Context, p *idem.RecordReleaseParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return idem.ErrLeaseLost
	}
	if rec.RecoveryPoint != "" {
		// Committed steps must not run again: keep the record for a resume, with
		// no holder and its lease ended (SPEC §13).
		rec.Token = ""
		rec.LeaseEnd = now(p.Now)
		return nil
	}
	delete(s.records, recordKey{p.Scope, p.Key})
	return nil
}

// RecordStep implements [idem.Store.RecordStep]. The in-memory store has no
// transactions: only the step's result and recovery point are kept.
func (s *Store) RecordStep(ctx context.Context, p *idem.RecordStepParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return idem.ErrLeaseLost
	}
	rec.RecoveryPoint = p.RecoveryPoint
	rec.Steps = bytes.Clone(p.Steps)
	rec.Operation = p.Operation
	return nil
}

// RecordListResumable implements [idem.Store.RecordListResumable].
func (s *Store) RecordListResumable(ctx context.Context, p *idem.RecordListResumableParams) ([]*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.Limit <= 0 {
		return nil, fmt.Errorf("memory: RecordListResumableParams.Limit must be positive, got %d", p.Limit)
	}
	t := now(p.Now)
	after := recordKey{p.AfterScope, p.AfterKey}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*idem.Record
	for k, rec := range s.records {
		if rec.Unfinished() && !rec.LeaseLive(t) && (p.AfterKey == "" || compareKeys(k, after) > 0) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b *idem.Record) int {
		return compareKeys(recordKey{a.Scope, a.Key}, recordKey{b.Scope, b.Key})
	})
	out = out[:min(len(out), p.Limit)]
	for i, rec := range out {
		out[i] = copyRecord(rec)
		out[i].Response = nil
	}
	return out, nil
}

// RecordCountUnfinished implements [idem.Store.RecordCountUnfinished].
func (s *Store) RecordCountUnfinished(ctx context.Context, p *idem.RecordCountUnfinishedParams) (*idem.RecordCountUnfinishedResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &idem.RecordCountUnfinishedResult{Now: now(p.Now)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rec := range s.records {
		if rec.Unfinished() {
			res.Count++
			if res.Oldest.IsZero() || rec.CreatedAt.Before(res.Oldest) {
				res.Oldest = rec.CreatedAt
			}
		}
	}
	return res, nil
}

// RecordRenew implements [idem.Store.RecordRenew].
func (s *Store) RecordRenew(ctx context.Context, p *idem.RecordRenewParams) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	t := now(p.Now)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return time.Time{}, idem.ErrLeaseLost
	}
	rec.LeaseEnd = t.Add(p.Lease)
	rec.ExpiresAt = idem.InFlightExpiresAt(rec.CreatedAt, p.TTL, rec.LeaseEnd)
	return rec.LeaseEnd, nil
}

// held returns the record of (scope, key) when the holder of token may change it.
// The caller holds s.mu.
func (s *Store) held(scope, key, token string) (*idem.Record, bool) {
	rec := s.records[recordKey{scope, key}]
	if rec == nil || !rec.HeldBy(token) {
		return nil, false
	}
	return rec, true
}

// RecordGet implements [idem.Store.RecordGet].
func (s *Store) RecordGet(ctx context.Context, p *idem.RecordGetParams) (*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now(p.Now)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[recordKey{p.Scope, p.Key}]
	if rec == nil || rec.Expired(t) {
		return nil, idem.ErrNotFound
	}
	return copyRecord(rec), nil
}

// RecordDeleteExpired implements [idem.Store.RecordDeleteExpired]. It deletes the
// records that expired first, as the SQL stores' ORDER BY expires_at LIMIT n does.
func (s *Store) RecordDeleteExpired(ctx context.Context, p *idem.RecordDeleteExpiredParams) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if p.Limit <= 0 {
		return 0, fmt.Errorf("memory: RecordDeleteExpiredParams.Limit must be positive, got %d", p.Limit)
	}
	t := now(p.Now)
	cutoff := t.Add(-p.Retention)

	s.mu.Lock()
	defer s.mu.Unlock()
	var expired []*idem.Record
	for _, rec := range s.records {
		if rec.ExpiresAt.Before(cutoff) && !rec.LeaseLive(t) && !rec.Unfinished() {
			expired = append(expired, rec)
		}
	}
	slices.SortFunc(expired, func(a, b *idem.Record) int { return a.ExpiresAt.Compare(b.ExpiresAt) })
	expired = expired[:min(len(expired), p.Limit)]
	for _, rec := range expired {
		delete(s.records, recordKey{rec.Scope, rec.Key})
	}
	return len(expired), nil
}

// Ping implements [idem.Store.Ping]; an in-memory store always answers.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

// Capabilities implements [idem.Store.Capabilities]: no SPEC §7 transactions, cleanup
// by RecordDeleteExpired, a single process, and recovery points (steps save their
// results; with no transaction, nothing else commits with them).
func (s *Store) Capabilities() idem.Capabilities {
	return idem.Capabilities{Transactions: false, BatchedCleanup: true, MultiProcess: false, RecoveryPoints: true}
}

// Len returns how many records the store holds, expired or not. Tests use it to see
// what cleanup left behind.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

func copyRecord(r *idem.Record) *idem.Record {
	c := *r
	c.Response = copyResponse(r.Response)
	c.Steps = bytes.Clone(r.Steps)
	return &c
}

func copyResponse(r *idem.Response) *idem.Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return &c
}
