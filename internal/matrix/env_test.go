package matrix

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/backstop"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/sqlite"
)

// env is one cell's store and the application beside it: a charges table in the
// database the handler writes to (a map for the memory store), and the store's two
// SPEC §7 helpers as the handler calls them.
type env struct {
	store idem.Store
	// direct inserts a charge with the database directly, outside any helper.
	direct func(ctx context.Context, key, id string) error
	// respond answers through the store's Respond form: the insert in its
	// transaction, the response returned. Nil when the store has none.
	respond func(w http.ResponseWriter, r *http.Request, key, id string) error
	// inTx runs the insert through the store's lease form and calls inside, in its
	// transaction, after the insert. Nil when the store has none.
	inTx func(w http.ResponseWriter, r *http.Request, key, id string, inside func()) error
	// charges counts the charges of key.
	charges func(t *testing.T, key string) int
	// tx, for the core cells: the store's InTx with a *sql.Tx or a pgx.Tx, the insert
	// statement's placeholders, and its own Do-style counting.
	sqlInTx func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error
	pgxInTx func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
	insert  string
}

// charge is the response of an execution: its id is new at every execution, so that a
// re-executed answer never passes for the first one's replay.
func charge(key, id string) *idem.Response {
	body, _ := json.Marshal(map[string]string{"id": id, "object": "charge", "key": key})
	return &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

func writeCharge(w http.ResponseWriter, key, id string) {
	resp := charge(key, id)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

const chargesTable = `CREATE TABLE charges (key TEXT NOT NULL, id TEXT NOT NULL)`

func newID() string { return "ch_" + rand.Text() }

// openEnv opens a fresh env of store s for t, closed when t ends.
func openEnv(t *testing.T, s Store) *env {
	t.Helper()
	switch s {
	case SQLite:
		return sqliteEnv(t)
	case Postgres, PostgresSQL:
		return postgresEnv(t, s == PostgresSQL)
	case RedisSQLite, RedisPostgres:
		return redisEnv(t, s == RedisPostgres)
	case "Redis":
		return &env{store: openRedis(t)}
	case Memory:
		return memoryEnv()
	}
	t.Fatalf("no env for store %q", s)
	return nil
}

func sqliteEnv(t *testing.T) *env {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().ExecContext(t.Context(), chargesTable); err != nil {
		t.Fatal(err)
	}
	const insert = `INSERT INTO charges (key, id) VALUES (?, ?)`
	e := &env{store: st, insert: insert, sqlInTx: st.InTx}
	return e.onSQL(st.DB(), insert, st.Respond, leaseFormOf(st.InTx))
}

// sqlRespondForm is a database/sql Respond form: sqlite's Respond, postgres's RespondSQL,
// backstop's Respond.
type sqlRespondForm func(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) (*idem.Response, error)) error

// sqlLeaseForm is a database/sql lease form as backstop's InTx takes it.
type sqlLeaseForm func(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) error) error

// leaseFormOf is a store's InTx (or InSQLTx), which needs the request's context
// only, as a sqlLeaseForm.
func leaseFormOf(inTx func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error) sqlLeaseForm {
	return func(_ http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) error) error {
		return inTx(r.Context(), fn)
	}
}

// onSQL gives e the helpers of an application on db: direct writes there with insert,
// respond through respond and inTx through inTx, each inserting with insert; and counts
// the charges in db.
func (e *env) onSQL(db *sql.DB, insert string, respond sqlRespondForm, inTx sqlLeaseForm) *env {
	e.charges = countIn(db)
	e.direct = func(ctx context.Context, key, id string) error {
		_, err := db.ExecContext(ctx, insert, key, id)
		return err
	}
	e.respond = func(w http.ResponseWriter, r *http.Request, key, id string) error {
		return respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if _, err := tx.ExecContext(ctx, insert, key, id); err != nil {
				return nil, err
			}
			return charge(key, id), nil
		})
	}
	e.inTx = func(w http.ResponseWriter, r *http.Request, key, id string, inside func()) error {
		return inTx(w, r, sqlInsert(insert, key, id, inside))
	}
	return e
}

// sqlInsert is a lease-form function: the insert, then inside.
func sqlInsert(insert, key, id string, inside func()) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, insert, key, id); err != nil {
			return err
		}
		inside()
		return nil
	}
}

func countIn(db *sql.DB) func(t *testing.T, key string) int {
	return func(t *testing.T, key string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(context.Background(), `SELECT count(*) FROM charges WHERE key = '`+key+`'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// pgPool opens a small pool on a fresh schema of the test database (its search_path),
// closed when t ends.
func pgPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dbURL, schema := pgtest.Schema(t)
	return pgtest.Pool(t, pgtest.SearchPathURL(t, dbURL, schema), 4), schema
}

func postgresEnv(t *testing.T, databaseSQL bool) *env {
	pool, schema := pgPool(t)
	st, err := postgres.NewFromPool(pool, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), chargesTable); err != nil {
		t.Fatal(err)
	}
	const insert = `INSERT INTO charges (key, id) VALUES ($1, $2)`
	e := &env{store: st, insert: insert, sqlInTx: st.InSQLTx, pgxInTx: st.InTx, charges: countIn(st.DB())}
	e.direct = func(ctx context.Context, key, id string) error {
		_, err := pool.Exec(ctx, insert, key, id)
		return err
	}
	if databaseSQL {
		return e.onSQL(st.DB(), insert, st.RespondSQL, leaseFormOf(st.InSQLTx))
	}
	e.respond = func(w http.ResponseWriter, r *http.Request, key, id string) error {
		return st.Respond(w, r, func(b *pgx.Batch) (*idem.Response, error) {
			b.Queue(insert, key, id)
			return charge(key, id), nil
		})
	}
	e.inTx = func(w http.ResponseWriter, r *http.Request, key, id string, inside func()) error {
		return st.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, key, id); err != nil {
				return err
			}
			inside()
			return nil
		})
	}
	return e
}

func openRedis(t *testing.T) *redis.Store {
	t.Helper()
	st, err := redis.Open(t.Context(), testenv.RedisURL(t), redis.Config{KeyPrefix: testenv.Name("matrix:") + ":", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func redisEnv(t *testing.T, onPostgres bool) *env {
	st := openRedis(t)
	var (
		db      *sql.DB
		dialect = backstop.SQLite
		insert  = `INSERT INTO charges (key, id) VALUES (?, ?)`
	)
	if onPostgres {
		pool, _ := pgPool(t)
		db, dialect, insert = stdlib.OpenDBFromPool(pool), backstop.Postgres, `INSERT INTO charges (key, id) VALUES ($1, $2)`
	} else {
		var err error
		db, err = sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)")
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.ExecContext(t.Context(), chargesTable); err != nil {
		t.Fatal(err)
	}
	bs, err := backstop.New(db, backstop.Config{Dialect: dialect})
	if err != nil {
		t.Fatal(err)
	}
	if err := bs.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	e := &env{store: st}
	return e.onSQL(db, insert, bs.Respond, bs.InTx)
}

// memoryEnv is the in-memory store, its charges a map.
func memoryEnv() *env {
	var mu sync.Mutex
	charges := map[string]int{}
	return &env{
		store: memory.New(),
		direct: func(_ context.Context, key, _ string) error {
			mu.Lock()
			defer mu.Unlock()
			charges[key]++
			return nil
		},
		charges: func(_ *testing.T, key string) int {
			mu.Lock()
			defer mu.Unlock()
			return charges[key]
		},
	}
}

// handler is the cell's POST /v1/charges: it makes one charge for the request's key
// through helper h and answers 201 with it.
func (e *env) handler(h Helper) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, id := r.Header.Get("Idempotency-Key"), newID()
		var err error
		switch h {
		case Respond:
			err = e.respond(w, r, key, id)
		case InTx:
			err = e.inTx(w, r, key, id, func() { writeCharge(w, key, id) })
		case Late:
			if err = e.inTx(w, r, key, id, func() {}); err == nil {
				writeCharge(w, key, id) // too late: the transaction committed without it
			}
		case Direct:
			if err = e.direct(r.Context(), key, id); err == nil {
				writeCharge(w, key, id)
			}
		}
		if err != nil && !errors.Is(err, idem.ErrAnswered) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}
}

// lockedBuffer collects a cell's log lines from concurrent requests.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
