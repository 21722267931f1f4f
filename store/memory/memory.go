// Package memory is an in-memory [idemstore.Store] for tests and examples only.
//
// Do not use it in production: records live in one process's memory, so they vanish on
// restart and are invisible to every other process. It offers none of the durability that
// idempotency keys exist to provide (SPEC §1: "records live in a durable store, never only
// in memory"). Use store/sqlite, store/postgres or store/redis instead.
//
// Within one process it keeps the full contract of [idemstore.Store] — atomic claims, fenced
// completion, release and renewal, expiry — and passes the conformance suite in
// store/storetest. Every decision is taken by the pure state machine [idemstore.Decide] under
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
	"github.com/idem-go/idem/idemstore"
)

// Store is an in-memory [idemstore.Store]. The zero value is not usable; call [New].
// It is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	records map[recordKey]*idemstore.Record
}

type recordKey struct{ scope, key string }

// New returns a new in-memory store: empty but for the record of its state, at the
// format level of this release (idem.InitStoreState, SPEC §20): no other process,
// of any release, can share it.
func New() *Store {
	s := &Store{records: make(map[recordKey]*idemstore.Record)}
	if err := idem.InitStoreState(context.Background(), s); err != nil {
		panic("memory: recording the new store's state: " + err.Error()) // cannot fail
	}
	return s
}

var _ idemstore.Store = (*Store)(nil)

// now returns the injected time when non-zero, else the host clock.
func now(injected time.Time) time.Time {
	if !injected.IsZero() {
		return injected
	}
	return time.Now()
}

// RecordClaim implements [idemstore.Store.RecordClaim].
func (s *Store) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now(p.Now)
	k := recordKey{p.Scope, p.Key}

	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[k]
	res := &idemstore.ClaimResult{Now: t}
	switch p.Decide(rec, t) {
	case idemstore.DecideClaim:
		leaseEnd := t.Add(p.Lease)
		rec = &idemstore.Record{
			Scope:       p.Scope,
			Key:         p.Key,
			ID:          p.RecordID,
			Fingerprint: p.Fingerprint,
			State:       idemstore.StateInFlight,
			Token:       p.Token,
			LeaseEnd:    leaseEnd,
			CreatedAt:   t,
			ExpiresAt:   idemstore.InFlightExpiresAt(t, p.TTL, leaseEnd),
		}
		s.records[k] = rec
		res.Outcome = idemstore.ClaimAcquired
	case idemstore.DecideTakeOver:
		// The record id, created_at and fingerprint stay: it is the same operation,
		// resumed by a new holder.
		res.Released = rec.Token == ""
		rec.Token = p.Token
		rec.LeaseEnd = t.Add(p.Lease)
		rec.ExpiresAt = idemstore.InFlightExpiresAt(rec.CreatedAt, p.TTL, rec.LeaseEnd)
		res.Outcome = idemstore.ClaimAcquired
		res.TookOver = true
	case idemstore.DecideUnknown:
		// The holder died and its operation cannot be repeated safely: the record
		// answers outcome_unknown until an operator resolves it (SPEC §13).
		rec.State = idemstore.StateCompleted
		rec.Token = ""
		rec.LeaseEnd = time.Time{}
		rec.Response = &idemstore.Response{Status: 500, OutcomeUnknown: true}
		rec.ExpiresAt = rec.CompletionExpiresAt(t, p.TTL)
		res.Outcome = idemstore.ClaimCompleted
		res.MarkedUnknown = true
	case idemstore.DecideInFlight:
		res.Outcome = idemstore.ClaimInFlight
	case idemstore.DecideReplay:
		res.Outcome = idemstore.ClaimCompleted
	case idemstore.DecideMismatch:
		res.Outcome = idemstore.ClaimMismatch
	}
	res.Record = copyRecord(rec)
	return res, nil
}

// RecordComplete implements [idemstore.Store.RecordComplete].
func (s *Store) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return idemstore.ErrLeaseLost
	}
	rec.ExpiresAt = rec.CompletionExpiresAt(now(p.Now), p.TTL)
	rec.RecoveryPoint = "" // it says where an unfinished operation stands; the steps' results stay
	rec.State = idemstore.StateCompleted
	rec.Token = ""
	rec.LeaseEnd = time.Time{}
	rec.Response = copyResponse(p.Response)
	return nil
}

// RecordRelease implements [idemstore.Store.RecordRelease].
func (s *Store) RecordRelease(ctx context.Context, p *idemstore.ReleaseParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return idemstore.ErrLeaseLost
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

// RecordStep implements [idemstore.Store.RecordStep]. The in-memory store has no
// transactions: only the step's result and recovery point are kept.
func (s *Store) RecordStep(ctx context.Context, p *idemstore.StepParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return idemstore.ErrLeaseLost
	}
	rec.RecoveryPoint = p.RecoveryPoint
	rec.Steps = bytes.Clone(p.Steps)
	rec.Operation = p.Operation
	return nil
}

// RecordListResumable implements [idemstore.Store.RecordListResumable].
func (s *Store) RecordListResumable(ctx context.Context, p *idemstore.ListResumableParams) ([]*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.Limit <= 0 {
		return nil, fmt.Errorf("memory: idemstore.ListResumableParams.Limit must be positive, got %d", p.Limit)
	}
	t := now(p.Now)
	after := recordKey{p.AfterScope, p.AfterKey}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*idemstore.Record
	for k, rec := range s.records {
		if rec.Unfinished() && !rec.LeaseLive(t) && (p.AfterKey == "" || compareKeys(k, after) > 0) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b *idemstore.Record) int {
		return compareKeys(recordKey{a.Scope, a.Key}, recordKey{b.Scope, b.Key})
	})
	out = out[:min(len(out), p.Limit)]
	for i, rec := range out {
		out[i] = copyRecord(rec)
		out[i].Response = nil
	}
	return out, nil
}

// RecordCountUnfinished implements [idemstore.Store.RecordCountUnfinished].
func (s *Store) RecordCountUnfinished(ctx context.Context, p *idemstore.CountUnfinishedParams) (*idemstore.CountUnfinishedResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &idemstore.CountUnfinishedResult{Now: now(p.Now)}
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

// RecordRenew implements [idemstore.Store.RecordRenew].
func (s *Store) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	t := now(p.Now)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.held(p.Scope, p.Key, p.Token)
	if !ok {
		return time.Time{}, idemstore.ErrLeaseLost
	}
	rec.LeaseEnd = t.Add(p.Lease)
	rec.ExpiresAt = idemstore.InFlightExpiresAt(rec.CreatedAt, p.TTL, rec.LeaseEnd)
	return rec.LeaseEnd, nil
}

// held returns the record of (scope, key) when the holder of token may change it.
// The caller holds s.mu.
func (s *Store) held(scope, key, token string) (*idemstore.Record, bool) {
	rec := s.records[recordKey{scope, key}]
	if rec == nil || !rec.HeldBy(token) {
		return nil, false
	}
	return rec, true
}

// RecordGet implements [idemstore.Store.RecordGet].
func (s *Store) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now(p.Now)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[recordKey{p.Scope, p.Key}]
	if rec == nil || rec.Expired(t) {
		return nil, idemstore.ErrNotFound
	}
	return copyRecord(rec), nil
}

// RecordDeleteExpired implements [idemstore.Store.RecordDeleteExpired]. It deletes the
// records that expired first, as the SQL stores' ORDER BY expires_at LIMIT n does.
func (s *Store) RecordDeleteExpired(ctx context.Context, p *idemstore.DeleteExpiredParams) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if p.Limit <= 0 {
		return 0, fmt.Errorf("memory: idemstore.DeleteExpiredParams.Limit must be positive, got %d", p.Limit)
	}
	t := now(p.Now)
	cutoff := t.Add(-p.Retention)

	s.mu.Lock()
	defer s.mu.Unlock()
	var expired []*idemstore.Record
	for _, rec := range s.records {
		if rec.ExpiresAt.Before(cutoff) && !rec.LeaseLive(t) && !rec.Unfinished() {
			expired = append(expired, rec)
		}
	}
	slices.SortFunc(expired, func(a, b *idemstore.Record) int { return a.ExpiresAt.Compare(b.ExpiresAt) })
	expired = expired[:min(len(expired), p.Limit)]
	for _, rec := range expired {
		delete(s.records, recordKey{rec.Scope, rec.Key})
	}
	return len(expired), nil
}

// Ping implements [idemstore.Store.Ping]; an in-memory store always answers.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

// Capabilities implements [idemstore.Store.Capabilities]: no SPEC §7 transactions, cleanup
// by RecordDeleteExpired, a single process, and recovery points (steps save their
// results; with no transaction, nothing else commits with them).
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Transactions: false, BatchedCleanup: true, MultiProcess: false, RecoveryPoints: true}
}

// Len returns how many records of requests the store holds, expired or not: every
// record but idem's own ([idemstore.ReservedScope]). Tests use it to see what
// cleanup left behind.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.records {
		if k.scope != idemstore.ReservedScope {
			n++
		}
	}
	return n
}

func copyRecord(r *idemstore.Record) *idemstore.Record {
	c := *r
	c.Response = copyResponse(r.Response)
	c.Steps = bytes.Clone(r.Steps)
	return &c
}

func copyResponse(r *idemstore.Response) *idemstore.Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return &c
}
