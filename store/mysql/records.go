package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/headercodec"
	"github.com/idem-go/idem/internal/sqlstore"
)

// now, nanos and fromNanos: the store's clock and the stored unix nanoseconds.
var (
	now       = sqlstore.Now
	fromNanos = sqlstore.FromNanos
)

func nanos(t time.Time) int64 { return t.UnixNano() }

// queryer is what reading a record needs: the pool or a transaction.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// getRecord reads the record of (scope, key), or nil when there is none (expired or
// not). With lock it reads the latest committed row and locks it until the
// transaction q ends (SELECT … FOR UPDATE); without, it is a plain consistent read.
func getRecord(ctx context.Context, q queryer, scope, key string, lock bool) (*idemstore.Record, error) {
	query := queryRecordGet
	if lock {
		query = queryRecordLock
	}
	rec, err := sqlstore.ScanRecord(q.QueryRowContext(ctx, query, scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return rec, err
}

// RecordGet implements [idemstore.Store.RecordGet] with a plain read.
func (s *Store) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	t := now(p.Now)
	rec, err := getRecord(ctx, s.db, p.Scope, p.Key, false)
	if err != nil {
		return nil, interpretError(err)
	}
	if rec == nil || rec.Expired(t) {
		return nil, idemstore.ErrNotFound
	}
	return rec, nil
}

// errRaced is claimTx's answer when the key's row appeared, or went, between the read
// that decided and the write: the caller reads again.
var errRaced = errors.New("mysql: the key's record changed under the claim")

// maxClaimRounds bounds the reads and writes of one claim that keeps racing: each
// round means another claim, release or cleanup of the same key committed meanwhile.
const maxClaimRounds = 8

// RecordClaim implements [idemstore.Store.RecordClaim].
//
// A plain read comes first: a completed record, a mismatch or a live lease is the
// answer, with no lock taken, so replays cost one SELECT by primary key; a key the
// caller expects to be new (idemstore.ClaimParams.LikelyNew) skips it. An absent key
// is claimed by one INSERT; a duplicate key (1062) means another claim won the race,
// and the claim reads again. Only a record that must change (expired, a lapsed lease
// to take over or to mark unknown) is locked (SELECT … FOR UPDATE), judged again under
// the lock and updated, fenced by the token it read, in one short transaction. No
// step depends on the isolation level or on gap locks: the claim holds at REPEATABLE
// READ and READ COMMITTED alike, and a Galera certification failure (1213 at commit)
// is a lost race, read again like a duplicate key.
func (s *Store) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	t := now(p.Now)
	for round := range maxClaimRounds {
		if round > 0 {
			// A node of a Galera cluster applies the winner's write a moment after it
			// certified it: read again after a pause, not at once.
			if err := s.pause(ctx, round-1); err != nil {
				return nil, err
			}
		}
		var existing *idemstore.Record
		if round > 0 || !p.LikelyNew {
			var err error
			if existing, err = getRecord(ctx, s.db, p.Scope, p.Key, false); err != nil {
				return nil, interpretError(err)
			}
			if res := sqlstore.AnswerWithoutWriting(existing, p.Fingerprint, t); res != nil {
				return res, nil
			}
		}
		var res *idemstore.ClaimResult
		var err error
		if existing == nil {
			res, err = insertClaim(ctx, s.db, p, t)
		} else {
			err = s.inTx(ctx, "claim", func(tx *sql.Tx) (err error) {
				res, err = claimTx(ctx, tx, p, t, existing)
				return err
			})
		}
		switch {
		case errors.Is(err, errRaced), contention(err):
			continue
		case err != nil:
			return nil, interpretError(err)
		}
		return res, nil
	}
	return nil, fmt.Errorf("%w: the claim raced with other writes of the key %d times", ErrUnavailable, maxClaimRounds)
}

// insertClaim claims an absent key with one INSERT through e (the pool: autocommit;
// or a transaction); a duplicate key is errRaced.
func insertClaim(ctx context.Context, e execer, p *idemstore.ClaimParams, t time.Time) (*idemstore.ClaimResult, error) {
	rec := sqlstore.NewClaim(p, t)
	_, err := e.ExecContext(ctx, queryRecordClaimInsert,
		p.Scope, p.Key, p.RecordID, p.Fingerprint.Version, p.Fingerprint.Sum[:], p.Token,
		nanos(rec.LeaseEnd), nanos(t), nanos(rec.ExpiresAt))
	if isNumber(err, errDupEntry) {
		return nil, errRaced
	}
	if err != nil {
		return nil, err
	}
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, Now: t}, nil
}

// claimTx claims a key whose record, read without a lock, was found to need a write:
// it locks the row, decides again on what it holds, and writes. A row gone meanwhile
// is errRaced.
func claimTx(ctx context.Context, tx *sql.Tx, p *idemstore.ClaimParams, t time.Time, read *idemstore.Record) (*idemstore.ClaimResult, error) {
	if read == nil {
		return insertClaim(ctx, tx, p, t)
	}
	rec, err := getRecord(ctx, tx, p.Scope, p.Key, true)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, errRaced
	}
	switch p.Decide(rec, t) {
	case idemstore.DecideClaim:
		rec = sqlstore.NewClaim(p, t)
		n, err := execRows(ctx, tx, queryRecordClaimReplace,
			p.RecordID, p.Fingerprint.Version, p.Fingerprint.Sum[:], p.Token, nanos(rec.LeaseEnd),
			nanos(t), nanos(rec.ExpiresAt), p.Scope, p.Key)
		if err != nil {
			return nil, err
		}
		if n != 1 {
			return nil, fmt.Errorf("replacing an expired record changed %d records, want 1", n)
		}
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, Now: t}, nil
	case idemstore.DecideTakeOver:
		// The record id, created_at and fingerprint stay: it is the same operation,
		// resumed by a new holder.
		leaseEnd := t.Add(p.Lease)
		n, err := execRows(ctx, tx, queryRecordTakeOver,
			p.Token, nanos(leaseEnd), int64(p.TTL), nanos(leaseEnd), p.Scope, p.Key, rec.Token)
		if err != nil {
			return nil, err
		}
		if n != 1 {
			// Impossible under the row's lock; never report a claim we did not make.
			return nil, fmt.Errorf("take over changed %d records, want 1", n)
		}
		return sqlstore.TookOver(rec, p, t), nil
	case idemstore.DecideUnknown:
		n, err := execRows(ctx, tx, queryRecordMarkUnknown, nanos(t), int64(p.TTL), p.Scope, p.Key, rec.Token)
		if err != nil {
			return nil, err
		}
		if n != 1 {
			return nil, fmt.Errorf("marking the outcome unknown changed %d records, want 1", n)
		}
		return sqlstore.MarkedUnknown(rec, p, t), nil
	default:
		return sqlstore.AnswerWithoutWriting(rec, p.Fingerprint, t), nil
	}
}

// execer and execRows: a statement through the pool or a transaction, and the rows it
// affected (sqlstore.ExecRows).
type execer = sqlstore.Execer

var execRows = sqlstore.ExecRows

// execFenced runs a fenced statement: no row matched is idemstore.ErrLeaseLost.
func execFenced(ctx context.Context, e execer, query string, args ...any) error {
	n, err := execRows(ctx, e, query, args...)
	if err != nil {
		return err
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// RecordComplete implements [idemstore.Store.RecordComplete] with one autocommit
// statement. To complete inside the application's transaction (SPEC §7), use
// [Store.Respond] or [Store.InTx].
func (s *Store) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	return interpretError(s.withRetry(ctx, "complete", func() error { return completeTx(ctx, s.db, p) }))
}

// completeTx runs the fenced completion through e; no row matched is
// idemstore.ErrLeaseLost.
func completeTx(ctx context.Context, e execer, p *idemstore.CompleteParams) error {
	resp := p.Response
	if resp == nil {
		return errors.New("idemstore.CompleteParams.Response is nil")
	}
	body := resp.Body
	if body == nil {
		body = []byte{} // an empty body, not NULL
	}
	return execFenced(ctx, e, queryRecordComplete, nanos(now(p.Now)), int64(p.TTL),
		resp.Status, headercodec.Encode(resp.Header), body, resp.NotStored, p.Scope, p.Key, p.Token)
}

// RecordRelease implements [idemstore.Store.RecordRelease]: it deletes the held record, or,
// when its recovery point advanced, ends its lease and keeps it.
func (s *Store) RecordRelease(ctx context.Context, p *idemstore.ReleaseParams) error {
	return interpretError(s.withRetry(ctx, "release", func() error {
		n, err := execRows(ctx, s.db, queryRecordRelease, p.Scope, p.Key, p.Token)
		if err != nil || n > 0 {
			return err
		}
		return execFenced(ctx, s.db, queryRecordReleaseKeep, nanos(now(p.Now)), p.Scope, p.Key, p.Token)
	}))
}

// RecordStep implements [idemstore.Store.RecordStep] with one autocommit statement: the
// step's result and recovery point only. To commit the application's writes with them,
// use [Step] (or [Store.StepTx]).
func (s *Store) RecordStep(ctx context.Context, p *idemstore.StepParams) error {
	return interpretError(s.withRetry(ctx, "step", func() error { return stepTx(ctx, s.db, p) }))
}

// stepTx runs the fenced step through e; no row matched is idemstore.ErrLeaseLost.
func stepTx(ctx context.Context, e execer, p *idemstore.StepParams) error {
	return execFenced(ctx, e, queryRecordStep, p.RecoveryPoint, p.Steps, p.Operation, p.Scope, p.Key, p.Token)
}

// RecordRenew implements [idemstore.Store.RecordRenew].
func (s *Store) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	leaseEnd := now(p.Now).Add(p.Lease)
	err := s.withRetry(ctx, "renew", func() error {
		return execFenced(ctx, s.db, queryRecordRenew, nanos(leaseEnd), int64(p.TTL), nanos(leaseEnd), p.Scope, p.Key, p.Token)
	})
	if err != nil {
		return time.Time{}, interpretError(err)
	}
	return leaseEnd.UTC(), nil
}

// RecordListResumable implements [idemstore.Store.RecordListResumable] with a plain read
// along the index of unfinished operations.
func (s *Store) RecordListResumable(ctx context.Context, p *idemstore.ListResumableParams) ([]*idemstore.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("mysql: idemstore.ListResumableParams.Limit must be positive, got %d", p.Limit)
	}
	rows, err := s.db.QueryContext(ctx, queryRecordListResumable, nanos(now(p.Now)),
		p.AfterScope, p.AfterScope, p.AfterKey, p.Limit)
	if err != nil {
		return nil, interpretError(err)
	}
	recs, err := sqlstore.Collect(rows, sqlstore.ScanRecord)
	return recs, interpretError(err)
}

// RecordCountUnfinished implements [idemstore.Store.RecordCountUnfinished] with a plain
// read along the index of unfinished operations.
func (s *Store) RecordCountUnfinished(ctx context.Context, p *idemstore.CountUnfinishedParams) (*idemstore.CountUnfinishedResult, error) {
	res := &idemstore.CountUnfinishedResult{Now: now(p.Now).UTC()}
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, queryRecordCountUnfin).Scan(&res.Count, &oldest); err != nil {
		return nil, interpretError(err)
	}
	if oldest.Valid {
		res.Oldest = fromNanos(oldest.Int64)
	}
	return res, nil
}

// RecordDeleteExpired implements [idemstore.Store.RecordDeleteExpired]: one batch, oldest
// expiry first, in one autocommit DELETE along the expires_at index, so that it locks
// the rows of one batch for as long as the batch takes.
func (s *Store) RecordDeleteExpired(ctx context.Context, p *idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("mysql: idemstore.DeleteExpiredParams.Limit must be positive, got %d", p.Limit)
	}
	t := now(p.Now)
	var n int64
	err := s.withRetry(ctx, "delete expired", func() (err error) {
		n, err = execRows(ctx, s.db, queryRecordDeleteExp, nanos(t.Add(-p.Retention)), nanos(t), p.Limit)
		return err
	})
	if err != nil {
		return 0, interpretError(err)
	}
	return int(n), nil
}
