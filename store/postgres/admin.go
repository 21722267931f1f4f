package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

var _ admin.Store = (*Store)(nil)

// adminQuery returns the statement name of queries/admin.sql for the store's schema.
// These run rarely (an operator's command), so they are filled in per call rather
// than kept with the request path's statements.
func (s *Store) adminQuery(name string) string {
	q, ok := parsedQueries[name]
	if !ok {
		panic("postgres: no query named " + name) // a bug in this package
	}
	return fill(q, s.q.schemaPrefix)
}

// RecordInspect implements [admin.Store.RecordInspect].
func (s *Store) RecordInspect(ctx context.Context, p *admin.RecordInspectParams) (*admin.RecordInspectResult, error) {
	var res admin.RecordInspectResult
	err := s.withRetry(ctx, "inspect", func() error {
		row := s.pool.QueryRow(ctx, s.adminQuery("RecordInspect"), []byte(p.Scope), []byte(p.Key), nowParam(p.Now))
		rec, now, err := scanRecord(row, p.Scope, p.Key, nil)
		if err != nil {
			return err
		}
		res = admin.RecordInspectResult{Record: admin.FromRecord(rec, p.Body), Now: now}
		return nil
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return &res, nil
}

// RecordList implements [admin.Store.RecordList]: along the primary key, one scope's
// records or every scope's, one row more than the limit to tell whether more follow.
func (s *Store) RecordList(ctx context.Context, p *admin.RecordListParams) (*admin.RecordListResult, error) {
	limit, err := p.ListLimit()
	if err != nil {
		return nil, err
	}
	query, args := s.adminQuery("RecordListAll"), []any{[]byte(p.AfterScope), []byte(p.AfterKey)}
	if p.Scope != "" {
		after := ""
		if p.AfterScope == p.Scope {
			after = p.AfterKey
		}
		query, args = s.adminQuery("RecordListScope"), []any{[]byte(p.Scope), []byte(after)}
	}
	filter := p.Filter()
	args = append(args, string(filter.State), limit+1, nowParam(p.Now), filter.OutcomeUnknown)
	if p.Scope == "" {
		args = append(args, []byte(idemstore.ReservedScope))
	}
	if filter.Unfinished {
		query, args = s.adminQuery("RecordListUnfinished"), unfinishedListArgs(p, limit+1)
	}
	var res *admin.RecordListResult
	err = s.withRetry(ctx, "list", func() error {
		rows, err := s.pool.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		res = &admin.RecordListResult{}
		for rows.Next() {
			r, now, err := scanListed(rows)
			if err != nil {
				rows.Close()
				return err
			}
			res.Now = now
			res.Records = append(res.Records, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, interpretError(err)
	}
	if len(res.Records) > limit {
		res.Records, res.More = res.Records[:limit], true
	}
	if res.Now.IsZero() {
		res.Now = time.Now().UTC() // no rows: no store time to report
		if !p.Now.IsZero() {
			res.Now = p.Now
		}
	}
	return res, nil
}

// unfinishedListArgs are the arguments of RecordListUnfinished for p: the cursor, which
// for a scope's list starts at the scope, and the scope (NULL for every scope).
func unfinishedListArgs(p *admin.RecordListParams, limit int) []any {
	afterScope, afterKey, scope := p.AfterScope, p.AfterKey, any(nil)
	if p.Scope != "" {
		scope = []byte(p.Scope)
		if afterScope != p.Scope {
			afterScope, afterKey = p.Scope, ""
		}
	}
	return []any{[]byte(afterScope), []byte(afterKey), scope, limit, nowParam(p.Now)}
}

// scanListed reads one row of RecordListScope, RecordListAll or RecordListUnfinished.
func scanListed(rows pgx.Rows) (*admin.Record, time.Time, error) {
	var (
		r                admin.Record
		scope, key, fp   []byte
		state            string
		leaseEnd         *time.Time
		status           *int32
		bodySize         int32
		created, expires time.Time
		now              time.Time
	)
	err := rows.Scan(&scope, &key, &r.ID, &r.Fingerprint.Version, &fp, &state, &leaseEnd,
		&status, &bodySize, &r.NotStored, &r.RecoveryPoint, &created, &expires, &r.OutcomeUnknown, &r.Operation, &now)
	if err != nil {
		return nil, now, err
	}
	if len(fp) != len(r.Fingerprint.Sum) {
		return nil, now, fmt.Errorf("postgres: stored fingerprint has %d bytes, want %d", len(fp), len(r.Fingerprint.Sum))
	}
	copy(r.Fingerprint.Sum[:], fp)
	r.Scope, r.Key, r.State = string(scope), string(key), idemstore.State(state)
	r.CreatedAt, r.ExpiresAt, r.BodySize = created.UTC(), expires.UTC(), int(bodySize)
	if leaseEnd != nil && r.State == idemstore.StateInFlight {
		r.LeaseEnd = leaseEnd.UTC()
	}
	if status != nil {
		r.Status = int(*status)
	}
	return &r, now.UTC(), nil
}

// RecordDelete implements [admin.Store.RecordDelete] in one statement that locks the
// row, judges its lease and steps and deletes it.
func (s *Store) RecordDelete(ctx context.Context, p *admin.RecordDeleteParams) error {
	var (
		found, deleted   int64
		live, unfinished bool
	)
	err := s.withRetry(ctx, "delete", func() error {
		return s.pool.QueryRow(ctx, s.adminQuery("RecordDelete"), []byte(p.Scope), []byte(p.Key), p.Force, nowParam(p.Now), p.Abandon).
			Scan(&found, &deleted, &live, &unfinished)
	})
	switch {
	case err != nil:
		return interpretError(err)
	case found == 0:
		return idemstore.ErrNotFound
	case deleted == 1:
		return nil
	case live && !p.Force:
		return admin.ErrLeaseLive
	}
	return admin.ErrUnfinished
}

// RecordDeleteScope implements [admin.Store.RecordDeleteScope]: batches of
// params.BatchSize rows along the primary key, each its own statement, until one comes
// back short; then it counts the live leases and unfinished operations it spared.
func (s *Store) RecordDeleteScope(ctx context.Context, p *admin.RecordDeleteScopeParams) (*admin.RecordDeleteScopeResult, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	res := &admin.RecordDeleteScopeResult{}
	batch, scope, now := p.Batch(), []byte(p.Scope), nowParam(p.Now)
	for {
		var n int64
		err := s.withRetry(ctx, "delete_scope", func() error {
			tag, err := s.pool.Exec(ctx, s.adminQuery("RecordDeleteScope"), scope, p.Force, batch, now, p.Abandon)
			n = tag.RowsAffected()
			return err
		})
		res.Deleted += int(n)
		if err != nil {
			return res, interpretError(err)
		}
		if n < int64(batch) {
			break
		}
	}
	if p.Force && p.Abandon {
		return res, nil
	}
	var unfinished, kept int64
	err := s.withRetry(ctx, "count_kept", func() error {
		return s.pool.QueryRow(ctx, s.adminQuery("RecordCountKept"), scope, now, p.Force, p.Abandon).Scan(&unfinished, &kept)
	})
	res.Unfinished, res.Kept = int(unfinished), int(kept)
	return res, interpretError(err)
}

// RecordResolve implements [admin.Store.RecordResolve]: one conditional statement
// that releases or completes the record, then, when it changed nothing, a read that
// says why.
func (s *Store) RecordResolve(ctx context.Context, p *admin.RecordResolveParams) error {
	query, args := s.adminQuery("RecordResolveRelease"), []any{[]byte(p.Scope), []byte(p.Key), nowParam(p.Now)}
	if resp := p.Response; resp != nil {
		body := resp.Body
		if body == nil {
			body = []byte{}
		}
		query, args = s.adminQuery("RecordResolveComplete"), append(args, resp.Status, encodeHeaders(resp.Header), body)
	}
	var n int64
	err := s.withRetry(ctx, "resolve", func() error {
		tag, err := s.pool.Exec(ctx, query, args...)
		n = tag.RowsAffected()
		return err
	})
	if err != nil || n == 1 {
		return interpretError(err)
	}
	res, err := s.RecordInspect(ctx, &admin.RecordInspectParams{Scope: p.Scope, Key: p.Key, Now: p.Now})
	switch {
	case err != nil:
		return err
	case res.Record.Expired(res.Now):
		return idemstore.ErrNotFound
	case res.Record.Unfinished() && res.Record.LeaseLive(res.Now):
		return admin.ErrLeaseLive
	case !res.Record.OutcomeUnknown && !res.Record.Unfinished():
		return admin.ErrNotOutcomeUnknown
	}
	return errors.New("postgres: the record changed while it was resolved; resolve it again")
}

// AdminCapabilities implements [admin.Store.AdminCapabilities]: PostgreSQL can do
// everything.
func (s *Store) AdminCapabilities() admin.Capabilities { return admin.Capabilities{List: true} }

// RecordReseal implements [admin.Resealer.RecordReseal]: the conditional update, then,
// when it changed nothing, a read that says why.
func (s *Store) RecordReseal(ctx context.Context, p *admin.RecordResealParams) error {
	var n int64
	err := s.withRetry(ctx, "reseal", func() error {
		tag, err := s.pool.Exec(ctx, s.adminQuery("RecordReseal"), []byte(p.Scope), []byte(p.Key), p.ID, p.OldBody, p.Body, p.OldSteps, p.Steps)
		n = tag.RowsAffected()
		return err
	})
	if err != nil || n == 1 {
		return interpretError(err)
	}
	if _, err := s.RecordInspect(ctx, &admin.RecordInspectParams{Scope: p.Scope, Key: p.Key}); err != nil {
		return err
	}
	return admin.ErrRecordChanged
}
