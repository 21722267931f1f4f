package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/sqlite"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

func claimParams(scope, key, token string, now time.Time) *idemstore.ClaimParams {
	return &idemstore.ClaimParams{
		Scope: scope, Key: key, Token: token, RecordID: "rec-" + token,
		Fingerprint: idemstore.Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{1, 2, 3}},
		Lease:       30 * time.Second, TTL: 24 * time.Hour, Now: now,
	}
}

func mustClaim(t testing.TB, s idemstore.Store, p *idemstore.ClaimParams, want idemstore.ClaimOutcome) *idemstore.ClaimResult {
	t.Helper()
	res, err := s.RecordClaim(context.Background(), p)
	if err != nil {
		t.Fatalf("RecordClaim: %v", err)
	}
	if res.Outcome != want {
		t.Fatalf("RecordClaim = %v, want %v", res.Outcome, want)
	}
	return res
}

func TestRecordSurvivesCloseAndReopen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, path := openStore(t, sqlite.Config{})
	mustClaim(t, s, claimParams("s", "k", "tok", t0), idemstore.ClaimAcquired)
	resp := &idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "s", Key: "k", Token: "tok", Response: resp, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := sqlite.Open(ctx, path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after restart: %v", err)
	}
	res := mustClaim(t, s2, claimParams("s", "k", "tok2", t0.Add(time.Minute)), idemstore.ClaimCompleted)
	if !res.Record.Response.Equal(resp) {
		t.Fatalf("replayed after restart: %+v, want %+v", res.Record.Response, resp)
	}
}

func TestOpenRefusesBadPaths(t *testing.T) {
	t.Parallel()
	missingDir := filepath.Join(t.TempDir(), "no", "such", "dir")
	notADatabase := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(notADatabase, []byte(strings.Repeat("not a database\n", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing directory", filepath.Join(missingDir, "idem.db"), "does not exist"},
		{"a directory", t.TempDir(), "unable to open"},
		{"empty", "", "empty database path"},
		{"not a database", notADatabase, "not a database"},
		{"memory", ":memory:", "in-memory and temporary databases are refused"},
		{"question mark", filepath.Join(t.TempDir(), "a?b.db"), "contains '?'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sqlite.Open(context.Background(), tc.path, sqlite.Config{})
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) succeeded", tc.path)
			}
			if !strings.HasPrefix(err.Error(), "sqlite: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open(%q) = %q, want an error containing %q", tc.path, err, tc.want)
			}
		})
	}
	if _, err := os.Stat(missingDir); !os.IsNotExist(err) {
		t.Errorf("Open created the missing directory: %v", err)
	}
}

// TestOpenRefusesEveryInMemoryForm: a database in memory (or SQLite's temporary one,
// named by an empty path) is private to one connection of the pool and dies with it, so
// records would be neither durable nor shared, even within one process. Open refuses
// every way of naming one, before anything is created, in any case.
func TestOpenRefusesEveryInMemoryForm(t *testing.T) {
	// Not parallel: it runs in an empty working directory, to see that nothing
	// lands there.
	cwd := t.TempDir()
	t.Chdir(cwd)
	dir := t.TempDir()
	for _, form := range []string{
		":memory:",
		":MEMORY:",
		"sqlite::memory:",
		"file::memory:",
		"file::memory:?cache=shared",
		"sqlite:file::memory:?cache=shared",
		"FILE::memory:",
		"file::Memory:?cache=shared",
		"file:%3Amemory%3A",
		"file:" + dir + "/a.db?mode=memory",
		"file:" + dir + "/b.db?cache=shared&mode=memory",
		"file:" + dir + "/c.db?MODE=Memory",
		"file:" + dir + "/d.db?mode=%6Demory",
		"file:" + dir + "/e.db?vfs=memdb",
		"file:/f.db?vfs=MEMDB&cache=shared",
		"file:",
		"file:?cache=shared",
	} {
		s, err := sqlite.Open(context.Background(), form, sqlite.Config{})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded; want it refused as in memory", form)
			continue
		}
		if !strings.Contains(err.Error(), "in-memory") || !strings.Contains(err.Error(), strconv.Quote(form)) {
			t.Errorf("Open(%q) = %q; want an error that names the form and says in-memory databases are refused", form, err)
		}
	}
	for _, d := range []string{cwd, dir} {
		if entries, _ := os.ReadDir(d); len(entries) > 0 {
			t.Errorf("refused forms created %v in %s", entries, d)
		}
	}
}

func TestOpenAcceptsFilesWhoseNamesMentionMemory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, dsn := range []string{
		filepath.Join(dir, "memory.db"),
		filepath.Join(dir, ":memory:.db"),
		"file:" + filepath.Join(dir, "memdb.db") + "?cache=shared",
		"file:" + filepath.Join(dir, "mode.db") + "?mode=rwc",
	} {
		s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{})
		if err != nil {
			t.Errorf("Open(%q): %v", dsn, err)
			continue
		}
		s.Close()
	}
}

func TestOpenAcceptsSqliteURLAndFileURI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, dsn := range []string{"sqlite:" + filepath.Join(dir, "a.db"), "file:" + filepath.Join(dir, "b.db")} {
		s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{})
		if err != nil {
			t.Fatalf("Open(%q): %v", dsn, err)
		}
		var mode string
		if err := s.DB().QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("Open(%q): journal_mode = %q, %v; want wal", dsn, mode, err)
		}
		s.Close()
	}
}

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	for field, cfg := range map[string]sqlite.Config{
		"Config.BusyTimeout":  {BusyTimeout: -time.Second},
		"Config.MaxOpenConns": {MaxOpenConns: -1},
		"Config.Cleaner":      {Cleaner: idem.CleanerConfig{Retention: -time.Hour}},
	} {
		if _, err := sqlite.Open(context.Background(), path, cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Open with a bad %s = %v, want an error naming it", field, err)
		}
	}
}

func TestConnectionsUseTheDocumentedSettings(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{BusyTimeout: 1234 * time.Millisecond})
	for pragma, want := range map[string]string{
		"journal_mode": "wal", "busy_timeout": "1234", "foreign_keys": "1", "synchronous": "2",
	} {
		var got string
		if err := s.DB().QueryRow("PRAGMA " + pragma).Scan(&got); err != nil || got != want {
			t.Errorf("PRAGMA %s = %q, %v; want %q", pragma, got, err, want)
		}
	}
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var n, distinct int
	err := s.DB().QueryRow(`SELECT count(*), count(DISTINCT version) FROM idem_migrations`).Scan(&n, &distinct)
	if want := sqlite.MigrationCount(t); err != nil || n != want || distinct != want {
		t.Fatalf("idem_migrations has %d rows, %d versions (%v), want each of the %d migrations once", n, distinct, err, want)
	}
}

func TestTwoHundredKeysClaimedAtOnceAllAcquire(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	const n = 200
	errs := make(chan error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			key := fmt.Sprintf("key-%03d", i)
			res, err := s.RecordClaim(context.Background(), claimParams("s", key, "tok-"+key, time.Time{}))
			if err == nil && res.Outcome != idemstore.ClaimAcquired {
				err = fmt.Errorf("%s: %v", key, res.Outcome)
			}
			if err == nil {
				err = s.RecordComplete(context.Background(), &idemstore.CompleteParams{
					Scope: "s", Key: key, Token: "tok-" + key, Response: &idemstore.Response{Status: 200}, TTL: time.Hour})
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// signalHandler is a slog.Handler that signals each "retrying" record: a test waits
// on it to know that a store met a lock, instead of sleeping.
type signalHandler struct{ retried chan struct{} }

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "retrying") {
		select {
		case h.retried <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// holdWriteLock makes other (a second store on the file, as another process would
// open) hold the write lock until the returned func is called.
func holdWriteLock(t *testing.T, other *sqlite.Store) (release func()) {
	t.Helper()
	locked, done := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- other.InTx(idem.WithoutKey(context.Background()), func(ctx context.Context, tx *sql.Tx) error {
			close(locked)
			<-done
			return nil
		})
	}()
	<-locked
	return func() {
		close(done)
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

func TestClaimWaitsOutAnotherProcessesWriteLock(t *testing.T) {
	t.Parallel()
	retried := make(chan struct{}, 1)
	s, path := openStore(t, sqlite.Config{BusyTimeout: time.Millisecond, Logger: slog.New(signalHandler{retried})})
	other, err := sqlite.Open(context.Background(), path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	release := holdWriteLock(t, other)
	type result struct {
		res *idemstore.ClaimResult
		err error
	}
	got := make(chan result, 1)
	go func() {
		res, err := s.RecordClaim(context.Background(), claimParams("s", "k", "tok", t0))
		got <- result{res, err}
	}()
	<-retried // the claim met SQLITE_BUSY and is retrying
	release()
	r := <-got
	if r.err != nil || r.res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claim after the lock was released = %v, %v; want acquired", r.res, r.err)
	}
}

func TestClaimUnderLockFailsOnlyWhenContextEnds(t *testing.T) {
	t.Parallel()
	s, path := openStore(t, sqlite.Config{BusyTimeout: time.Millisecond})
	other, err := sqlite.Open(context.Background(), path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	release := holdWriteLock(t, other)
	defer release()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = s.RecordClaim(ctx, claimParams("s", "k", "tok", t0))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim under a lock held past the deadline = %v, want context.DeadlineExceeded", err)
	}
}

func TestReadsAndReplaysDoNotWaitForTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := openStore(t, sqlite.Config{})
	mustClaim(t, s, claimParams("s", "done", "tok", t0), idemstore.ClaimAcquired)
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "s", Key: "done", Token: "tok", Response: &idemstore.Response{Status: 201}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, claimParams("s", "busy", "tok", t0), idemstore.ClaimAcquired)

	// The same store holds the write lock: anything that needed it would wait forever.
	release := holdWriteLock(t, s)
	defer release()
	if _, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: "s", Key: "done", Now: t0}); err != nil {
		t.Errorf("RecordGet: %v", err)
	}
	mustClaim(t, s, claimParams("s", "done", "tok2", t0.Add(time.Second)), idemstore.ClaimCompleted)
	mustClaim(t, s, claimParams("s", "busy", "tok2", t0.Add(time.Second)), idemstore.ClaimInFlight)
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func TestRecordGetOfMissingKeyIsErrNotFound(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	_, err := s.RecordGet(context.Background(), &idemstore.GetParams{Scope: "s", Key: "nope"})
	if !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet = %v, want idem.ErrNotFound", err)
	}
}

func TestInTxRollsBackWhenFnFails(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	createMarkerTable(t, s)
	boom := errors.New("boom")
	err := s.InTx(idem.WithoutKey(context.Background()), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO app_marker VALUES ('x')`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx = %v, want fn's error", err)
	}
	if ok, _ := (txHarness{}).MarkerCommitted(context.Background(), s, "x"); ok {
		t.Fatal("the write of a failed fn committed")
	}
}

func TestInTxRollsBackAndRepanicsWhenFnPanics(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	createMarkerTable(t, s)
	func() {
		defer func() {
			if recover() != "boom" {
				t.Fatal("InTx did not re-raise fn's panic")
			}
		}()
		_ = s.InTx(idem.WithoutKey(context.Background()), func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO app_marker VALUES ('x')`); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	if ok, _ := (txHarness{}).MarkerCommitted(context.Background(), s, "x"); ok {
		t.Fatal("the write of a panicking fn committed")
	}
	// The write turn and the connection were given back.
	if err := s.InTx(idem.WithoutKey(context.Background()), func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// With MustExist, Open refuses a database file that is not there, in every form of
// its name, and creates nothing; it opens one that exists.
func TestOpenMustExistRefusesAMissingFileAndCreatesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "typo.db")
	for _, dsn := range []string{missing, "sqlite:" + missing, "file:" + missing, "file:" + missing + "?cache=shared", "file://" + missing} {
		s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{MustExist: true})
		if err == nil {
			s.Close()
			t.Fatalf("Open(%q) with MustExist succeeded on a missing file", dsn)
		}
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), strconv.Quote(dsn)) {
			t.Errorf("Open(%q) = %q; want fs.ErrNotExist naming the path", dsn, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Fatalf("refused opens created %v", entries)
	}

	existing := filepath.Join(dir, "idem.db")
	s, err := sqlite.Open(context.Background(), existing, sqlite.Config{DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, dsn := range []string{existing, "sqlite:" + existing, "file:" + existing} {
		s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{MustExist: true, DisableCleaner: true})
		if err != nil {
			t.Fatalf("Open(%q) with MustExist on an existing file: %v", dsn, err)
		}
		s.Close()
	}
}

// The migrations after 0003 only add (tables, columns that are NULL or have a default,
// indexes), so that a process of the previous version keeps working on a file that the
// next one migrated during a rolling upgrade (docs/operations.md).
func TestMigrationsAfter0003OnlyAdd(t *testing.T) {
	t.Parallel()
	testkit.MigrationsOnlyAdd(t, "migrations", 3)
}

// A record that an earlier version wrote with a TTL past what SQLite represents (its
// expires_at overflowed int64, and SQLite kept a REAL: issue 19 item 6) is readable
// again: a retry gets its response, `idem keys` inspects, lists and deletes it, and
// the cleanup (the cleaner and `idem purge`) removes it, where every one of them failed
// on it before ("converting driver.Value type float64 … to a int64").
func TestARecordWithAnOverflowedExpiryIsReadableAndRemovable(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{DisableCleaner: true})
	ctx := t.Context()
	overflow := func(key string) {
		t.Helper()
		p := claimParams("user-1", key, "tok-"+key, time.Time{})
		mustClaim(t, s, p, idemstore.ClaimAcquired)
		err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "user-1", Key: key, Token: p.Token, TTL: time.Hour,
			Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}})
		if err != nil {
			t.Fatal(err)
		}
		// What `created_at + :ttl` made of a TTL of 2,200,000 hours.
		if _, err := s.DB().ExecContext(ctx, `UPDATE idem_records SET expires_at = created_at + 7920000000000000000.0 WHERE key = ?`, key); err != nil {
			t.Fatal(err)
		}
		var typ string
		if err := s.DB().QueryRowContext(ctx, `SELECT typeof(expires_at) FROM idem_records WHERE key = ?`, key).Scan(&typ); err != nil || typ != "real" {
			t.Fatalf("typeof(expires_at) = %q, %v; want the REAL an overflow leaves", typ, err)
		}
	}
	overflow("key-overflow-1")
	overflow("key-overflow-2")

	res := mustClaim(t, s, claimParams("user-1", "key-overflow-1", "tok-retry", time.Time{}), idemstore.ClaimCompleted)
	if string(res.Record.Response.Body) != `{"id":"ch_1"}` {
		t.Fatalf("the retry found %q, want the stored response", res.Record.Response.Body)
	}
	if _, err := s.RecordInspect(ctx, &admin.RecordInspectParams{Scope: "user-1", Key: "key-overflow-1"}); err != nil {
		t.Fatalf("RecordInspect: %v", err)
	}
	list, err := s.RecordList(ctx, &admin.RecordListParams{Limit: 10})
	if err != nil || len(list.Records) != 2 {
		t.Fatalf("RecordList = %v, %v; want both records", list, err)
	}
	if err := s.RecordDelete(ctx, &admin.RecordDeleteParams{Scope: "user-1", Key: "key-overflow-1"}); err != nil {
		t.Fatalf("RecordDelete: %v", err)
	}
	n, err := s.RecordDeleteExpired(ctx, &idemstore.DeleteExpiredParams{Limit: 10})
	if err != nil || n != 1 {
		t.Fatalf("RecordDeleteExpired = %d, %v; want the other overflowed record removed", n, err)
	}
}
