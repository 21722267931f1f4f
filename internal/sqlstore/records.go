package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/headercodec"
)

// Now returns the injected time when non-zero, else the host clock.
func Now(injected time.Time) time.Time {
	if !injected.IsZero() {
		return injected
	}
	return time.Now()
}

// FromNanos is the time of stored unix nanoseconds, in UTC.
func FromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// Nanos scans a time column: integer unix nanoseconds, as an integer or as its decimal
// text (MySQL's text protocol), or the REAL that SQLite made of an expiry that
// overflowed int64 (a TTL past idem.MaxTTL, which versions before it accepted), read as
// the latest time int64 holds, so that such a record is readable, replayed and
// removable rather than an error on every read.
type Nanos int64

// Scan implements [sql.Scanner].
func (n *Nanos) Scan(v any) error {
	switch v := v.(type) {
	case int64:
		*n = Nanos(v)
	case []byte:
		i, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return fmt.Errorf("a time column holds %q, want integer nanoseconds", v)
		}
		*n = Nanos(i)
	case float64:
		switch {
		case v >= math.MaxInt64:
			*n = math.MaxInt64
		case v <= math.MinInt64:
			*n = math.MinInt64
		default:
			*n = Nanos(v)
		}
	default:
		return fmt.Errorf("a time column holds %T, want integer nanoseconds", v)
	}
	return nil
}

// RowScanner is a *sql.Row or *sql.Rows.
type RowScanner interface{ Scan(dest ...any) error }

// ScanRecord reads one record in the columns scope, key, record_id,
// fingerprint_version, fingerprint, state, token, lease_end, response_status,
// response_headers, response_body, response_not_stored, outcome_unknown,
// recovery_point, steps, operation, created_at, expires_at.
func ScanRecord(row RowScanner) (*idemstore.Record, error) {
	var (
		rec       idemstore.Record
		fpSum     []byte
		state     string
		token     sql.NullString
		leaseEnd  sql.NullInt64
		status    sql.NullInt64
		headers   []byte
		body      []byte
		notStored bool
		unknown   bool
		created   Nanos
		expires   Nanos
	)
	err := row.Scan(
		&rec.Scope, &rec.Key, &rec.ID, &rec.Fingerprint.Version, &fpSum, &state, &token, &leaseEnd,
		&status, &headers, &body, &notStored, &unknown, &rec.RecoveryPoint, &rec.Steps, &rec.Operation, &created, &expires)
	if err != nil {
		return nil, err
	}
	if err := copyFingerprint(&rec.Fingerprint, fpSum); err != nil {
		return nil, err
	}
	rec.State = idemstore.State(state)
	rec.Token = token.String
	if leaseEnd.Valid {
		rec.LeaseEnd = FromNanos(leaseEnd.Int64)
	}
	rec.CreatedAt = FromNanos(int64(created))
	rec.ExpiresAt = FromNanos(int64(expires))
	if rec.State == idemstore.StateCompleted {
		h, err := headercodec.Decode(headers)
		if err != nil {
			return nil, err
		}
		rec.Response = &idemstore.Response{Status: int(status.Int64), Header: h, Body: body, NotStored: notStored, OutcomeUnknown: unknown}
	}
	return &rec, nil
}

// ScanListed reads one listed record (admin.Store.RecordList) in the columns scope,
// key, record_id, fingerprint_version, fingerprint, state, lease_end, response_status,
// the body's length, response_not_stored, recovery_point, created_at, expires_at,
// outcome_unknown, operation.
func ScanListed(rows RowScanner) (*admin.Record, error) {
	var (
		r                admin.Record
		fp               []byte
		state            string
		leaseEnd, status sql.NullInt64
		created, expires Nanos
	)
	err := rows.Scan(&r.Scope, &r.Key, &r.ID, &r.Fingerprint.Version, &fp, &state, &leaseEnd,
		&status, &r.BodySize, &r.NotStored, &r.RecoveryPoint, &created, &expires, &r.OutcomeUnknown, &r.Operation)
	if err != nil {
		return nil, err
	}
	if err := copyFingerprint(&r.Fingerprint, fp); err != nil {
		return nil, err
	}
	r.State = idemstore.State(state)
	r.CreatedAt, r.ExpiresAt = FromNanos(int64(created)), FromNanos(int64(expires))
	if leaseEnd.Valid && r.State == idemstore.StateInFlight {
		r.LeaseEnd = FromNanos(leaseEnd.Int64)
	}
	r.Status = int(status.Int64)
	return &r, nil
}

func copyFingerprint(fp *idemstore.Fingerprint, sum []byte) error {
	if len(sum) != len(fp.Sum) {
		return fmt.Errorf("record has a fingerprint of %d bytes, want %d", len(sum), len(fp.Sum))
	}
	copy(fp.Sum[:], sum)
	return nil
}

// Collect reads every row of rows with scan, and closes rows.
func Collect[T any](rows *sql.Rows, scan func(RowScanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// AnswerWithoutWriting returns the claim's answer when rec, as read, needs no write: a
// replay, a duplicate in flight or a mismatch; nil when the claim must write.
func AnswerWithoutWriting(rec *idemstore.Record, fp idemstore.Fingerprint, t time.Time) *idemstore.ClaimResult {
	var outcome idemstore.ClaimOutcome
	switch idemstore.Decide(rec, fp, t) {
	case idemstore.DecideReplay:
		outcome = idemstore.ClaimCompleted
	case idemstore.DecideInFlight:
		outcome = idemstore.ClaimInFlight
	case idemstore.DecideMismatch:
		outcome = idemstore.ClaimMismatch
	default:
		return nil
	}
	return &idemstore.ClaimResult{Outcome: outcome, Record: rec, Now: t}
}

// NewClaim is the record that a claim of an absent or expired key writes at t.
func NewClaim(p *idemstore.ClaimParams, t time.Time) *idemstore.Record {
	leaseEnd := t.Add(p.Lease)
	return &idemstore.Record{
		Scope:       p.Scope,
		Key:         p.Key,
		ID:          p.RecordID,
		Fingerprint: p.Fingerprint,
		State:       idemstore.StateInFlight,
		Token:       p.Token,
		LeaseEnd:    leaseEnd.UTC(),
		CreatedAt:   t.UTC(),
		ExpiresAt:   idemstore.InFlightExpiresAt(t, p.TTL, leaseEnd).UTC(),
	}
}

// TookOver updates rec, read under the row's lock, for the takeover of its lapsed
// lease by p at t, as the store's UPDATE did, and returns the claim's result.
func TookOver(rec *idemstore.Record, p *idemstore.ClaimParams, t time.Time) *idemstore.ClaimResult {
	leaseEnd := t.Add(p.Lease)
	released := rec.Token == ""
	rec.Token = p.Token
	rec.LeaseEnd = leaseEnd.UTC()
	rec.ExpiresAt = idemstore.InFlightExpiresAt(rec.CreatedAt, p.TTL, leaseEnd).UTC()
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec, TookOver: true, Released: released, Now: t}
}

// MarkedUnknown updates rec for its completion as outcome unknown by p at t
// (idem.DecideUnknown), as the store's UPDATE did, and returns the claim's result.
func MarkedUnknown(rec *idemstore.Record, p *idemstore.ClaimParams, t time.Time) *idemstore.ClaimResult {
	rec.State, rec.Token, rec.LeaseEnd = idemstore.StateCompleted, "", time.Time{}
	rec.Response = &idemstore.Response{Status: 500, OutcomeUnknown: true}
	rec.ExpiresAt = rec.CompletionExpiresAt(t, p.TTL).UTC()
	return &idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec, MarkedUnknown: true, Now: t}
}

// ListResult is the page of a listing that read limit+1 records.
func ListResult(recs []*admin.Record, limit int, t time.Time) *admin.RecordListResult {
	res := &admin.RecordListResult{Records: recs, Now: t.UTC()}
	if len(recs) > limit {
		res.Records, res.More = recs[:limit], true
	}
	return res
}

// UnfinishedCursor is where a listing of unfinished operations starts for p: after
// (afterScope, afterKey), which for a scope's list starts at the scope, and of scope
// only (nil for every scope).
func UnfinishedCursor(p *admin.RecordListParams) (afterScope, afterKey string, scope any) {
	afterScope, afterKey = p.AfterScope, p.AfterKey
	if p.Scope != "" {
		scope = p.Scope
		if afterScope != p.Scope {
			afterScope, afterKey = p.Scope, ""
		}
	}
	return afterScope, afterKey, scope
}

// Inspected is admin.Store.RecordInspect's answer for rec read at t: not found when
// rec is nil.
func Inspected(rec *idemstore.Record, p *admin.RecordInspectParams, t time.Time) (*admin.RecordInspectResult, error) {
	if rec == nil {
		return nil, idemstore.ErrNotFound
	}
	return &admin.RecordInspectResult{Record: admin.FromRecord(rec, p.Body), Now: t.UTC()}, nil
}

// Execer is what a statement needs: a pool, a connection or a transaction.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ExecRows runs a statement and returns how many rows it affected, as the driver
// counts them (MySQL's store asks for the rows matched: clientFoundRows).
func ExecRows(ctx context.Context, e Execer, query string, args ...any) (int64, error) {
	res, err := e.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
