package backstop_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/backstop"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
)

// ttl is the records' and rows' lifetime in these tests.
const ttl = time.Hour

// app is a charge API on a Redis store, whose charges live in an SQL database with the
// backstop's table: the setup docs/redis.md describes.
type app struct {
	db      *sql.DB
	dialect backstop.Dialect
	// respond makes the handler return its response from Backstop.Respond rather than
	// write it inside Backstop.InTx.
	respond bool
	redis   *redis.Store
	bs      *backstop.Backstop
	clock   *testkit.Clock
	handler http.Handler
	// gates, by charge name (X-Test-Name), hold a handler inside its transaction,
	// after the charge's INSERT.
	gates testkit.Gates
}

// openDB opens a fresh database of the dialect: an SQLite file in t's directory, or a
// private PostgreSQL schema through pgx's database/sql driver.
func openDB(t *testing.T, d backstop.Dialect) *sql.DB {
	t.Helper()
	var db *sql.DB
	switch d {
	case backstop.SQLite:
		var err error
		db, err = sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)")
		if err != nil {
			t.Fatal(err)
		}
	case backstop.Postgres:
		dbURL, schema := pgtest.Schema(t)
		db = stdlib.OpenDBFromPool(pgtest.Pool(t, pgtest.SearchPathURL(t, dbURL, schema), 4))
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec(`CREATE TABLE charges (name TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

func newApp(t *testing.T, d backstop.Dialect, respond bool) *app {
	t.Helper()
	return newAppWith(t, d, respond, false)
}

// newAppWith is newApp, sealing its records (idem.Config.Seal) when sealed.
func newAppWith(t *testing.T, d backstop.Dialect, respond, sealed bool) *app {
	t.Helper()
	srv := redistest.StartServer(t)
	store, err := redis.Open(t.Context(), srv.URL(), redis.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	a := &app{db: openDB(t, d), dialect: d, respond: respond, redis: store, clock: testkit.NewClock(time.Now().UTC().Truncate(time.Millisecond))}
	if a.bs, err = backstop.New(a.db, backstop.Config{Dialect: d, Clock: a.clock.Now}); err != nil {
		t.Fatal(err)
	}
	if err := a.bs.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var ring *seal.Keyring
	if sealed {
		key, err := cloudkeys.Open(t.Context(), storetest.SealKeyURL)
		if err != nil {
			t.Fatal(err)
		}
		if ring, err = idem.OpenKeyring(t.Context(), store, key); err != nil {
			t.Fatal(err)
		}
		// A Redis store that held nothing is at format level 1, and its sealing begins
		// when the operator says so (SPEC §20): finalized and begun, its handoff past.
		if _, err := idem.FinalizeUpgrade(t.Context(), store, idem.FinalizeOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := idem.BeginSealing(t.Context(), store, ring, idem.SealingChange{At: time.Now().Add(-idem.SealingHandoff - time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	mw := idem.New(idem.Config{Store: store, TTL: ttl, Seal: ring, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	a.handler = mw.Handler(http.HandlerFunc(a.createCharge))
	return a
}

// createCharge inserts the charge named by X-Test-Name with the amount of the body and
// answers 201 with a fresh id, inside the backstop's InTx, or returning the response
// from its Respond; X-Test-Status answers that status instead, after the insert.
func (a *app) createCharge(w http.ResponseWriter, r *http.Request) {
	name := r.Header.Get("X-Test-Name")
	body, _ := io.ReadAll(r.Body)
	insert := func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
		q := `INSERT INTO charges (name, amount) VALUES ($1, $2)`
		if a.dialect == backstop.SQLite {
			q = `INSERT INTO charges (name, amount) VALUES (?1, ?2)`
		}
		if _, err := tx.ExecContext(ctx, q, name, len(body)); err != nil {
			return nil, err
		}
		a.gates.Pass(name)
		if s := r.Header.Get("X-Test-Status"); s != "" {
			var status int
			fmt.Sscan(s, &status)
			return &idem.Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}}, nil
		}
		return &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
			Body: fmt.Appendf(nil, `{"id":"ch_%s","object":"charge","name":%q}`, rand.Text(), name)}, nil
	}
	var err error
	if a.respond {
		err = a.bs.Respond(w, r, insert)
	} else {
		err = a.bs.InTx(w, r, func(ctx context.Context, tx *sql.Tx) error {
			resp, err := insert(ctx, tx)
			if err != nil {
				return err
			}
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.Status)
			_, _ = w.Write(resp.Body)
			return nil
		})
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (a *app) post(key, name, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("X-Test-Name", name)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, req)
	return rec
}

// loseRecord deletes the key's record from Redis, as a restart without persistence, an
// eviction or a failover would.
func (a *app) loseRecord(t *testing.T, key string) {
	t.Helper()
	if n, err := a.redis.Client().Del(t.Context(), a.redis.RecordKey("user-1", key)).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the record of %q from Redis: %d, %v", key, n, err)
	}
}

func (a *app) charges(t *testing.T) int {
	t.Helper()
	var n int
	if err := a.db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// forEachDialect runs test on SQLite and on PostgreSQL, through InTx and through
// Respond, as parallel subtests.
func forEachDialect(t *testing.T, test func(t *testing.T, a *app)) {
	for _, d := range []backstop.Dialect{backstop.SQLite, backstop.Postgres} {
		for _, respond := range []bool{false, true} {
			helper := "InTx"
			if respond {
				helper = "Respond"
			}
			t.Run(d.String()+"/"+helper, func(t *testing.T) {
				t.Parallel()
				test(t, newApp(t, d, respond))
			})
		}
	}
}

const body = `{"amount": 2000, "currency": "usd"}`

func TestRetryAfterRedisLostTheRecordIsAnsweredTheFirstResponse(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		first := a.post("key-lost-1", "first", body)
		if first.Code != http.StatusCreated {
			t.Fatalf("first POST = %d %s", first.Code, first.Body)
		}
		a.loseRecord(t, "key-lost-1")

		retry := a.post("key-lost-1", "retry", body)
		if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() {
			t.Fatalf("retry after Redis lost the record = %d %s, want the first response %s", retry.Code, retry.Body, first.Body)
		}
		if ct := retry.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("retry's Content-Type = %q, want the first response's", ct)
		}
		if n := a.charges(t); n != 1 {
			t.Fatalf("%d charges, want 1: the retry ran the operation again", n)
		}
		// Redis keeps the answer again: the next retry is its replay.
		again := a.post("key-lost-1", "again", body)
		if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("next retry = %d %s (replayed %q), want Redis's replay of the first response", again.Code, again.Body, again.Header().Get("Idempotent-Replayed"))
		}
	})
}

func TestKeyReusedAfterRedisLostTheRecordIsRefused(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		if got := a.post("key-reused-1", "first", body); got.Code != http.StatusCreated {
			t.Fatalf("first POST = %d %s", got.Code, got.Body)
		}
		a.loseRecord(t, "key-reused-1")
		got := a.post("key-reused-1", "other", `{"amount": 3000, "currency": "usd"}`)
		if got.Code != http.StatusConflict || !strings.Contains(got.Body.String(), "key_reused") {
			t.Fatalf("the key with other parameters = %d %s, want 409 key_reused", got.Code, got.Body)
		}
		if n := a.charges(t); n != 1 {
			t.Fatalf("%d charges, want 1", n)
		}
	})
}

// Two executions of one key at once, the second after Redis lost the first's record
// while it ran: the second waits for the first's transaction and answers its response.
// The first, its record gone, cannot store its answer: its client gets 503 and, on
// retrying, the same response.
func TestConcurrentExecutionsOfALostKeyChargeOnce(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		gate := a.gates.Add("first")
		firstDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { firstDone <- a.post("key-race-1", "first", body) }()
		<-gate.Entered // the first inserted its charge and its row, uncommitted
		a.loseRecord(t, "key-race-1")

		secondDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { secondDone <- a.post("key-race-1", "second", body) }()
		select {
		case got := <-secondDone:
			t.Fatalf("the second execution answered %d %s before the first committed", got.Code, got.Body)
		case <-time.After(100 * time.Millisecond): // it waits on the row (a check, not a synchronisation)
		}
		close(gate.Proceed)
		first, second := <-firstDone, <-secondDone
		if first.Code != http.StatusServiceUnavailable || !strings.Contains(first.Body.String(), "store_unavailable") {
			t.Errorf("first = %d %s, want 503 store_unavailable: another request holds its key in Redis now", first.Code, first.Body)
		}
		if second.Code != http.StatusCreated || !strings.Contains(second.Body.String(), `"name":"first"`) {
			t.Fatalf("second = %d %s, want the first execution's 201", second.Code, second.Body)
		}
		if retry := a.post("key-race-1", "retry", body); retry.Code != http.StatusCreated || retry.Body.String() != second.Body.String() {
			t.Fatalf("the first client's retry = %d %s, want %s", retry.Code, retry.Body, second.Body)
		}
		if n := a.charges(t); n != 1 {
			t.Fatalf("%d charges, want 1", n)
		}
	})
}

// A response that releases the key (SPEC §6) keeps no row: the retry executes afresh.
func TestReleasedResponseKeepsNoRow(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		if got := a.post("key-503-1", "unavailable", body, "X-Test-Status", "503"); got.Code != http.StatusServiceUnavailable {
			t.Fatalf("first POST = %d %s, want the handler's 503", got.Code, got.Body)
		}
		got := a.post("key-503-1", "retry", body)
		if got.Code != http.StatusCreated || got.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after a 503 = %d %s, want a new 201", got.Code, got.Body)
		}
	})
}

// A row whose key expired counts as absent: the key starts a new operation (SPEC §8).
func TestExpiredRowStartsANewOperation(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		first := a.post("key-expired-1", "first", body)
		if first.Code != http.StatusCreated {
			t.Fatalf("first POST = %d %s", first.Code, first.Body)
		}
		a.loseRecord(t, "key-expired-1") // as Redis does once the record's TTL ran out
		a.clock.Advance(ttl + time.Second)
		again := a.post("key-expired-1", "again", body)
		if again.Code != http.StatusCreated || again.Body.String() == first.Body.String() {
			t.Fatalf("POST after the TTL = %d %s, want a new charge", again.Code, again.Body)
		}
		if n := a.charges(t); n != 2 {
			t.Fatalf("%d charges, want 2", n)
		}
		if n, err := a.bs.DeleteExpired(t.Context(), 10); err != nil || n != 0 {
			t.Fatalf("DeleteExpired = %d, %v; want 0: the expired row was taken over", n, err)
		}
		a.clock.Advance(ttl + time.Second)
		if n, err := a.bs.DeleteExpired(t.Context(), 10); err != nil || n != 1 {
			t.Fatalf("DeleteExpired after the second TTL = %d, %v; want 1", n, err)
		}
	})
}

func TestWithoutAKeyInTxIsAPlainTransaction(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		// PUT passes through the middleware without a key (SPEC §2).
		req := httptest.NewRequest(http.MethodPut, "/v1/charges", strings.NewReader(body))
		req.Header.Set("X-Test-Name", "plain")
		rec := httptest.NewRecorder()
		a.handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated || a.charges(t) != 1 {
			t.Fatalf("PUT without a key = %d %s, %d charges; want 201 and 1", rec.Code, rec.Body, a.charges(t))
		}
		var rows int
		if err := a.db.QueryRow(`SELECT count(*) FROM ` + backstop.DefaultTable).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("%d backstop rows (%v), want none without a key", rows, err)
		}
	})
}

func TestNewRefusesABadConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, cfg := range map[string]backstop.Config{
		"Config.Dialect": {},
		"Config.Table":   {Dialect: backstop.SQLite, Table: `x"; DROP TABLE charges; --`},
	} {
		if _, err := backstop.New(db, cfg); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("New with a bad %s = %v, want an error naming it", name, err)
		}
	}
	if _, err := backstop.New(nil, backstop.Config{Dialect: backstop.SQLite}); err == nil {
		t.Error("New accepted a nil db")
	}
}

// Every hundredth new row, InTx deletes a batch of expired rows after its commit: the
// table stays bounded with no cleaner to start.
func TestInTxDeletesExpiredRowsAsItGoes(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, a *app) {
		for i := range 99 {
			if got := a.post(fmt.Sprintf("key-many-%02d", i), fmt.Sprintf("c%02d", i), body); got.Code != http.StatusCreated {
				t.Fatalf("POST %d = %d %s", i, got.Code, got.Body)
			}
		}
		a.clock.Advance(ttl + time.Second)
		if got := a.post("key-many-99", "c99", body); got.Code != http.StatusCreated {
			t.Fatalf("POST 99 = %d %s", got.Code, got.Body)
		}
		var rows int
		if err := a.db.QueryRow(`SELECT count(*) FROM ` + backstop.DefaultTable).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("%d backstop rows (%v) after the hundredth, want only its own: the 99 expired ones deleted", rows, err)
		}
	})
}

// Respond answers 503 store_unavailable when the database fails, and a request that is
// not behind the middleware is refused with ErrNoHandle.
func TestRespondAnswers503WhenTheDatabaseFails(t *testing.T) {
	t.Parallel()
	a := newApp(t, backstop.SQLite, true)
	if err := a.db.Close(); err != nil {
		t.Fatal(err)
	}
	got := a.post("key-db-down-1", "down", body)
	if got.Code != http.StatusServiceUnavailable || !strings.Contains(got.Body.String(), "store_unavailable") {
		t.Fatalf("POST with the database closed = %d %s, want 503 store_unavailable", got.Code, got.Body)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	err := a.bs.Respond(httptest.NewRecorder(), req, func(context.Context, *sql.Tx) (*idem.Response, error) {
		t.Error("Respond ran its function for a request without a Handle")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrNoHandle) {
		t.Fatalf("Respond without the middleware = %v, want ErrNoHandle", err)
	}
}

// On a ClaimInHandler route of a SQL store (the backstop beside a store that has its
// own Respond), InTx and Respond claim the key first under a lease, as the stores' own
// lease helpers do: the first request answers 201, its retry the replay, one charge.
// Without the claim the committed operation was answered 500 on every request.
func TestOnAClaimInHandlerRouteTheKeyIsClaimedFirst(t *testing.T) {
	t.Parallel()
	for _, respond := range []bool{false, true} {
		t.Run(fmt.Sprintf("respond=%v", respond), func(t *testing.T) {
			t.Parallel()
			a := &app{db: openDB(t, backstop.SQLite), dialect: backstop.SQLite, respond: respond, clock: testkit.NewClock(time.Now().UTC())}
			var err error
			if a.bs, err = backstop.New(a.db, backstop.Config{Dialect: backstop.SQLite}); err != nil {
				t.Fatal(err)
			}
			if err := a.bs.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			if err := st.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			mw := idem.New(idem.Config{Store: st, TTL: ttl, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
			a.handler = mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(a.createCharge))
			first, retry := a.post("key-claim-in-handler", "c1", body), a.post("key-claim-in-handler", "c1", body)
			if first.Code != http.StatusCreated || retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() ||
				retry.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("first %d %s, retry %d %s; want the 201 and its replay", first.Code, first.Body, retry.Code, retry.Body)
			}
			if n := a.charges(t); n != 1 {
				t.Fatalf("%d charges, want 1", n)
			}
		})
	}
}

func TestSealedTheRowKeepsNoPlaintextAndAnswersTheFirstResponse(t *testing.T) {
	t.Parallel()
	for _, d := range []backstop.Dialect{backstop.SQLite, backstop.Postgres} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			a := newAppWith(t, d, true, true)
			name := storetest.Secrets[0]
			first := a.post("key-sealed-1", name, body)
			if first.Code != http.StatusCreated || !strings.Contains(first.Body.String(), name) {
				t.Fatalf("first POST = %d %s", first.Code, first.Body)
			}
			var header, kept []byte
			if err := a.db.QueryRow(`SELECT header, body FROM `+backstop.DefaultTable).Scan(&header, &kept); err != nil {
				t.Fatal(err)
			}
			if s := storetest.HoldsSecret(append(header, kept...), name, "application/json", "charge"); s != "" || !seal.Sealed(kept) {
				t.Fatalf("the row holds %q (sealed: %v)", s, seal.Sealed(kept))
			}
			a.loseRecord(t, "key-sealed-1")
			retry := a.post("key-sealed-1", "retry", body)
			if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("retry after Redis lost the record = %d %s %v, want the first response %s", retry.Code, retry.Body, retry.Header(), first.Body)
			}
			if n := a.charges(t); n != 1 {
				t.Fatalf("%d charges, want 1", n)
			}
		})
	}
}
