package memory

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

var _ admin.Store = (*Store)(nil)

// RecordInspect implements [admin.Store.RecordInspect].
func (s *Store) RecordInspect(ctx context.Context, p *admin.RecordInspectParams) (*admin.RecordInspectResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now(p.Now)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[recordKey{p.Scope, p.Key}]
	if rec == nil {
		return nil, idemstore.ErrNotFound
	}
	return &admin.RecordInspectResult{Record: admin.FromRecord(copyRecord(rec), p.Body), Now: t}, nil
}

// RecordList implements [admin.Store.RecordList] by sorting the matching records.
func (s *Store) RecordList(ctx context.Context, p *admin.RecordListParams) (*admin.RecordListResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit, err := p.ListLimit()
	if err != nil {
		return nil, err
	}
	t := now(p.Now)
	after := recordKey{p.AfterScope, p.AfterKey}
	filter := p.Filter()
	s.mu.Lock()
	var found []*admin.Record
	for k, rec := range s.records {
		if (k.scope == p.Scope || p.Scope == "" && k.scope != idemstore.ReservedScope) && filter.Matches(rec) &&
			(p.AfterKey == "" || compareKeys(k, after) > 0) {
			found = append(found, admin.FromRecord(rec, false))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(found, func(a, b *admin.Record) int {
		return compareKeys(recordKey{a.Scope, a.Key}, recordKey{b.Scope, b.Key})
	})
	return &admin.RecordListResult{Records: found[:min(len(found), limit)], More: len(found) > limit, Now: t}, nil
}

func compareKeys(a, b recordKey) int {
	return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.key, b.key))
}

// RecordResolve implements [admin.Store.RecordResolve].
func (s *Store) RecordResolve(ctx context.Context, p *admin.RecordResolveParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := recordKey{p.Scope, p.Key}
	rec := s.records[k]
	if rec == nil {
		return idemstore.ErrNotFound
	}
	t := now(p.Now)
	if err := admin.ResolveError(rec, t); err != nil {
		return err
	}
	if p.Response == nil {
		delete(s.records, k)
		return nil
	}
	if rec.Unfinished() {
		// Completed now, it lives its TTL from now.
		rec.ExpiresAt = t.Add(rec.ExpiresAt.Sub(rec.CreatedAt))
		rec.State, rec.Token, rec.LeaseEnd = idemstore.StateCompleted, "", time.Time{}
	}
	rec.Response = copyResponse(p.Response)
	rec.Response.NotStored, rec.Response.OutcomeUnknown = false, false
	rec.RecoveryPoint = ""
	return nil
}

// RecordDelete implements [admin.Store.RecordDelete].
func (s *Store) RecordDelete(ctx context.Context, p *admin.RecordDeleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := now(p.Now)
	k := recordKey{p.Scope, p.Key}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := admin.DeleteError(s.records[k], t, p); err != nil {
		return err
	}
	delete(s.records, k)
	return nil
}

// RecordDeleteScope implements [admin.Store.RecordDeleteScope], in one step: the
// store's mutex is held for a map walk, never for I/O.
func (s *Store) RecordDeleteScope(ctx context.Context, p *admin.RecordDeleteScopeParams) (*admin.RecordDeleteScopeResult, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := now(p.Now)
	res := &admin.RecordDeleteScopeResult{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, rec := range s.records {
		switch {
		case k.scope != p.Scope:
		case rec.Unfinished() && !p.Abandon:
			res.Unfinished++
		case rec.LeaseLive(t) && !p.Force:
			res.Kept++
		default:
			delete(s.records, k)
			res.Deleted++
		}
	}
	return res, nil
}

// AdminCapabilities implements [admin.Store.AdminCapabilities]: the memory store can
// do everything.
func (s *Store) AdminCapabilities() admin.Capabilities { return admin.Capabilities{List: true} }

// RecordReseal implements [admin.Resealer.RecordReseal].
func (s *Store) RecordReseal(ctx context.Context, p *admin.RecordResealParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[recordKey{p.Scope, p.Key}]
	switch {
	case rec == nil:
		return idemstore.ErrNotFound
	case rec.ID != p.ID,
		p.Body != nil && (rec.Response == nil || !bytes.Equal(rec.Response.Body, p.OldBody)),
		p.Steps != nil && !bytes.Equal(rec.Steps, p.OldSteps):
		return admin.ErrRecordChanged
	}
	if p.Body != nil {
		resp := *rec.Response
		resp.Body = bytes.Clone(p.Body)
		rec.Response = &resp
	}
	if p.Steps != nil {
		rec.Steps = bytes.Clone(p.Steps)
	}
	return nil
}
