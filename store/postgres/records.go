package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxClaimAttempts bounds how often RecordClaim re-runs its statement when a concurrent
// claim got in between (see claimOnce and takeOver). Each lost race means another
// request made progress, so a handful of attempts is plenty; a claim that loses them
// all to takeovers of an in-flight record answers that the key is in flight.
const maxClaimAttempts = 8

// errClaimRace means a claim statement lost a race and must be re-run.
var errClaimRace = errors.New("postgres: claim raced with a concurrent claim")

// RecordClaim claims (Scope, Key) in one round trip when the key is new, and answers a
// replay, an in-flight duplicate or a mismatch in one round trip without writing. An
// expired record or a lapsed lease costs a second, fenced statement. The store's clock
// decides (params.Now when non-zero).
func (s *Store) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	if p.LikelyNew {
		res, err := s.claimNew(ctx, p)
		if !isUniqueViolation(err, "idem_records") {
			return res, interpretError(err)
		}
		// The key is there after all: read it.
	}
	var seen *idemstore.ClaimResult // the in-flight record the last lost race read
	for range maxClaimAttempts {
		res, err := s.claimOnce(ctx, p)
		if errors.Is(err, errClaimRace) {
			if res != nil {
				seen = res
			}
			continue
		}
		return res, interpretError(err)
	}
	if seen != nil {
		// Every attempt found the key's lease lapsed and lost its takeover to another
		// claim of the key: retries under --on-lapse take_over of an upstream that
		// keeps losing replies, each taking the key over and ending its lease at once.
		// The key is held, or being taken, by another request: in flight, which the
		// caller answers 409 with Retry-After, and not a store failure (a 503
		// store_unavailable, logged as an error, for a store that answered every call).
		s.logger.DebugContext(ctx, "postgres: every attempt to take over a lapsed key lost to another claim of it; answering in flight",
			"key_prefix", keyPrefix(p.Key), "attempts", maxClaimAttempts)
		return seen, nil
	}
	return nil, fmt.Errorf("postgres: claim of a key did not settle after %d attempts under contention", maxClaimAttempts)
}

// claimNew inserts the in-flight record of a key expected to be new (RecordClaimNew):
// the record is what p says, created at the store's time that the insert answers. A
// key that is there fails it with unique_violation, which the caller reads.
func (s *Store) claimNew(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	var now time.Time
	scope, key := scopeKeyBytes(p.Scope, p.Key)
	err := s.withRetry(ctx, "claim", func() error {
		return s.pool.QueryRow(ctx, s.writes().recordClaimNew,
			scope, key, p.RecordID, p.Fingerprint.Version, p.Fingerprint.Sum[:], p.Token,
			micros(p.Lease), micros(p.TTL), nowParam(p.Now), s.asynchronousClaim).Scan(&now)
	})
	if err != nil {
		return nil, err
	}
	now = now.UTC()
	leaseEnd := now.Add(p.Lease.Truncate(time.Microsecond))
	expiresAt := now.Add(p.TTL.Truncate(time.Microsecond))
	if leaseEnd.After(expiresAt) {
		expiresAt = leaseEnd
	}
	rec := &idemstore.Record{
		Scope: p.Scope, Key: p.Key, ID: p.RecordID, Fingerprint: p.Fingerprint,
		State: idemstore.StateInFlight, Token: p.Token, LeaseEnd: leaseEnd,
		CreatedAt: now, ExpiresAt: expiresAt,
	}
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, Now: now}, nil
}

// claimOnce runs the claim statement and, when the record it found is expired or its
// lease lapsed, the fenced update that takes it over.
func (s *Store) claimOnce(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	var (
		claimed bool
		rec     *idemstore.Record
		now     time.Time
	)
	scope, key := scopeKeyBytes(p.Scope, p.Key)
	err := s.withRetry(ctx, "claim", func() error {
		row := s.pool.QueryRow(ctx, s.writes().recordClaim,
			scope, key, p.RecordID, p.Fingerprint.Version, p.Fingerprint.Sum[:], p.Token,
			micros(p.Lease), micros(p.TTL), nowParam(p.Now), s.asynchronousClaim)
		var err error
		rec, now, err = scanRecord(row, p.Scope, p.Key, &claimed)
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The read missed and the insert's condition found a record: one inserted and
		// deleted again between the two (a release).
		return nil, errClaimRace
	case isUniqueViolation(err, "idem_records"):
		// A concurrent claim of the key committed after the statement's snapshot: the
		// next run reads it.
		return nil, errClaimRace
	}
	if err != nil {
		return nil, err
	}
	if claimed {
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, Now: now}, nil
	}
	switch p.Decide(rec, now) {
	case idemstore.DecideClaim:
		return s.claimExpired(ctx, p)
	case idemstore.DecideTakeOver:
		res, err := s.takeOver(ctx, p, rec.Token)
		if errors.Is(err, errClaimRace) {
			// Another claim took the key over first: what RecordClaim answers when
			// every attempt ends so.
			return &idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: rec, Now: now}, err
		}
		return res, err
	case idemstore.DecideUnknown:
		return s.markUnknown(ctx, p, rec.Token)
	case idemstore.DecideInFlight:
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: rec, Now: now}, nil
	case idemstore.DecideReplay:
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec, Now: now}, nil
	default:
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimMismatch, Record: rec, Now: now}, nil
	}
}

// claimExpired claims an expired record afresh: a new record in all but its row.
func (s *Store) claimExpired(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	rec, now, err := s.claimUpdate(ctx, "claim_expired", p, s.writes().recordClaimExpired,
		[]byte(p.Scope), []byte(p.Key), p.RecordID, p.Fingerprint.Version, p.Fingerprint.Sum[:], p.Token,
		micros(p.Lease), micros(p.TTL), nowParam(p.Now))
	if err != nil {
		return nil, err
	}
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, Now: now}, nil
}

// takeOver replaces the token of an in-flight record whose lease lapsed, fenced by the
// old token and a re-check of the lease.
func (s *Store) takeOver(ctx context.Context, p *idemstore.ClaimParams, oldToken string) (*idemstore.ClaimResult, error) {
	rec, now, err := s.claimUpdate(ctx, "take_over", p, s.writes().recordTakeOver,
		[]byte(p.Scope), []byte(p.Key), oldToken, p.Token, micros(p.Lease), micros(p.TTL), nowParam(p.Now))
	if err != nil {
		return nil, err
	}
	released := oldToken == ""
	if released {
		s.logger.DebugContext(ctx, "postgres: claimed a key its holder released after a step committed", "key_prefix", keyPrefix(p.Key))
	} else {
		s.logger.DebugContext(ctx, "postgres: took over a key whose lease lapsed", "key_prefix", keyPrefix(p.Key))
	}
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, TookOver: true, Released: released, Now: now}, nil
}

// markUnknown completes an in-flight record whose lease lapsed as outcome unknown
// (SPEC §13), fenced by the old token and a re-check of the lease.
func (s *Store) markUnknown(ctx context.Context, p *idemstore.ClaimParams, oldToken string) (*idemstore.ClaimResult, error) {
	rec, now, err := s.claimUpdate(ctx, "mark_unknown", p, s.writes().recordMarkUnknown,
		[]byte(p.Scope), []byte(p.Key), oldToken, micros(p.TTL), nowParam(p.Now))
	if err != nil {
		return nil, err
	}
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec, MarkedUnknown: true, Now: now}, nil
}

// claimUpdate runs one of the fenced statements that follow the claim statement (the
// claim of an expired record, a takeover, a mark of outcome unknown) and returns the
// record it wrote, or errClaimRace when its fence matched nothing: the record was
// claimed, renewed, completed, released or deleted meanwhile, and the claim runs again.
func (s *Store) claimUpdate(ctx context.Context, op string, p *idemstore.ClaimParams, query string, args ...any) (*idemstore.Record, time.Time, error) {
	var (
		rec *idemstore.Record
		now time.Time
	)
	err := s.withRetry(ctx, op, func() error {
		var err error
		rec, now, err = scanRecord(s.pool.QueryRow(ctx, query, args...), p.Scope, p.Key, nil)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, now, errClaimRace
	}
	return rec, now, err
}

// RecordComplete stores the holder's final response, fenced by its token
// ([idem.ErrLeaseLost] when the record is no longer in flight under it).
func (s *Store) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	return interpretError(s.withRetry(ctx, "complete", func() error {
		return complete(ctx, s.pool, s.writes(), p)
	}))
}

// completeArgs are the arguments of RecordComplete and RecordCompleteTx.
func completeArgs(p *idemstore.CompleteParams) ([]any, error) {
	resp := p.Response
	if resp == nil {
		return nil, errors.New("postgres: idemstore.CompleteParams.Response is nil")
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return []any{[]byte(p.Scope), []byte(p.Key), p.Token, resp.Status, encodeHeaders(resp.Header),
		body, resp.NotStored, micros(p.TTL), nowParam(p.Now)}, nil
}

// complete runs the fenced completion outside any transaction.
func complete(ctx context.Context, pool *pgxpool.Pool, q *queries, p *idemstore.CompleteParams) error {
	args, err := completeArgs(p)
	if err != nil {
		return err
	}
	tag, err := pool.Exec(ctx, q.recordComplete, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// RecordRelease deletes the holder's in-flight record, fenced by its token, or, when
// its recovery point advanced, keeps it with its lease ended (SPEC §13), in one
// statement.
func (s *Store) RecordRelease(ctx context.Context, p *idemstore.ReleaseParams) error {
	return interpretError(s.withRetry(ctx, "release", func() error {
		var n int64
		err := s.pool.QueryRow(ctx, s.writes().recordRelease, []byte(p.Scope), []byte(p.Key), p.Token, nowParam(p.Now)).Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 {
			return idemstore.ErrLeaseLost
		}
		return nil
	}))
}

// stepArgs are the arguments of RecordStep and RecordStepTx.
func stepArgs(p *idemstore.StepParams) []any {
	var operation any
	if p.Operation != "" {
		operation = p.Operation
	}
	return []any{[]byte(p.Scope), []byte(p.Key), p.Token, p.RecoveryPoint, p.Steps, operation}
}

// RecordStep commits one step's result and recovery point, fenced by the holder's
// token, in a statement of its own. To commit the application's writes with them, use
// [Step] (or [Store.StepTx]).
func (s *Store) RecordStep(ctx context.Context, p *idemstore.StepParams) error {
	return interpretError(s.withRetry(ctx, "step", func() error {
		tag, err := s.pool.Exec(ctx, s.writes().recordStep, stepArgs(p)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return idemstore.ErrLeaseLost
		}
		return nil
	}))
}

// RecordListResumable returns one batch of the records the completer may resume,
// along the partial index of resumable records.
func (s *Store) RecordListResumable(ctx context.Context, p *idemstore.ListResumableParams) ([]*idemstore.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("postgres: idemstore.ListResumableParams.Limit must be positive, got %d", p.Limit)
	}
	var recs []*idemstore.Record
	err := s.withRetry(ctx, "list_resumable", func() error {
		recs = recs[:0]
		rows, err := s.pool.Query(ctx, s.q.recordListResumable,
			[]byte(p.AfterScope), []byte(p.AfterKey), p.Limit, nowParam(p.Now))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var scope, key []byte
			blk := newScannedRecord("", "", nil)
			if err := rows.Scan(append([]any{&scope, &key}, blk.row.dest()...)...); err != nil {
				return err
			}
			rec, _, err := blk.record()
			if err != nil {
				return err
			}
			rec.Scope, rec.Key = string(scope), string(key)
			recs = append(recs, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return recs, nil
}

// RecordCountUnfinished counts the unfinished operations along the partial index of
// resumable records, and finds the oldest one's creation.
func (s *Store) RecordCountUnfinished(ctx context.Context, p *idemstore.CountUnfinishedParams) (*idemstore.CountUnfinishedResult, error) {
	var (
		n      int64
		oldest *time.Time
		now    time.Time
	)
	err := s.withRetry(ctx, "count_unfinished", func() error {
		return s.pool.QueryRow(ctx, s.q.recordCountUnfinished, nowParam(p.Now)).Scan(&n, &oldest, &now)
	})
	if err != nil {
		return nil, interpretError(err)
	}
	res := &idemstore.CountUnfinishedResult{Count: int(n), Now: now.UTC()}
	if oldest != nil {
		res.Oldest = oldest.UTC()
	}
	return res, nil
}

// RecordRenew extends the holder's lease to now + Lease, fenced by its token, and
// returns the new lease end.
func (s *Store) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	var leaseEnd time.Time
	err := s.withRetry(ctx, "renew", func() error {
		return s.pool.QueryRow(ctx, s.writes().recordRenew,
			[]byte(p.Scope), []byte(p.Key), p.Token, micros(p.Lease), micros(p.TTL), nowParam(p.Now)).Scan(&leaseEnd)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, idemstore.ErrLeaseLost
	}
	if err != nil {
		return time.Time{}, interpretError(err)
	}
	return leaseEnd.UTC(), nil
}

// RecordGet reads one live record; absent or expired is [idemstore.ErrNotFound].
func (s *Store) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	var (
		rec *idemstore.Record
		now time.Time
	)
	err := s.withRetry(ctx, "get", func() error {
		row := s.pool.QueryRow(ctx, s.q.recordGet, []byte(p.Scope), []byte(p.Key), nowParam(p.Now))
		var err error
		rec, now, err = scanRecord(row, p.Scope, p.Key, nil)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	if rec.Expired(now) {
		return nil, idemstore.ErrNotFound
	}
	return rec, nil
}

// RecordDeleteExpired walks the table from where the last call stopped, in disk order,
// a range of pages at a time, each range its own short transaction that deletes the
// expired records in it (RecordDeleteExpired in queries/records.sql): the table has no
// index of expiry for the cleaner to read (migration 0010). It stops once it deleted
// p.Limit records, or walked p.MaxDuration (when set), or reached the table's end, the
// next call then starting again from its first page. Each range is sized by the time
// it takes (walkRange), so that none holds what it deleted locked for long.
func (s *Store) RecordDeleteExpired(ctx context.Context, p *idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("postgres: idemstore.DeleteExpiredParams.Limit must be positive, got %d", p.Limit)
	}
	w := &s.walk
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	deleted := 0
	for {
		n, next, err := s.deleteExpiredRange(ctx, p, p.Limit-deleted)
		deleted += n
		if err != nil {
			return deleted, err
		}
		w.page = next
		if next == 0 || deleted >= p.Limit || (p.MaxDuration > 0 && time.Since(start) >= p.MaxDuration) {
			return deleted, nil
		}
	}
}

// walk is where the cleaner's walk of the table stands (RecordDeleteExpired).
type walk struct {
	mu    sync.Mutex
	page  int64 // the first page of the next range
	pages int64 // how many pages a range holds, sized by the time ranges take
}

// Bounds of the walk's ranges: walkRangeTarget is how long one range should take, and
// walkRangeTimeout cancels one that takes longer (what it deleted rolls back; the next
// range is smaller), so that no range holds the rows it deleted locked for more than
// that (issue 41: a batch of the index-ordered delete took up to 28 s at 10 million
// records).
const (
	walkRangeTarget  = 10 * time.Millisecond
	walkRangeTimeout = time.Second
	walkMinPages     = 1
	walkMaxPages     = 1 << 16
	walkFirstPages   = 256
)

// deleteExpiredRange deletes the expired records of one range of pages from the walk's
// page, at most limit of them, and returns how many it deleted and the page the next
// range starts at (0 when this one reached the table's end).
func (s *Store) deleteExpiredRange(ctx context.Context, p *idemstore.DeleteExpiredParams, limit int) (int, int64, error) {
	w := &s.walk
	if w.pages == 0 {
		w.pages = walkFirstPages
	}
	from, to := w.page, w.page+w.pages
	var (
		n        int64
		lastPage *int64
		pages    int64
	)
	rctx, cancel := context.WithTimeout(ctx, walkRangeTimeout)
	defer cancel()
	began := time.Now()
	err := s.withRetry(rctx, "delete_expired", func() error {
		return s.pool.QueryRow(rctx, s.q.recordDeleteExpired, from, to, micros(p.Retention), nowParam(p.Now), limit,
			s.q.schemaPrefix+"idem_records").Scan(&n, &lastPage, &pages)
	})
	took := time.Since(began)
	if err != nil {
		if ctx.Err() == nil && rctx.Err() != nil && w.pages > walkMinPages {
			// The range ran out of walkRangeTimeout: nothing of it was deleted; the
			// next one is a quarter of it.
			w.pages = max(walkMinPages, w.pages/4)
			return 0, from, nil
		}
		return 0, from, interpretError(err)
	}
	switch {
	case took > walkRangeTarget:
		w.pages = max(walkMinPages, w.pages/2)
	case took < walkRangeTarget/2:
		w.pages = min(walkMaxPages, 2*w.pages)
	}
	switch {
	case int(n) >= limit && lastPage != nil:
		// Stopped at its limit: the rest of that page is the next range's.
		return int(n), *lastPage, nil
	case to >= pages:
		return int(n), 0, nil
	}
	return int(n), to, nil
}

// scanRecord reads the record columns (and the store's time) of one row, in the order
// queries/records.sql lists them. claimed, when non-nil, receives the leading column of
// the claim statement.
func scanRecord(row pgx.Row, scope, key string, claimed *bool) (*idemstore.Record, time.Time, error) {
	blk := newScannedRecord(scope, key, claimed)
	if err := row.Scan(&blk.row); err != nil {
		return nil, time.Time{}, err
	}
	return blk.record()
}

// newScannedRecord readies the scan of one record of (scope, key).
func newScannedRecord(scope, key string, claimed *bool) *scannedRecord {
	blk := &scannedRecord{rec: idemstore.Record{Scope: scope, Key: key}}
	blk.row = recordRow{claimed: claimed, raw: rawRecord{rec: &blk.rec}}
	return blk
}

// record is the scanned record, and the store's time of the row.
func (blk *scannedRecord) record() (*idemstore.Record, time.Time, error) {
	r := &blk.row.raw
	rec := r.rec
	if len(r.fp) != len(rec.Fingerprint.Sum) {
		return nil, time.Time{}, fmt.Errorf("postgres: stored fingerprint has %d bytes, want %d", len(r.fp), len(rec.Fingerprint.Sum))
	}
	copy(rec.Fingerprint.Sum[:], r.fp)
	// The table does not check the state (migration 0011): the store does, here.
	if r.state != string(idemstore.StateInFlight) && r.state != string(idemstore.StateCompleted) {
		return nil, time.Time{}, fmt.Errorf("postgres: stored state %q is neither %s nor %s", r.state, idemstore.StateInFlight, idemstore.StateCompleted)
	}
	rec.State = idemstore.State(r.state)
	rec.CreatedAt, rec.ExpiresAt = rec.CreatedAt.UTC(), rec.ExpiresAt.UTC()
	if r.token != nil {
		rec.Token = *r.token
	}
	if r.leaseEnd != nil {
		rec.LeaseEnd = r.leaseEnd.UTC()
	}
	if r.recovery != nil {
		rec.RecoveryPoint = *r.recovery
	}
	rec.Steps = r.steps
	if r.operation != nil {
		rec.Operation = *r.operation
	}
	if rec.State == idemstore.StateCompleted {
		resp := &blk.resp
		resp.Body, resp.NotStored, resp.OutcomeUnknown = r.body, r.notStored, r.unknown
		if r.status != nil {
			resp.Status = int(*r.status)
		}
		if !r.headerDecoded {
			r.header, r.headerErr = decodeHeaders(r.headers)
		}
		if r.headerErr != nil {
			return nil, time.Time{}, r.headerErr
		}
		resp.Header = r.header
		rec.Response = resp
	}
	return rec, r.now.UTC(), nil
}

// scannedRecord is what scanRecord allocates, in one allocation: the record, its
// response, and the row scanner that reads them.
type scannedRecord struct {
	rec  idemstore.Record
	resp idemstore.Response
	row  recordRow
}

// scopeKeyBytes returns scope and key as the bytea arguments of a statement, in one
// allocation.
func scopeKeyBytes(scope, key string) (s, k []byte) {
	b := make([]byte, len(scope)+len(key))
	n := copy(b, scope)
	copy(b[n:], key)
	return b[:n:n], b[n:]
}

// micros converts a duration to the microseconds the SQL multiplies by an interval.
func micros(d time.Duration) int64 { return d.Microseconds() }

// nowParam is the injected time of a test, or NULL for the store's clock.
func nowParam(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// keyPrefix is what the logs show of a key: never the whole of it.
func keyPrefix(key string) string {
	if len(key) <= 4 {
		return "…"
	}
	return key[:4] + "…"
}
