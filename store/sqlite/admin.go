package sqlite

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/headercodec"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ admin.Store = (*Store)(nil)

// RecordInspect implements [admin.Store.RecordInspect] with a plain read.
func (s *Store) RecordInspect(ctx context.Context, p *admin.RecordInspectParams) (*admin.RecordInspectResult, error) {
	t := now(p.Now)
	var rec *idemstore.Record
	err := s.retryBusy(ctx, "inspect", func() (err error) {
		rec, err = getRecord(ctx, s.db, p.Scope, p.Key)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return sqlstore.Inspected(rec, p, t)
}

// RecordList implements [admin.Store.RecordList]: along the primary key, one scope's
// records or every scope's, one row more than the limit to tell whether more follow.
func (s *Store) RecordList(ctx context.Context, p *admin.RecordListParams) (*admin.RecordListResult, error) {
	limit, err := p.ListLimit()
	if err != nil {
		return nil, err
	}
	t := now(p.Now)
	query, args := queryAdminListAll, []any{sql.Named("after_scope", p.AfterScope), sql.Named("after_key", p.AfterKey),
		sql.Named("reserved", idemstore.ReservedScope)}
	if p.Scope != "" {
		after := ""
		if p.AfterScope == p.Scope {
			after = p.AfterKey
		}
		query, args = queryAdminListScope, []any{sql.Named("scope", p.Scope), sql.Named("after_key", after)}
	}
	filter := p.Filter()
	args = append(args, sql.Named("state", string(filter.State)), sql.Named("outcome_unknown", filter.OutcomeUnknown), sql.Named("limit", limit+1))
	if filter.Unfinished {
		query, args = queryAdminListUnfinished, unfinishedListArgs(p, limit+1)
	}
	var recs []*admin.Record
	err = s.retryBusy(ctx, "list", func() error {
		rows, err := s.db.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		recs, err = sqlstore.Collect(rows, sqlstore.ScanListed)
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return sqlstore.ListResult(recs, limit, t), nil
}

// unfinishedListArgs are the arguments of admin_list_unfinished.sql for p
// (sqlstore.UnfinishedCursor).
func unfinishedListArgs(p *admin.RecordListParams, limit int) []any {
	afterScope, afterKey, scope := sqlstore.UnfinishedCursor(p)
	return []any{sql.Named("after_scope", afterScope), sql.Named("after_key", afterKey), sql.Named("scope", scope),
		sql.Named("limit", limit)}
}

// RecordDelete implements [admin.Store.RecordDelete]: the record is read, its lease
// and steps judged and the row deleted under the write lock.
func (s *Store) RecordDelete(ctx context.Context, p *admin.RecordDeleteParams) error {
	t := now(p.Now)
	return interpretError(s.writeTx(ctx, "admin delete", func(tx *sql.Tx) error {
		rec, err := getRecord(ctx, tx, p.Scope, p.Key)
		if err != nil {
			return err
		}
		if err := admin.DeleteError(rec, t, p); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, queryAdminDelete, sql.Named("scope", p.Scope), sql.Named("key", p.Key))
		return err
	}))
}

// RecordDeleteScope implements [admin.Store.RecordDeleteScope]: batches of
// params.BatchSize rows, each in a short write transaction of its own so that request
// traffic waits for at most one batch, until one comes back short; then it counts the
// live leases and unfinished operations it spared.
func (s *Store) RecordDeleteScope(ctx context.Context, p *admin.RecordDeleteScopeParams) (*admin.RecordDeleteScopeResult, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	t := nanos(now(p.Now))
	res := &admin.RecordDeleteScopeResult{}
	batch := p.Batch()
	for {
		var n int64
		err := s.writeTx(ctx, "admin delete scope", func(tx *sql.Tx) (err error) {
			n, err = execRows(ctx, tx, queryAdminDeleteScope, sql.Named("scope", p.Scope),
				sql.Named("force", p.Force), sql.Named("abandon", p.Abandon), sql.Named("now", t), sql.Named("limit", batch))
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
	err := s.retryBusy(ctx, "count kept", func() error {
		return s.db.QueryRowContext(ctx, queryAdminCountKept, sql.Named("scope", p.Scope), sql.Named("now", t),
			sql.Named("force", p.Force), sql.Named("abandon", p.Abandon)).Scan(&res.Unfinished, &res.Kept)
	})
	return res, interpretError(err)
}

// RecordResolve implements [admin.Store.RecordResolve] in one write transaction: the
// conditional release or completion, then, when it changed nothing, a read that says
// why.
func (s *Store) RecordResolve(ctx context.Context, p *admin.RecordResolveParams) error {
	t := now(p.Now)
	return interpretError(s.writeTx(ctx, "admin resolve", func(tx *sql.Tx) error {
		args := []any{sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("now", nanos(t))}
		query := queryAdminResolveRelease
		if resp := p.Response; resp != nil {
			body := resp.Body
			if body == nil {
				body = []byte{}
			}
			query = queryAdminResolveComplete
			args = append(args, sql.Named("status", resp.Status), sql.Named("headers", headercodec.Encode(resp.Header)),
				sql.Named("body", body))
		}
		n, err := execRows(ctx, tx, query, args...)
		if err != nil || n == 1 {
			return err
		}
		rec, err := getRecord(ctx, tx, p.Scope, p.Key)
		if err != nil {
			return err
		}
		return admin.ResolveError(rec, t)
	}))
}

// AdminCapabilities implements [admin.Store.AdminCapabilities]: SQLite can do
// everything.
func (s *Store) AdminCapabilities() admin.Capabilities { return admin.Capabilities{List: true} }

// RecordReseal implements [admin.Resealer.RecordReseal] in one write transaction: the
// conditional update, then, when it changed nothing, a read that says why.
func (s *Store) RecordReseal(ctx context.Context, p *admin.RecordResealParams) error {
	return interpretError(s.writeTx(ctx, "admin reseal", func(tx *sql.Tx) error {
		n, err := execRows(ctx, tx, queryAdminReseal, sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("id", p.ID),
			sql.Named("body", nilBlob(p.Body)), sql.Named("old_body", p.OldBody), sql.Named("steps", nilBlob(p.Steps)), sql.Named("old_steps", p.OldSteps))
		if err != nil || n == 1 {
			return err
		}
		rec, err := getRecord(ctx, tx, p.Scope, p.Key)
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
