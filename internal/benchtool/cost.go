package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// What a run costs PostgreSQL, per request: the commits of the benchmark's database
// (pg_stat_database) and the WAL the server wrote and synced (pg_stat_wal; the
// server's, so the machine should run nothing else on it). A backend reports its
// counts when it has been idle a while or when it exits, so each measurement closes the
// server's pool first (benchtool serve's POST /admin/reset) and waits for its backends
// to be gone: their counts are in, before and after the run alike.

// cost is a run's cost per request.
type cost struct {
	Commits    float64 `json:"commits"`
	Rollbacks  float64 `json:"rollbacks"`
	WALRecords float64 `json:"wal_records"`
	WALFPI     float64 `json:"wal_fpi"`
	WALBytes   float64 `json:"wal_bytes"`
	WALSyncs   float64 `json:"wal_syncs"`
}

// counters are the server's cumulative counts at one moment.
type counters struct {
	commits, rollbacks, records, fpi, bytes, syncs float64
}

// meter reads the counters through admin, a connection to another database than db,
// the benchmark's, whose pool it resets through base (benchtool serve).
type meter struct {
	admin *pgx.Conn
	db    string
	base  string
}

// quiesce closes the server's pool and waits until none of db's backends is left, so
// that every count of theirs is reported.
func (m *meter) quiesce(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.base+"/admin/reset", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := m.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, m.db).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d backends of %s still connected 30 s after the pool was reset", n, m.db)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (m *meter) read(ctx context.Context) (counters, error) {
	var c counters
	_, _ = m.admin.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	err := m.admin.QueryRow(ctx, `
		SELECT d.xact_commit, d.xact_rollback, w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_sync
		FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = $1`, m.db).
		Scan(&c.commits, &c.rollbacks, &c.records, &c.fpi, &c.bytes, &c.syncs)
	return c, err
}

// measure is measure (one run) with its cost per request.
func (m *meter) measure(ctx context.Context, args []string, concurrency int, d time.Duration) (*summary, error) {
	if err := m.quiesce(ctx); err != nil {
		return nil, err
	}
	before, err := m.read(ctx)
	if err != nil {
		return nil, err
	}
	s, err := measure(ctx, m.base, args, concurrency, d)
	if err != nil {
		return nil, err
	}
	if err := m.quiesce(ctx); err != nil {
		return nil, err
	}
	after, err := m.read(ctx)
	if err != nil {
		return nil, err
	}
	n := float64(s.Requests)
	s.Cost = &cost{
		Commits: (after.commits - before.commits) / n, Rollbacks: (after.rollbacks - before.rollbacks) / n,
		WALRecords: (after.records - before.records) / n, WALFPI: (after.fpi - before.fpi) / n,
		WALBytes: (after.bytes - before.bytes) / n, WALSyncs: (after.syncs - before.syncs) / n,
	}
	return s, nil
}

// meanCost is the mean of the runs' costs, nil when a run has none.
func meanCost(ss []*summary) *cost {
	m := &cost{}
	for _, s := range ss {
		if s.Cost == nil {
			return nil
		}
		k := float64(len(ss))
		m.Commits += s.Cost.Commits / k
		m.Rollbacks += s.Cost.Rollbacks / k
		m.WALRecords += s.Cost.WALRecords / k
		m.WALFPI += s.Cost.WALFPI / k
		m.WALBytes += s.Cost.WALBytes / k
		m.WALSyncs += s.Cost.WALSyncs / k
	}
	return m
}
