package mysql

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/headercodec"
	"github.com/idem-go/idem/internal/sqlstore"
)

// RecordInspect implements [admin.Store.RecordInspect] with a plain read.
func (s *Store) RecordInspect(ctx context.Context, p *admin.RecordInspectParams) (*admin.RecordInspectResult, error) {
	t := now(p.Now)
	rec, err := getRecord(ctx, s.db, p.Scope, p.Key, false)
	if err != nil {
		return nil, interpretError(err)
	}
	return sqlstore.Inspected(rec, p, t)
}

// RecordList implements [admin.Store.RecordList]: along the primary key, one scope's
// records or every scope's (the unfinished operations along their own index), one row
// more than the limit to tell whether more follow.
func (s *Store) RecordList(ctx context.Context, p *admin.RecordListParams) (*admin.RecordListResult, error) {
	limit, err := p.ListLimit()
	if err != nil {
		return nil, err
	}
	t := now(p.Now)
	filter := p.Filter()
	state := string(filter.State)
	var query string
	var args []any
	switch {
	case filter.Unfinished:
		query, args = queryAdminListUnfinished, unfinishedListArgs(p, limit+1)
	case p.Scope != "":
		after := ""
		if p.AfterScope == p.Scope {
			after = p.AfterKey
		}
		query, args = queryAdminListScope, []any{p.Scope, after, state, state, filter.OutcomeUnknown, limit + 1}
	default:
		query, args = queryAdminListAll, []any{p.AfterScope, p.AfterScope, p.AfterKey, state, state,
			filter.OutcomeUnknown, idemstore.ReservedScope, limit + 1}
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, interpretError(err)
	}
	recs, err := sqlstore.Collect(rows, sqlstore.ScanListed)
	if err != nil {
		return nil, interpretError(err)
	}
	return sqlstore.ListResult(recs, limit, t), nil
}

// unfinishedListArgs are the arguments of admin_list_unfinished.sql for p
// (sqlstore.UnfinishedCursor).
func unfinishedListArgs(p *admin.RecordListParams, limit int) []any {
	afterScope, afterKey, scope := sqlstore.UnfinishedCursor(p)
	return []any{afterScope, afterScope, afterKey, scope, scope, limit}
}

// RecordDelete implements [admin.Store.RecordDelete]: the record is read and locked,
// its lease and steps judged and the row deleted, in one transaction.
func (s *Store) RecordDelete(ctx context.Context, p *admin.RecordDeleteParams) error {
	t := now(p.Now)
	return interpretError(s.inTx(ctx, "admin delete", func(tx *sql.Tx) error {
		rec, err := getRecord(ctx, tx, p.Scope, p.Key, true)
		if err != nil {
			return err
		}
		if err := admin.DeleteError(rec, t, p); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, queryAdminDelete, p.Scope, p.Key)
		return err
	}))
}

// RecordDeleteScope implements [admin.Store.RecordDeleteScope]: autocommit batches of
// params.BatchSize rows, so that request traffic waits for at most one batch's locks,
// until one comes back short; then it counts the live leases and unfinished operations
// it spared.
func (s *Store) RecordDeleteScope(ctx context.Context, p *admin.RecordDeleteScopeParams) (*admin.RecordDeleteScopeResult, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	t := nanos(now(p.Now))
	res := &admin.RecordDeleteScopeResult{}
	batch := p.Batch()
	for {
		var n int64
		err := s.withRetry(ctx, "admin delete scope", func() (err error) {
			n, err = execRows(ctx, s.db, queryAdminDeleteScope, p.Scope, p.Force, t, p.Abandon, batch)
			return err
		})
		if err != nil {
			return res, interpretError(err)
		}
		res.Deleted += int(n)
		if n < int64(batch) {
			break
		}
	}
	if p.Force && p.Abandon {
		return res, nil
	}
	err := s.db.QueryRowContext(ctx, queryAdminCountKept, p.Abandon, t, p.Force, p.Abandon, p.Scope).
		Scan(&res.Unfinished, &res.Kept)
	return res, interpretError(err)
}

// RecordResolve implements [admin.Store.RecordResolve] in one transaction: the
// conditional release or completion, then, when it changed nothing, a read that says
// why.
func (s *Store) RecordResolve(ctx context.Context, p *admin.RecordResolveParams) error {
	t := now(p.Now)
	return interpretError(s.inTx(ctx, "admin resolve", func(tx *sql.Tx) error {
		query, args := queryAdminResolveRelease, []any{p.Scope, p.Key, nanos(t), nanos(t)}
		if resp := p.Response; resp != nil {
			body := resp.Body
			if body == nil {
				body = []byte{}
			}
			query = queryAdminResolveComplete
			args = []any{nanos(t), resp.Status, headercodec.Encode(resp.Header), body, p.Scope, p.Key, nanos(t), nanos(t)}
		}
		n, err := execRows(ctx, tx, query, args...)
		if err != nil || n == 1 {
			return err
		}
		rec, err := getRecord(ctx, tx, p.Scope, p.Key, false)
		if err != nil {
			return err
		}
		return admin.ResolveError(rec, t)
	}))
}

// AdminCapabilities implements [admin.Store.AdminCapabilities]: MySQL can do
// everything.
func (s *Store) AdminCapabilities() admin.Capabilities { return admin.Capabilities{List: true} }

// RecordReseal implements [admin.Resealer.RecordReseal] in one transaction: the
// conditional update (a compare-and-swap of the sealed values, by the record's id),
// then, when it matched nothing, a read that says why.
func (s *Store) RecordReseal(ctx context.Context, p *admin.RecordResealParams) error {
	body, steps := nilBlob(p.Body), nilBlob(p.Steps)
	return interpretError(s.inTx(ctx, "admin reseal", func(tx *sql.Tx) error {
		n, err := execRows(ctx, tx, queryAdminReseal, body, body, steps, steps, p.Scope, p.Key, p.ID,
			body, p.OldBody, steps, p.OldSteps)
		if err != nil || n == 1 {
			return err
		}
		rec, err := getRecord(ctx, tx, p.Scope, p.Key, false)
		switch {
		case err != nil:
			return err
		case rec == nil:
			return idemstore.ErrNotFound
		}
		return admin.ErrRecordChanged
	}))
}

// nilBlob is b, or NULL when b is nil.
func nilBlob(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}
