package redis

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

var _ admin.Store = (*Store)(nil)

// scopeDigest is what a record's hash keeps of its scope (field "sc"): the first 16
// bytes of the scope's SHA-256, so that a scope's records can be found and deleted
// (RecordDeleteScope) without Redis holding the principal.
func scopeDigest(scope string) string {
	sum := sha256.Sum256([]byte(scope))
	return string(sum[:16])
}

// RecordInspect implements [admin.Store.RecordInspect]: the record in any state,
// expired or not, until Redis evicts its key (Config.TTLMargin after it expires).
func (s *Store) RecordInspect(ctx context.Context, p *admin.RecordInspectParams) (*admin.RecordInspectResult, error) {
	res, err := inspectScript.Run(ctx, s.client, []string{s.RecordKey(p.Scope, p.Key)}, nowArg(p.Now)).Slice()
	if err != nil {
		return nil, s.interpretError(err)
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("redis store: inspect script answered %d values", len(res))
	}
	nowStr, _ := res[0].(string)
	now, err := parseMicros(nowStr)
	if err != nil {
		return nil, err
	}
	fields, ok := res[1].([]any)
	if !ok {
		return nil, fmt.Errorf("redis store: inspect script answered %T", res[1])
	}
	if len(fields) == 0 {
		return nil, idemstore.ErrNotFound
	}
	rec, err := decodeRecord(p.Scope, p.Key, fields)
	if err != nil {
		return nil, err
	}
	return &admin.RecordInspectResult{Record: admin.FromRecord(rec, p.Body), Now: now}, nil
}

// errCannotList says why a Redis store cannot list.
var errCannotList = fmt.Errorf("redis store: cannot list records: a record's Redis key is a digest of its scope and key, and Redis keeps neither (inspect or delete a key by name, or delete a whole scope): %w", errors.ErrUnsupported)

// RecordList implements [admin.Store.RecordList]: Redis cannot list, so it returns an
// error wrapping [errors.ErrUnsupported].
func (s *Store) RecordList(context.Context, *admin.RecordListParams) (*admin.RecordListResult, error) {
	return nil, errCannotList
}

// Answers of the delete script.
const (
	deleteDeleted = 1
	deleteNone    = 0
	deleteKept    = -1
)

// RecordDelete implements [admin.Store.RecordDelete] in one script that judges the
// lease with Redis's clock and deletes the key.
func (s *Store) RecordDelete(ctx context.Context, p *admin.RecordDeleteParams) error {
	n, err := deleteScript.Run(ctx, s.client, []string{s.RecordKey(p.Scope, p.Key)},
		nowArg(p.Now), "", boolArg(p.Force)).Int()
	switch {
	case err != nil:
		return s.interpretError(err)
	case n == deleteNone:
		return idemstore.ErrNotFound
	case n == deleteKept:
		return admin.ErrLeaseLive
	}
	return nil
}

// RecordResolve implements [admin.Store.RecordResolve] in one script that checks the
// record's scope, expiry and outcome and releases or completes it.
func (s *Store) RecordResolve(ctx context.Context, p *admin.RecordResolveParams) error {
	mode, status, header, body := "release", "", "", ""
	if resp := p.Response; resp != nil {
		mode, status, header, body = "complete", strconv.Itoa(resp.Status), encodeHeader(resp.Header), string(resp.Body)
	}
	n, err := resolveScript.Run(ctx, s.client, []string{s.RecordKey(p.Scope, p.Key)},
		nowArg(p.Now), scopeDigest(p.Scope), mode, status, header, body).Int()
	switch {
	case err != nil:
		return s.interpretError(err)
	case n == 0:
		return idemstore.ErrNotFound
	case n < 0:
		return admin.ErrNotOutcomeUnknown
	}
	return nil
}

// RecordDeleteScope implements [admin.Store.RecordDeleteScope]. A record's key does
// not show its scope, so it SCANs every record key of the store's prefix (on every
// master of a cluster), params.BatchSize at a time, and sends the delete script for
// each key of a page in one pipeline; the script deletes only records whose "sc" field
// is the scope's digest. This reads the whole keyspace of the prefix once, without
// blocking Redis (SCAN is incremental); a record claimed while the scan runs may be
// missed, as SCAN guarantees only the keys present from its start to its end.
func (s *Store) RecordDeleteScope(ctx context.Context, p *admin.RecordDeleteScopeParams) (*admin.RecordDeleteScopeResult, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var (
		mu  sync.Mutex
		res admin.RecordDeleteScopeResult
	)
	args := []any{nowArg(p.Now), scopeDigest(p.Scope), boolArg(p.Force)}
	match := escapeGlob(s.cfg.KeyPrefix) + "{*"
	node := func(ctx context.Context, c goredis.Cmdable) error {
		if err := deleteScript.Load(ctx, c).Err(); err != nil {
			return err
		}
		var cursor uint64
		for {
			keys, next, err := c.ScanType(ctx, cursor, match, int64(p.Batch()), "hash").Result()
			if err != nil {
				return err
			}
			deleted, kept, err := deleteKeys(ctx, c, keys, args)
			mu.Lock()
			res.Deleted += deleted
			res.Kept += kept
			mu.Unlock()
			if err != nil || next == 0 {
				return err
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return node(ctx, c) })
	} else {
		err = node(ctx, s.client)
	}
	return &res, s.interpretError(err)
}

// deleteKeys runs the delete script on each of keys, all on the node c, in one
// pipeline, and counts what it deleted and kept.
func deleteKeys(ctx context.Context, c goredis.Cmdable, keys []string, args []any) (deleted, kept int, err error) {
	if len(keys) == 0 {
		return 0, 0, nil
	}
	pipe := c.Pipeline()
	cmds := make([]*goredis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = deleteScript.EvalSha(ctx, pipe, []string{k}, args...)
	}
	_, err = pipe.Exec(ctx) // the first command's error, if any failed
	for _, cmd := range cmds {
		switch n, cerr := cmd.Int(); {
		case cerr != nil:
		case n == deleteDeleted:
			deleted++
		case n == deleteKept:
			kept++
		}
	}
	return deleted, kept, err
}

// escapeGlob escapes the characters that SCAN's MATCH pattern treats specially.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// AdminCapabilities implements [admin.Store.AdminCapabilities]: Redis cannot list.
func (s *Store) AdminCapabilities() admin.Capabilities { return admin.Capabilities{List: false} }
