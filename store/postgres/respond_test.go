package postgres_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/postgres"
)

// rowHandler inserts a row named by the key into table through Respond and answers
// 201 with the key. A unique violation of table (the key wrote a row before, and its
// record is gone) is the handler's to answer: 409, which releases the key.
func rowHandler(s *postgres.Store, table string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		err := s.Respond(w, r, func(b *pgx.Batch) (*idemstore.Response, error) {
			b.Queue(`INSERT INTO `+table+` (key) VALUES ($1)`, key)
			return idem.JSONResponse(http.StatusCreated, map[string]string{"key": key})
		})
		answerRowError(w, err)
	})
}

// answerRowError answers a row handler's error: a unique violation of its table (the
// key wrote a row before, and its record is gone) with 409, which releases the key.
func answerRowError(w http.ResponseWriter, err error) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pgErr) && pgErr.Code == "23505":
		http.Error(w, `{"exists":true}`, http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// rowHandlerSQL is rowHandler through RespondSQL (database/sql): the INSERT runs on a
// *sql.Tx of Store.DB.
func rowHandlerSQL(s *postgres.Store, table string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		err := s.RespondSQL(w, r, func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, key); err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]string{"key": key})
		})
		answerRowError(w, err)
	})
}

// respondHelpers are the store's Respond helpers, as the handler of a rowApp: pgx's
// (statements queued on a batch) and database/sql's (RespondSQL).
var respondHelpers = []struct {
	name    string
	handler func(s *postgres.Store, table string) http.Handler
}{{"Respond", rowHandler}, {"RespondSQL", rowHandlerSQL}}

// eachRespond runs test for each Respond helper on both routes, as parallel subtests.
func eachRespond(t *testing.T, test func(t *testing.T, inHandler bool, handler func(s *postgres.Store, table string) http.Handler)) {
	for _, r := range respondHelpers {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			bothRoutes(t, func(t *testing.T, inHandler bool) { test(t, inHandler, r.handler) })
		})
	}
}

// rowApp is the middleware, with logs kept, in front of h(table) on a route that
// claims in the handler (the README's path) or not (the lease path).
type rowApp struct {
	s       schemaStore
	table   string
	handler http.Handler
	logs    *bytes.Buffer
	clock   *testkit.Clock
}

func newRowApp(t *testing.T, claimInHandler bool, h func(s *postgres.Store, table string) http.Handler) *rowApp {
	t.Helper()
	s := newStore(t)
	app := &rowApp{s: s, table: s.table("rows"), logs: &bytes.Buffer{}, clock: testkit.NewClock(time.Now().UTC().Truncate(time.Millisecond))}
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+app.table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{
		Store:  s.Store,
		Scope:  func(*http.Request) (string, error) { return "user-1", nil },
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: app.logs}, nil)),
		Lease:  10 * time.Second,
		Clock:  app.clock.Now,
	})
	app.handler = m.Route(idem.RouteOptions{ClaimInHandler: claimInHandler})(h(s.Store, app.table))
	return app
}

// lockedWriter serialises the writes of concurrent requests' log lines.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (app *rowApp) post(key string) *httptest.ResponseRecorder { return postKey(app.handler, key) }

func (app *rowApp) rows(t *testing.T) int { return countRows(t, app.s, app.table) }

func postKey(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func countRows(t *testing.T, s schemaStore, table string) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func bothRoutes(t *testing.T, test func(t *testing.T, claimInHandler bool)) {
	for _, inHandler := range []bool{true, false} {
		t.Run(fmt.Sprintf("claimInHandler=%v", inHandler), func(t *testing.T) {
			t.Parallel()
			test(t, inHandler)
		})
	}
}

func TestRespondCommitsTheRowAndTheRecordTogether(t *testing.T) {
	t.Parallel()
	eachRespond(t, func(t *testing.T, inHandler bool, handler func(s *postgres.Store, table string) http.Handler) {
		app := newRowApp(t, inHandler, handler)
		first := app.post("key-together")
		if first.Code != http.StatusCreated || first.Body.String() != `{"key":"key-together"}` ||
			first.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("first = %d %s %v", first.Code, first.Body, first.Header())
		}
		retry := app.post("key-together")
		if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry = %d %s (replayed %q), want the first response replayed", retry.Code, retry.Body, retry.Header().Get("Idempotent-Replayed"))
		}
		if n := app.rows(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

// A statement of the handler's that fails (the key wrote a row before and its record
// is gone) commits nothing: Respond returns the error, and the handler's own answer
// goes through the middleware (409 releases the key: nothing is recorded).
func TestRespondReturnsTheStatementsErrorForTheHandlerToAnswer(t *testing.T) {
	t.Parallel()
	eachRespond(t, func(t *testing.T, inHandler bool, handler func(s *postgres.Store, table string) http.Handler) {
		app := newRowApp(t, inHandler, handler)
		if _, err := app.s.Pool().Exec(t.Context(), `INSERT INTO `+app.table+` (key) VALUES ('key-conflict')`); err != nil {
			t.Fatal(err)
		}
		got := app.post("key-conflict")
		if got.Code != http.StatusConflict || !strings.Contains(got.Body.String(), "exists") {
			t.Fatalf("POST = %d %s, want the handler's 409", got.Code, got.Body)
		}
		if _, err := app.s.RecordGet(t.Context(), &idemstore.GetParams{Scope: "user-1", Key: "key-conflict"}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("RecordGet = %v, want no record: nothing committed and 409 releases the key", err)
		}
	})
}

// A statement the server refuses before it runs (a table that does not exist: a bad
// migration) is the application's error, not the store's: Respond returns it for the
// handler to answer, on both routes, and the client never gets 503 store_unavailable,
// which would have it retry forever and blame the idempotency store (issue 19 item 3:
// pgx prepares the statements first, and the refused PREPARE was answered 503).
func TestRespondReturnsAStatementTheServerRefusesForTheHandlerToAnswer(t *testing.T) {
	t.Parallel()
	eachRespond(t, func(t *testing.T, inHandler bool, handler func(s *postgres.Store, table string) http.Handler) {
		app := newRowApp(t, inHandler, handler)
		if _, err := app.s.Pool().Exec(t.Context(), `DROP TABLE `+app.table); err != nil {
			t.Fatal(err)
		}
		for range 2 { // the second finds nothing prepared either
			got := app.post("key-missing-table")
			if got.Code != http.StatusInternalServerError || !strings.Contains(got.Body.String(), "does not exist") {
				t.Fatalf("POST = %d %s, want the handler's 500 with the server's error", got.Code, got.Body)
			}
		}
		if _, err := app.s.RecordGet(t.Context(), &idemstore.GetParams{Scope: "user-1", Key: "key-missing-table"}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("RecordGet = %v, want no record: nothing committed and 500 releases the key", err)
		}
	})
}

// TestRespondDuplicatesExecuteOnce: 25 concurrent requests with one key write one row;
// every other answer is its replay or 409 request_in_progress.
func TestRespondDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	eachRespond(t, func(t *testing.T, inHandler bool, handler func(s *postgres.Store, table string) http.Handler) {
		app := newRowApp(t, inHandler, handler)
		const n = 25
		answers := make([]*httptest.ResponseRecorder, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = app.post("key-storm")
			})
		}
		close(start)
		wg.Wait()
		created := 0
		for _, rec := range answers {
			switch {
			case rec.Code == http.StatusCreated && rec.Body.String() == `{"key":"key-storm"}`:
				created++
			case rec.Code == http.StatusConflict && strings.Contains(rec.Body.String(), "request_in_progress"):
			default:
				t.Errorf("answer %d %s, want 201 or 409 request_in_progress", rec.Code, rec.Body)
			}
		}
		if rows := app.rows(t); rows != 1 || created == 0 {
			t.Fatalf("%d rows and %d answers 201, want 1 row", rows, created)
		}
	})
}

// lockKey begins a transaction that holds key's advisory lock, as a concurrent
// ClaimInHandler claim of a key it found absent does until its transaction ends.
func lockKey(t *testing.T, app *rowApp, key string) pgx.Tx {
	t.Helper()
	tx, err := app.s.Pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	class, id := postgres.KeyLock("user-1", key)
	if _, err := tx.Exec(t.Context(), `SELECT pg_advisory_xact_lock($1, $2)`, class, id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// holdKey begins the transaction of a concurrent ClaimInHandler claim of key that has
// inserted its record, uncommitted; with keyLock it holds the key's advisory lock too,
// as Respond's claim does.
func holdKey(t *testing.T, app *rowApp, key string, keyLock bool) pgx.Tx {
	t.Helper()
	var tx pgx.Tx
	if keyLock {
		tx = lockKey(t, app, key)
	} else {
		var err error
		if tx, err = app.s.Pool().Begin(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	}
	same := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
	same.Header.Set("Content-Type", "application/json")
	fp := idem.FingerprintRequest(same, []byte(`{}`))
	_, err := tx.Exec(t.Context(), `INSERT INTO `+app.s.table("idem_records")+`
		(scope, key, id, fingerprint_version, fingerprint, state, response_status, response_headers, response_body, created_at, expires_at)
		VALUES ('user-1', $3, 'rec-1', $1, $2, 'completed', 201, ''::bytea, $4, now(), now() + interval '1 hour')`,
		fp.Version, fp.Sum[:], []byte(key), []byte(`{"key":"`+key+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// A duplicate that finds the first request's claim uncommitted waits at most the lock
// timeout and answers 409 request_in_progress; once the first commits, it is replayed.
func TestRespondDuplicateOfAnUncommittedClaimIs409(t *testing.T) {
	t.Parallel()
	app := newRowApp(t, true, rowHandler)
	tx := holdKey(t, app, "key-held", true)
	began := time.Now()
	dup := app.post("key-held")
	took := time.Since(began)
	if dup.Code != http.StatusConflict || !strings.Contains(dup.Body.String(), "request_in_progress") || dup.Header().Get("Retry-After") == "" {
		t.Fatalf("duplicate = %d %s, want 409 request_in_progress with Retry-After", dup.Code, dup.Body)
	}
	if took > postgres.DefaultClaimLockTimeout+2*time.Second {
		t.Errorf("the duplicate took %v, want about the lock timeout (%v)", took, postgres.DefaultClaimLockTimeout)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	after := app.post("key-held")
	if after.Code != http.StatusCreated || after.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the first committed = %d %s, want its replay", after.Code, after.Body)
	}
	if rows := app.rows(t); rows != 0 {
		t.Fatalf("%d rows, want none: the duplicates never executed", rows)
	}
}

// Only the wait for a concurrent claim of the key is as short as ClaimLockTimeout:
// the insert's other lock waits (the table's extension lock on a database slow with
// I/O, which answered fresh keys 409 in scripts/bench; here a row of the key that a
// transaction holds without the key's lock) last until the lock is free. Before, the
// request answered 409 request_in_progress after 100 ms.
func TestRespondWaitsOutALockThatIsNotAClaimOfTheKey(t *testing.T) {
	t.Parallel()
	app := newRowApp(t, true, rowHandler)
	tx := holdKey(t, app, "key-row-held", false)
	const hold = 3 * postgres.DefaultClaimLockTimeout
	committed := make(chan error, 1)
	time.AfterFunc(hold, func() { committed <- tx.Commit(context.Background()) })
	began := time.Now()
	rec := app.post("key-row-held")
	took := time.Since(began)
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if took < hold {
		t.Errorf("answered after %v, before the lock was free (%v)", took, hold)
	}
	if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" || rec.Body.String() != `{"key":"key-row-held"}` {
		t.Fatalf("answer = %d %s, want the replay of the record that committed", rec.Code, rec.Body)
	}
}

// A replay takes no lock: replays of one key at once never wait for each other (nor
// for anything holding the key's advisory lock). Before, every claim took the key's
// lock first, and a replay behind another one for 100 ms answered 409 (1 of 32,824 in
// a scripts/bench run of replays across 10,000 keys).
func TestRespondReplayDoesNotWaitForTheKeysLock(t *testing.T) {
	t.Parallel()
	app := newRowApp(t, true, rowHandler)
	if first := app.post("key-replayed"); first.Code != http.StatusCreated {
		t.Fatalf("first = %d %s", first.Code, first.Body)
	}
	lockKey(t, app, "key-replayed")
	rec := app.post("key-replayed")
	if rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay beside a holder of the key's lock = %d %s, want the replay", rec.Code, rec.Body)
	}
	if rows := app.rows(t); rows != 1 {
		t.Fatalf("%d rows, want 1", rows)
	}
}

// An expired record of the key is claimed afresh the usual way, and the statements run
// once more under the lease: one more row, and the new response stored.
func TestRespondClaimsAnExpiredKeyAfresh(t *testing.T) {
	t.Parallel()
	for _, r := range respondHelpers {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			app := newRowApp(t, true, r.handler)
			if got := app.post("key-expiring"); got.Code != http.StatusCreated {
				t.Fatalf("first = %d %s", got.Code, got.Body)
			}
			if _, err := app.s.Pool().Exec(t.Context(), `DELETE FROM `+app.table); err != nil {
				t.Fatal(err)
			}
			app.clock.Advance(idem.DefaultTTL + time.Minute)
			got := app.post("key-expiring")
			if got.Code != http.StatusCreated || got.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("after expiry = %d %s %v, want a new execution", got.Code, got.Body, got.Header())
			}
			if n := app.rows(t); n != 1 {
				t.Fatalf("%d rows, want the new one", n)
			}
			if replay := app.post("key-expiring"); replay.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay = %d %s, want the new response replayed", replay.Code, replay.Body)
			}
		})
	}
}

// The misuses: a write after Respond answered fails and is logged (the client gets the
// stored response); a request that is not behind the middleware is refused with
// ErrNoHandle, unless marked WithoutKey (a plain transaction).
func TestRespondRefusesAWriteAfterItAnswered(t *testing.T) {
	t.Parallel()
	eachRespond(t, func(t *testing.T, inHandler bool, handler func(s *postgres.Store, table string) http.Handler) {
		app := newRowApp(t, inHandler, func(s *postgres.Store, table string) http.Handler {
			inner := handler(s, table)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inner.ServeHTTP(w, r)
				w.WriteHeader(http.StatusOK) // too late
				if _, err := w.Write([]byte("more")); err == nil {
					t.Error("a write after Respond answered succeeded")
				}
			})
		})
		got, replay := app.post("key-late"), app.post("key-late")
		if got.Code != http.StatusCreated || got.Body.String() != `{"key":"key-late"}` || replay.Body.String() != got.Body.String() {
			t.Fatalf("answer %d %q, replay %q; want the stored 201 both times", got.Code, got.Body, replay.Body)
		}
		if !strings.Contains(app.logs.String(), "wrote after its transaction had fixed the response") {
			t.Fatalf("the refused write was not logged:\n%s", app.logs)
		}
	})
}

func TestRespondWithoutTheMiddlewareNeedsWithoutKey(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	table := s.table("rows")
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var got error
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = s.Respond(w, r, func(b *pgx.Batch) (*idemstore.Response, error) {
			b.Queue(`INSERT INTO ` + table + ` (key) VALUES ('unkeyed')`)
			return &idemstore.Response{Status: http.StatusCreated}, nil
		})
	})
	rec := postKey(h, "key-none")
	if !errors.Is(got, idem.ErrNoHandle) || countRows(t, s, table) != 0 {
		t.Fatalf("Respond without the middleware = %v, %d rows; want ErrNoHandle and nothing written", got, countRows(t, s, table))
	}
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(idem.WithoutKey(r.Context())))
	})
	rec = postKey(plain, "key-none")
	if got != nil || rec.Code != http.StatusCreated || countRows(t, s, table) != 1 {
		t.Fatalf("Respond marked WithoutKey = %v, %d, %d rows; want a plain transaction and its 201", got, rec.Code, countRows(t, s, table))
	}
}

// The natural order with InTx (the lease path's helper): the INSERT inside, the 201
// after. Nothing commits; the client gets 500 internal_error, nothing is stored, the
// mistake is logged; a context other than the request's is refused outright.
func TestInTxMisusesFailLoudly(t *testing.T) {
	t.Parallel()
	t.Run("response written after the transaction", func(t *testing.T) {
		t.Parallel()
		app := newRowApp(t, false, func(s *postgres.Store, table string) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				err := s.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, r.Header.Get("Idempotency-Key"))
					return err
				})
				if !errors.Is(err, idem.ErrNoResponse) {
					t.Errorf("InTx = %v, want ErrNoResponse", err)
				}
				w.WriteHeader(http.StatusCreated)
			})
		})
		got := app.post("key-natural-order")
		if got.Code != http.StatusInternalServerError || !strings.Contains(got.Body.String(), idem.CodeInternalError) {
			t.Fatalf("answer = %d %s, want 500 internal_error", got.Code, got.Body)
		}
		if _, err := app.s.RecordGet(t.Context(), &idemstore.GetParams{Scope: "user-1", Key: "key-natural-order"}); !errors.Is(err, idemstore.ErrNotFound) || app.rows(t) != 0 {
			t.Fatalf("RecordGet = %v, %d rows; want nothing stored and nothing committed", err, app.rows(t))
		}
		if !strings.Contains(app.logs.String(), "none was written yet") {
			t.Fatalf("the mistake was not logged:\n%s", app.logs)
		}
	})
	t.Run("a context without the request's handle", func(t *testing.T) {
		t.Parallel()
		app := newRowApp(t, false, func(s *postgres.Store, table string) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				err := s.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
					t.Error("fn ran")
					return nil
				})
				if !errors.Is(err, idem.ErrNoHandle) {
					t.Errorf("InTx = %v, want ErrNoHandle", err)
				}
				http.Error(w, "no", http.StatusInternalServerError)
			})
		})
		if got := app.post("key-wrong-ctx"); got.Code != http.StatusInternalServerError {
			t.Fatalf("answer = %d %s", got.Code, got.Body)
		}
	})
}

// Round trips on the wire. A ClaimInHandler route whose requests rarely find their key
// recorded goes straight to the handler: a new key is one round trip (the claim, the
// writes and the completed record in one pipelined transaction), and a retry that
// another process recorded two (that transaction stops at the record it finds, then the
// usual claim answers); a retry of a key this process recorded is one (the read: the
// process knows the key). Once retries come often it reads every key first: a retry is
// one round trip (the read; the handler never runs) and a new key two (the read, then
// the transaction). On the lease path a new key is two (the claim, then the writes with
// the fenced completion), its replay one.
func TestRespondRoundTrips(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	table := pgx.Identifier{b.schema, "rows"}.Sanitize()
	if _, err := b.s.Pool().Exec(b.ctx, `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{Store: b.s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	inHandler := m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(b.s, table))
	lease := m.Handler(rowHandler(b.s, table))
	for i, h := range []http.Handler{inHandler, lease} { // prepares the statements
		if rec := postKey(h, fmt.Sprint("key-warm-up-", i)); rec.Code != http.StatusCreated {
			t.Fatalf("warm-up = %d %s", rec.Code, rec.Body)
		}
	}
	newKey := func(what string, trips int) {
		t.Helper()
		b.wantTrips(what, trips, func() {
			if rec := postKey(inHandler, "key-one-"+rand8()); rec.Code != http.StatusCreated {
				t.Fatalf("POST = %d %s", rec.Code, rec.Body)
			}
		})
	}
	replayBy := func(h http.Handler, what string, trips int) {
		t.Helper()
		b.wantTrips(what, trips, func() {
			if rec := postKey(h, "key-warm-up-0"); rec.Code != http.StatusCreated || rec.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay = %d %s", rec.Code, rec.Body)
			}
		})
	}
	replay := func(what string, trips int) { t.Helper(); replayBy(inHandler, what, trips) }
	if rec := postKey(inHandler, "key-warm-up-0"); rec.Code != http.StatusCreated { // prepares the read
		t.Fatalf("replay = %d %s", rec.Code, rec.Body)
	}
	for range 2 { // a retry must leave nothing that costs the next request more
		newKey("a new key on a ClaimInHandler route that sees few retries", 1)
		// Another process's route, which does not know the key.
		other := idem.New(idem.Config{Store: b.s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
		replayBy(other.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(b.s, table)),
			"a retry on a ClaimInHandler route that sees few retries, of a key another process recorded (the transaction, then the claim)", 2)
		replay("a retry on a ClaimInHandler route that sees few retries, of a key this process recorded (the read)", 1)
	}
	for range 12 { // the route learns that retries are frequent
		if rec := postKey(inHandler, "key-warm-up-0"); rec.Code != http.StatusCreated {
			t.Fatalf("replay = %d %s", rec.Code, rec.Body)
		}
	}
	replay("a retry on a ClaimInHandler route that sees many (the read)", 1)
	newKey("a new key on a ClaimInHandler route that sees many retries (the read, then the transaction)", 2)
	b.wantTrips("a new key on the lease path (claim + batch)", 2, func() {
		if rec := postKey(lease, "key-two-2"); rec.Code != http.StatusCreated {
			t.Fatalf("POST = %d %s", rec.Code, rec.Body)
		}
	})
	b.wantTrips("its replay", 1, func() {
		if rec := postKey(lease, "key-two-2"); rec.Code != http.StatusCreated {
			t.Fatalf("replay = %d %s", rec.Code, rec.Body)
		}
	})
}

func rand8() string { return fmt.Sprint(time.Now().UnixNano() % 100000000) }

// A RespondSQL whose lease lapsed while its transaction ran (a retry took the key over
// and committed) is refused by the fence: its row rolls back and its client gets 503;
// the winner's response is the one stored.
func TestRespondSQLWhoseKeyWasTakenOverAnswers503(t *testing.T) {
	t.Parallel()
	entered, proceed := make(chan struct{}), make(chan struct{})
	app := newRowApp(t, false, func(s *postgres.Store, table string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			name := r.Header.Get("X-Name")
			err := s.RespondSQL(w, r, func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error) {
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, name); err != nil {
					return nil, err
				}
				if name == "slow" {
					close(entered)
					<-proceed
				}
				return idem.JSONResponse(http.StatusCreated, map[string]string{"name": name})
			})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		})
	})
	post := func(name string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "key-taken-over")
		req.Header.Set("X-Name", name)
		rec := httptest.NewRecorder()
		app.handler.ServeHTTP(rec, req)
		return rec
	}
	slowDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { slowDone <- post("slow") }()
	<-entered
	app.clock.Advance(11 * time.Second) // the slow request's lease lapses
	if retry := post("retry"); retry.Code != http.StatusCreated {
		t.Fatalf("retry after the lease lapsed = %d %s, want 201 (takeover)", retry.Code, retry.Body)
	}
	close(proceed)
	if slow := <-slowDone; slow.Code != http.StatusServiceUnavailable || !strings.Contains(slow.Body.String(), "store_unavailable") {
		t.Fatalf("the overtaken request = %d %s, want 503 store_unavailable", slow.Code, slow.Body)
	}
	if n := app.rows(t); n != 1 {
		t.Fatalf("%d rows, want only the winner's: the overtaken write rolls back", n)
	}
	if replay := post("again"); !strings.Contains(replay.Body.String(), `"retry"`) {
		t.Fatalf("replay = %d %s, want the winner's response", replay.Code, replay.Body)
	}
}

// Respond's transaction draws no notice from the server. It opened with SET
// TRANSACTION ISOLATION LEVEL READ COMMITTED, which PostgreSQL answers in a pipeline
// without BEGIN with "WARNING: SET TRANSACTION can only be used in transaction blocks":
// a WARNING line in the server's log for every request through Respond (found by
// pgbench while measuring issue 21, where it also cost a third of the batch's work on
// the server).
func TestRespondDrawsNoNoticeFromTheServer(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"", "serializable"} {
		t.Run("default isolation "+level, func(t *testing.T) {
			t.Parallel()
			testRespondDrawsNoNotice(t, level)
		})
	}
}

// testRespondDrawsNoNotice runs Respond on connections whose default isolation level is
// level ("": the server's, READ COMMITTED): no notice, and the writes run at READ
// COMMITTED whatever the default (SPEC §5: the idempotency statements do).
func testRespondDrawsNoNotice(t *testing.T, level string) {
	dbURL, schema := pgtest.Schema(t)
	if level != "" {
		dbURL = pgtest.WithParam(t, dbURL, "default_transaction_isolation", level)
	}
	var notices pgtest.Notices
	pool := pgtest.Pool(t, dbURL, 2, notices.Hook)
	s, err := postgres.NewFromPool(pool, postgres.Config{Schema: schema, DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "rows"}.Sanitize()
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY, isolation text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	notices.Take() // the migrations' own
	insert := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		err := s.Respond(w, r, func(b *pgx.Batch) (*idemstore.Response, error) {
			b.Queue(`INSERT INTO `+table+` (key, isolation) VALUES ($1, current_setting('transaction_isolation'))`, key)
			return idem.JSONResponse(http.StatusCreated, map[string]string{"key": key})
		})
		answerRowError(w, err)
	})
	m := idem.New(idem.Config{Store: s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	for _, h := range []http.Handler{m.Route(idem.RouteOptions{ClaimInHandler: true})(insert), m.Handler(insert)} {
		for _, key := range []string{"key-notice-" + rand8(), "key-notice-" + rand8() + "b"} {
			if rec := postKey(h, key); rec.Code != http.StatusCreated {
				t.Fatalf("POST = %d %s", rec.Code, rec.Body)
			}
		}
	}
	var other int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table+` WHERE isolation <> 'read committed'`).Scan(&other); err != nil || other != 0 {
		t.Fatalf("%d rows written at another level than READ COMMITTED (%v)", other, err)
	}
	if n := notices.Take(); len(n) > 0 {
		t.Fatalf("the server sent %d notices, want none: %q", len(n), n)
	}
}
