package sqlite

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

// now and fromNanos: the store's clock (its host's, for a database shared by the
// processes of one host) and the time of stored unix nanoseconds.
var (
	now       = sqlstore.Now
	fromNanos = sqlstore.FromNanos
)

// nanos is the stored unix nanoseconds of t.
func nanos(t time.Time) int64 { return t.UnixNano() }

// queryer is what reading a record needs: the pool or a transaction.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// getRecord reads the record of (scope, key), or nil when there is none (expired or
// not).
func getRecord(ctx context.Context, q queryer, scope, key string) (*idemstore.Record, error) {
	rec, err := sqlstore.ScanRecord(q.QueryRowContext(ctx, queryRecordGet, sql.Named("scope", scope), sql.Named("key", key)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return rec, err
}

// RecordGet implements [idemstore.Store.RecordGet] with a plain read, which in WAL mode
// takes no lock that a writer waits for.
func (s *Store) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	t := now(p.Now)
	var rec *idemstore.Record
	err := s.retryBusy(ctx, "get", func() (err error) {
		rec, err = getRecord(ctx, s.db, p.Scope, p.Key)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	if rec == nil || rec.Expired(t) {
		return nil, idemstore.ErrNotFound
	}
	return rec, nil
}

// RecordClaim implements [idemstore.Store.RecordClaim].
//
// A plain read comes first: when it finds a completed record, a mismatch or a live
// lease, that committed state is the answer and the claim takes no write lock, so
// replays never queue behind writers. Otherwise one BEGIN IMMEDIATE transaction reads
// the record again under the write lock, decides with [idemstore.Decide], and inserts or
// takes over.
func (s *Store) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	t := now(p.Now)
	var existing *idemstore.Record
	err := s.retryBusy(ctx, "claim read", func() (err error) {
		existing, err = getRecord(ctx, s.db, p.Scope, p.Key)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	if res := sqlstore.AnswerWithoutWriting(existing, p.Fingerprint, t); res != nil {
		return res, nil
	}

	var res *idemstore.ClaimResult
	// On the claims' own connection: its commit skips the fsync ("Durable claims").
	err = s.writeTxOn(ctx, s.claimDB, "claim", func(tx *sql.Tx) (err error) {
		res, err = claimTx(ctx, tx, p, t)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return res, nil
}

// claimTx is the claim's write transaction, holding the write lock.
func claimTx(ctx context.Context, tx *sql.Tx, p *idemstore.ClaimParams, t time.Time) (*idemstore.ClaimResult, error) {
	rec, err := getRecord(ctx, tx, p.Scope, p.Key)
	if err != nil {
		return nil, err
	}
	switch p.Decide(rec, t) {
	case idemstore.DecideClaim:
		rec = sqlstore.NewClaim(p, t)
		leaseEnd := rec.LeaseEnd
		_, err = tx.ExecContext(ctx, queryRecordClaimInsert,
			sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("record_id", p.RecordID),
			sql.Named("fingerprint_version", p.Fingerprint.Version), sql.Named("fingerprint", p.Fingerprint.Sum[:]),
			sql.Named("token", p.Token), sql.Named("lease_end", nanos(leaseEnd)),
			sql.Named("now", nanos(t)), sql.Named("expires_at", nanos(rec.ExpiresAt)))
		if err != nil {
			return nil, err
		}
		return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, Now: t}, nil
	case idemstore.DecideTakeOver:
		// The record id, created_at and fingerprint stay: it is the same operation,
		// resumed by a new holder.
		leaseEnd := t.Add(p.Lease)
		n, err := execRows(ctx, tx, queryRecordTakeOver,
			sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("old_token", rec.Token),
			sql.Named("token", p.Token), sql.Named("lease_end", nanos(leaseEnd)), sql.Named("ttl", int64(p.TTL)))
		if err != nil {
			return nil, err
		}
		if n != 1 {
			// Impossible under the write lock; never report a claim we did not make.
			return nil, fmt.Errorf("take over changed %d records, want 1", n)
		}
		return sqlstore.TookOver(rec, p, t), nil
	case idemstore.DecideUnknown:
		n, err := execRows(ctx, tx, queryRecordMarkUnknown, sql.Named("scope", p.Scope), sql.Named("key", p.Key),
			sql.Named("old_token", rec.Token), sql.Named("ttl", int64(p.TTL)), sql.Named("now", nanos(t)))
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

// RecordComplete implements [idemstore.Store.RecordComplete] in a transaction of its own.
// To complete inside the application's transaction (SPEC §7), use [Store.InTx].
func (s *Store) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	return interpretError(s.writeTx(ctx, "complete", func(tx *sql.Tx) error {
		return completeTx(ctx, tx, p)
	}))
}

// completeTx runs the fenced completion in tx; no row changed is [idem.ErrLeaseLost].
func completeTx(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
	resp := p.Response
	if resp == nil {
		return errors.New("idemstore.CompleteParams.Response is nil")
	}
	headers := headercodec.Encode(resp.Header)
	body := resp.Body
	if body == nil {
		body = []byte{} // an empty body, not NULL
	}
	n, err := execRows(ctx, tx, queryRecordComplete,
		sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.Token),
		sql.Named("status", resp.Status), sql.Named("headers", headers), sql.Named("body", body),
		sql.Named("not_stored", resp.NotStored), sql.Named("ttl", int64(p.TTL)), sql.Named("now", nanos(now(p.Now))))
	if err != nil {
		return err
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// RecordRelease implements [idemstore.Store.RecordRelease]: it deletes the held record, or,
// when its recovery point advanced, ends its lease and keeps it.
func (s *Store) RecordRelease(ctx context.Context, p *idemstore.ReleaseParams) error {
	args := []any{sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.Token)}
	return interpretError(s.writeTx(ctx, "release", func(tx *sql.Tx) error {
		n, err := execRows(ctx, tx, queryRecordRelease, args...)
		if err != nil || n > 0 {
			return err
		}
		n, err = execRows(ctx, tx, queryRecordReleaseKeep, append(args, sql.Named("now", nanos(now(p.Now))))...)
		if err != nil {
			return err
		}
		if n == 0 {
			return idemstore.ErrLeaseLost
		}
		return nil
	}))
}

// RecordStep implements [idemstore.Store.RecordStep] in a transaction of its own: the
// step's result and recovery point only. To commit the application's writes with
// them, use [Step] (or [Store.StepTx]).
func (s *Store) RecordStep(ctx context.Context, p *idemstore.StepParams) error {
	return interpretError(s.writeTx(ctx, "step", func(tx *sql.Tx) error {
		return stepTx(ctx, tx, p)
	}))
}

// stepTx runs the fenced step in tx; no row changed is [idem.ErrLeaseLost].
func stepTx(ctx context.Context, tx *sql.Tx, p *idemstore.StepParams) error {
	n, err := execRows(ctx, tx, queryRecordStep,
		sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.Token),
		sql.Named("recovery_point", p.RecoveryPoint), sql.Named("steps", p.Steps),
		sql.Named("operation", p.Operation))
	if err != nil {
		return err
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// RecordListResumable implements [idemstore.Store.RecordListResumable] with a plain read
// along the partial index of resumable records.
func (s *Store) RecordListResumable(ctx context.Context, p *idemstore.ListResumableParams) ([]*idemstore.Record, error) {
	if p.Limit <= 0 {
		return nil, fmt.Errorf("sqlite: idemstore.ListResumableParams.Limit must be positive, got %d", p.Limit)
	}
	t := nanos(now(p.Now))
	var recs []*idemstore.Record
	err := s.retryBusy(ctx, "list resumable", func() error {
		recs = recs[:0]
		rows, err := s.db.QueryContext(ctx, queryRecordListResumable, sql.Named("now", t),
			sql.Named("after_scope", p.AfterScope), sql.Named("after_key", p.AfterKey), sql.Named("limit", p.Limit))
		if err != nil {
			return err
		}
		recs, err = sqlstore.Collect(rows, sqlstore.ScanRecord)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return recs, nil
}

// RecordCountUnfinished implements [idemstore.Store.RecordCountUnfinished] with a plain read
// along the partial index of resumable records.
func (s *Store) RecordCountUnfinished(ctx context.Context, p *idemstore.CountUnfinishedParams) (*idemstore.CountUnfinishedResult, error) {
	res := &idemstore.CountUnfinishedResult{Now: now(p.Now).UTC()}
	var oldest sql.NullInt64
	err := s.retryBusy(ctx, "count unfinished", func() error {
		return s.db.QueryRowContext(ctx, queryRecordCountUnfin).Scan(&res.Count, &oldest)
	})
	if err != nil {
		return nil, interpretError(err)
	}
	if oldest.Valid {
		res.Oldest = fromNanos(oldest.Int64)
	}
	return res, nil
}

// RecordRenew implements [idemstore.Store.RecordRenew].
func (s *Store) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	leaseEnd := now(p.Now).Add(p.Lease)
	err := s.writeTx(ctx, "renew", func(tx *sql.Tx) error {
		n, err := execRows(ctx, tx, queryRecordRenew,
			sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.Token),
			sql.Named("lease_end", nanos(leaseEnd)), sql.Named("ttl", int64(p.TTL)))
		if err != nil {
			return err
		}
		if n == 0 {
			return idemstore.ErrLeaseLost
		}
		return nil
	})
	if err != nil {
		return time.Time{}, interpretError(err)
	}
	return leaseEnd.UTC(), nil
}

// RecordDeleteExpired implements [idemstore.Store.RecordDeleteExpired]: one batch, oldest
// expiry first, in a short write transaction of its own so that request traffic waits
// for at most one batch.
func (s *Store) RecordDeleteExpired(ctx context.Context, p *idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("sqlite: idemstore.DeleteExpiredParams.Limit must be positive, got %d", p.Limit)
	}
	t := now(p.Now)
	var n int64
	err := s.writeTx(ctx, "delete expired", func(tx *sql.Tx) (err error) {
		n, err = execRows(ctx, tx, queryRecordDeleteExp,
			sql.Named("cutoff", nanos(t.Add(-p.Retention))), sql.Named("now", nanos(t)),
			sql.Named("limit", p.Limit))
		if err != nil || n == int64(p.Limit) {
			return err
		}
		// Then the records whose expiry overflowed (sqlstore.Nanos): at the end of the
		// expires_at index, a seek away.
		m, err := execRows(ctx, tx, queryRecordDeleteOverflowed, sql.Named("limit", int64(p.Limit)-n))
		n += m
		return err
	})
	if err != nil {
		return 0, interpretError(err)
	}
	return int(n), nil
}
