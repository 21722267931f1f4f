package postgres_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
)

// Migration 0010 (a lean record, issue 41): the index of expiry goes once the upgrade
// is finalized (SPEC §20). These tests take a schema as the previous version left it
// (migrations 0001–0009), with records in every state and a filled table, and upgrade
// it.

// previousSchema opens a store on a fresh schema migrated up to 0009 only.
func previousSchema(t *testing.T) schemaStore {
	t.Helper()
	dbURL, schema := pgtest.Schema(t)
	s := openIn(t, postgres.Config{MaxConns: 4, DisableCleaner: true}, dbURL, schema, nil, false)
	if err := s.MigrateTo(t.Context(), 9); err != nil {
		t.Fatalf("migrating to 0009: %v", err)
	}
	return s
}

// indexExists reports whether the schema holds an index named name.
func indexExists(t *testing.T, s schemaStore, name string) bool {
	t.Helper()
	var ok bool
	if err := s.Pool().QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, s.table(name)).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// relfilenode is the file of the records' table: a rewrite makes a new one.
func relfilenode(t *testing.T, s schemaStore) uint32 {
	t.Helper()
	var n uint32
	if err := s.Pool().QueryRow(t.Context(), `SELECT relfilenode FROM pg_class WHERE oid = $1::regclass`, s.table("idem_records")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMigration0010UpgradesAFilledTableWithRecordsInEveryStateInPlace(t *testing.T) {
	t.Parallel()
	s := previousSchema(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	complete := func(p *idemstore.ClaimParams, at time.Time) {
		t.Helper()
		if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, TTL: p.TTL, Response: resp, Now: at}); err != nil {
			t.Fatal(err)
		}
	}
	step := func(p *idemstore.ClaimParams) {
		t.Helper()
		if err := s.RecordStep(ctx, &idemstore.StepParams{Scope: p.Scope, Key: p.Key, Token: p.Token, RecoveryPoint: "charge_pending",
			Steps: []byte(`[{"step":"charge_pending","result":{"id":"ch_1"}}]`), Operation: "charge"}); err != nil {
			t.Fatal(err)
		}
	}

	// One record in each state, by the store's own statements.
	inFlight := claimParams("in-flight", now)
	mustClaim(t, s, inFlight, idemstore.ClaimAcquired)
	done := claimParams("completed", now)
	mustClaim(t, s, done, idemstore.ClaimAcquired)
	complete(done, now)
	old := claimParams("expired", now.Add(-3*time.Hour))
	mustClaim(t, s, old, idemstore.ClaimAcquired)
	complete(old, now.Add(-3*time.Hour))
	lapsed := claimParams("lapsed", now.Add(-time.Minute))
	mustClaim(t, s, lapsed, idemstore.ClaimAcquired)
	unfinished := claimParams("unfinished", now.Add(-3*time.Hour))
	mustClaim(t, s, unfinished, idemstore.ClaimAcquired)
	step(unfinished)
	released := claimParams("released", now)
	mustClaim(t, s, released, idemstore.ClaimAcquired)
	step(released)
	if err := s.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: released.Scope, Key: released.Key, Token: released.Token, Now: now}); err != nil {
		t.Fatal(err)
	}
	unknown := claimParams("unknown", now.Add(-time.Minute))
	mustClaim(t, s, unknown, idemstore.ClaimAcquired)
	mark := claimParams("unknown", now)
	mark.Fingerprint, mark.OnLapse = unknown.Fingerprint, idemstore.LapseUnknown
	if res := mustClaim(t, s, mark, idemstore.ClaimCompleted); !res.MarkedUnknown {
		t.Fatal("the lapsed claim was not marked unknown")
	}
	keys := []string{"in-flight", "completed", "lapsed", "unfinished", "released", "unknown"}
	before := map[string]*idemstore.Record{}
	for _, k := range keys {
		rec, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: "scope", Key: k, Now: now})
		if err != nil {
			t.Fatalf("RecordGet(%s) before the upgrade: %v", k, err)
		}
		before[k] = rec
	}
	// And a filled table: 30,000 records, a third of them expired.
	expired := fillWalk(t, s, 30000)
	if !indexExists(t, s, "idem_records_expires_at_idx") {
		t.Fatal("the schema of 0009 has no index of expiry")
	}
	file := relfilenode(t, s)

	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if !indexExists(t, s, "idem_records_expires_at_idx") {
		t.Fatal("the index of expiry went before the upgrade was finalized: a rollback to 0.2.0 would have its cleaner read the whole table at every batch")
	}
	if _, err := idem.FinalizeUpgrade(ctx, s, idem.FinalizeOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	took := time.Since(start)
	if indexExists(t, s, "idem_records_expires_at_idx") {
		t.Fatal("the index of expiry is still there after the upgrade was finalized")
	}
	if got := relfilenode(t, s); got != file {
		t.Fatalf("the upgrade rewrote the table (file %d, then %d)", file, got)
	}
	t.Logf("dropping the index of expiry of a table of 30,000 records: %v", took)

	for _, k := range keys {
		rec, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: "scope", Key: k, Now: now})
		if err != nil {
			t.Fatalf("RecordGet(%s) after the upgrade: %v", k, err)
		}
		if !reflect.DeepEqual(rec, before[k]) {
			t.Errorf("%s after the upgrade:\n %+v\nbefore:\n %+v", k, rec, before[k])
		}
	}
	// The new statements on the old records: a claim with the hint of a new key
	// replays a completed key and takes over a lapsed one; the cleaner's walk deletes
	// the expired records and nothing else.
	again := claimParams("completed", now)
	again.Fingerprint, again.LikelyNew = done.Fingerprint, true
	if res := mustClaim(t, s, again, idemstore.ClaimCompleted); string(res.Record.Response.Body) != string(resp.Body) {
		t.Fatalf("the replay after the upgrade = %q", res.Record.Response.Body)
	}
	take := claimParams("lapsed", now)
	take.Fingerprint, take.LikelyNew = lapsed.Fingerprint, true
	if res := mustClaim(t, s, take, idemstore.ClaimAcquired); !res.TookOver {
		t.Fatal("a lapsed lease after the upgrade was not taken over")
	}
	n, err := s.RecordDeleteExpired(ctx, &idemstore.DeleteExpiredParams{Limit: 1 << 30, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if n != expired+1 {
		t.Fatalf("the walk deleted %d records, want the %d expired of the fill and the one expired record", n, expired)
	}
	for _, k := range keys {
		if _, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: "scope", Key: k, Now: now}); err != nil {
			t.Errorf("RecordGet(%s) after the walk: %v", k, err)
		}
	}
}

// DROP INDEX waits for the statements running on the table, and every statement after
// it waits for it: 0010's lock_timeout bounds that wait (2 s), and Migrate tries again,
// so that a long statement holds up requests for no longer than that.
func TestMigration0010WaitsForALongStatementNoLongerThanItsLockTimeoutAndRetries(t *testing.T) {
	t.Parallel()
	s := previousSchema(t)
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil { // 0010, which drops nothing yet
		t.Fatal(err)
	}
	if _, err := idem.FinalizeUpgrade(ctx, s, idem.FinalizeOptions{}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A long report on the table: it holds ACCESS SHARE until it ends, 6 s from now.
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM `+s.table("idem_records")); err != nil {
		t.Fatal(err)
	}
	const hold = 6 * time.Second
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		time.Sleep(hold)
		_ = tx.Commit(context.Background())
	}()
	// The connection closes (deferred above) only after the report's commit: both use
	// it (the race detector saw them race when the test ended first).
	defer func() { <-committed }()
	// A request that comes while the migration waits for the table.
	waited := make(chan time.Duration, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		_, _ = s.RecordGet(ctx, &idemstore.GetParams{Scope: "scope", Key: "k"})
		waited <- time.Since(start)
	}()
	start := time.Now()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate behind a long statement: %v", err)
	}
	if took := time.Since(start); took < hold {
		t.Fatalf("Migrate returned after %v, before the statement that held the table ended (%v)", took, hold)
	}
	if indexExists(t, s, "idem_records_expires_at_idx") {
		t.Fatal("the index of expiry is still there")
	}
	if w := <-waited; w > 4*time.Second {
		t.Fatalf("a request waited %v behind the migration: past its lock_timeout (2 s)", w)
	}
}
