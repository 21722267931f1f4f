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
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/mysqltest"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
	"github.com/idem-go/idem/store/sqlite"
)

// env is one cell's store and the application beside it: a charges table in the
// database the handler writes to (a map for the memory store), and the store's two
// SPEC §7 helpers as the handler calls them.
type env struct {
	store idemstore.Store
	// direct inserts a charge with the database directly, outside any helper.
	direct func(ctx context.Context, key, id string) error
	// respond answers o through the store's Respond form: its insert in its
	// transaction, its response returned. Nil when the store has none.
	respond func(w http.ResponseWriter, r *http.Request, o op) error
	// inTx runs o's insert through the store's lease form and calls inside, in its
	// transaction, after the insert. Nil when the store has none.
	inTx func(w http.ResponseWriter, r *http.Request, o op, inside func()) error
	// finish answers o through idem.Finish over the store's lease form: its insert in
	// the transaction, its response returned. Nil when the store has none.
	finish func(r *http.Request, o op) error
	// charges counts the charges of key.
	charges func(t *testing.T, key string) int
	// move copies the stored response of (from, key) onto the record (onto, key), its
	// body replaced by body, in the store's own tables or values, as someone who can
	// write them would; nil for the memory store, which has none.
	move func(t *testing.T, key, from, onto string, body []byte)
	// respondRuns counts the runs of the Respond form's function, by key.
	respondRuns counter
	// tx, for the core cells: the store's InTx with a *sql.Tx or a pgx.Tx, the insert
	// statement's placeholders, and its own Do-style counting.
	sqlInTx func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error
	pgxInTx func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
	insert  string
}

// op is one execution of the handler: the charge it makes for key, named id, or, when
// fail, nothing at all and a 503 that says so (a releasing status, SPEC §6).
type op struct {
	key, id string
	fail    bool
}

// response is o's answer: a 201 whose id is new at every execution, so that a
// re-executed answer never passes for the first one's replay, with the headers a
// replay must carry (stored: Content-Type, Location, ETag, Cache-Control) and one it
// must not (Set-Cookie); or o's 503.
func (o op) response() *idem.Response {
	if o.fail {
		return &idem.Response{Status: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"error":"the processor is down; nothing was charged"}`)}
	}
	body, _ := json.Marshal(map[string]string{"id": o.id, "object": "charge", "key": o.key})
	return &idem.Response{Status: http.StatusCreated, Header: http.Header{
		"Content-Type":  {"application/json"},
		"Location":      {"/v1/charges/" + o.id},
		"Etag":          {`"` + o.id + `"`},
		"Cache-Control": {"no-store"},
		"Set-Cookie":    {"session=" + o.id},
	}, Body: body}
}

// write writes o's response on w.
func (o op) write(w http.ResponseWriter) {
	resp := o.response()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
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
	case MySQL:
		return mysqlEnv(t)
	case Postgres, PostgresSQL, PostgresPooled:
		return postgresEnv(t, s == PostgresSQL, s == PostgresPooled)
	case RedisSQLite, RedisPostgres:
		return redisEnv(t, openRedis(t, testenv.RedisURL(t)), s == RedisPostgres)
	case RedisSentinel:
		return redisEnv(t, openRedis(t, sentinelURL(t)), false)
	case "Redis":
		return &env{store: openRedis(t, testenv.RedisURL(t))}
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
	e := &env{store: st, insert: insert, sqlInTx: st.InTx, finish: sqlFinish(st.InTx, insert)}
	e.move = func(t *testing.T, key, from, onto string, body []byte) {
		mustExec(t, func() error {
			_, err := st.DB().Exec(`UPDATE idem_records SET (response_status, response_headers, response_body) =
				(SELECT response_status, response_headers, ?4 FROM idem_records WHERE scope = ?1 AND key = ?3)
				WHERE scope = ?2 AND key = ?3`, from, onto, key, body)
			return err
		})
	}
	return e.onSQL(st.DB(), insert, st.Respond, leaseFormOf(st.InTx))
}

// mysqlInsert is the charges' insert on MySQL, where key is a reserved word.
const mysqlInsert = "INSERT INTO charges (`key`, id) VALUES (?, ?)"

// keyColumn is the key column as insert spells it.
func keyColumn(insert string) string {
	if insert == mysqlInsert {
		return "`key`"
	}
	return "key"
}

// mysqlEnv is the MySQL store on a fresh database of the test server.
func mysqlEnv(t *testing.T) *env {
	st, err := mysql.Open(t.Context(), mysqltest.Database(t, nil), mysql.Config{MaxOpenConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().ExecContext(t.Context(), "CREATE TABLE charges (`key` VARCHAR(255) NOT NULL, id VARCHAR(255) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	e := &env{store: st, insert: mysqlInsert, sqlInTx: st.InTx, finish: sqlFinish(st.InTx, mysqlInsert)}
	e.move = func(t *testing.T, key, from, onto string, body []byte) {
		mustExec(t, func() error {
			_, err := st.DB().Exec(`UPDATE idem_records r JOIN idem_records f ON f.scope = ? AND f.key = r.key
				SET r.response_status = f.response_status, r.response_headers = f.response_headers, r.response_body = ?
				WHERE r.scope = ? AND r.key = ?`, from, body, onto, key)
			return err
		})
	}
	return e.onSQL(st.DB(), mysqlInsert, st.Respond, leaseFormOf(st.InTx))
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
	e.charges = countIn(db, "charges", keyColumn(insert))
	e.direct = func(ctx context.Context, key, id string) error {
		_, err := db.ExecContext(ctx, insert, key, id)
		return err
	}
	e.respond = func(w http.ResponseWriter, r *http.Request, o op) error {
		return respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			e.respondRuns.add(o.key)
			if err := sqlInsert(ctx, tx, insert, o); err != nil {
				return nil, err
			}
			return o.response(), nil
		})
	}
	e.inTx = func(w http.ResponseWriter, r *http.Request, o op, inside func()) error {
		return inTx(w, r, func(ctx context.Context, tx *sql.Tx) error {
			if err := sqlInsert(ctx, tx, insert, o); err != nil {
				return err
			}
			inside()
			return nil
		})
	}
	return e
}

// sqlFinish answers o through idem.Finish over a database/sql lease form.
func sqlFinish(inTx func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error, insert string) func(r *http.Request, o op) error {
	return func(r *http.Request, o op) error {
		return idem.Finish(r.Context(), inTx, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if err := sqlInsert(ctx, tx, insert, o); err != nil {
				return nil, err
			}
			return o.response(), nil
		})
	}
}

// sqlInsert inserts o's charge in tx, unless o fails.
func sqlInsert(ctx context.Context, tx *sql.Tx, insert string, o op) error {
	if o.fail {
		return nil
	}
	_, err := tx.ExecContext(ctx, insert, o.key, o.id)
	return err
}

// countIn counts the charges of a key in table of db.
func countIn(db *sql.DB, table, keyCol string) func(t *testing.T, key string) int {
	return func(t *testing.T, key string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(context.Background(), `SELECT count(*) FROM `+table+` WHERE `+keyCol+` = '`+key+`'`).Scan(&n); err != nil {
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

// pooledPgPool opens a small pool on a fresh schema of the test database through a
// PgBouncer of the cell's own in transaction mode (1.18: it keeps no prepared
// statements), with a URL that names no exec mode, configured by
// postgres.ConfigurePool: it finds the pooler and switches to cache_describe. A
// pooler passes no search_path on: the cell names the schema itself.
func pooledPgPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dbURL, schema := pgtest.Schema(t)
	configure := func(cfg *pgxpool.Config) { postgres.ConfigurePool(cfg, slog.New(slog.DiscardHandler)) }
	return pgtest.Pool(t, pgtest.Bouncer(t, dbURL, 4), 4, configure), schema
}

// postgresEnv is the PostgreSQL store through pgx (or database/sql, databaseSQL),
// straight to the server or, pooled, behind PgBouncer (pooledPgPool).
func postgresEnv(t *testing.T, databaseSQL, pooled bool) *env {
	pool, schema := pgPool(t)
	if pooled {
		pool, schema = pooledPgPool(t)
	}
	table := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	st, err := postgres.NewFromPool(pool, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+table("charges")+` (key TEXT NOT NULL, id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO ` + table("charges") + ` (key, id) VALUES ($1, $2)`
	e := &env{store: st, insert: insert, sqlInTx: st.InSQLTx, pgxInTx: st.InTx, charges: countIn(st.DB(), table("charges"), "key")}
	e.move = func(t *testing.T, key, from, onto string, body []byte) {
		mustExec(t, func() error {
			_, err := pool.Exec(context.Background(), `UPDATE `+table("idem_records")+` r SET (response_status, response_headers, response_body) =
				(SELECT f.response_status, f.response_headers, $4::bytea FROM `+table("idem_records")+` f WHERE f.scope = $1 AND f.key = $3)
				WHERE r.scope = $2 AND r.key = $3`, []byte(from), []byte(onto), []byte(key), body)
			return err
		})
	}
	e.direct = func(ctx context.Context, key, id string) error {
		_, err := pool.Exec(ctx, insert, key, id)
		return err
	}
	if databaseSQL {
		e.finish = sqlFinish(st.InSQLTx, insert)
		return e.onSQL(st.DB(), insert, st.RespondSQL, leaseFormOf(st.InSQLTx))
	}
	e.finish = func(r *http.Request, o op) error {
		return idem.Finish(r.Context(), st.InTx, func(ctx context.Context, tx pgx.Tx) (*idem.Response, error) {
			if !o.fail {
				if _, err := tx.Exec(ctx, insert, o.key, o.id); err != nil {
					return nil, err
				}
			}
			return o.response(), nil
		})
	}
	e.respond = func(w http.ResponseWriter, r *http.Request, o op) error {
		return st.Respond(w, r, func(b *pgx.Batch) (*idem.Response, error) {
			e.respondRuns.add(o.key)
			if !o.fail {
				b.Queue(insert, o.key, o.id)
			}
			return o.response(), nil
		})
	}
	e.inTx = func(w http.ResponseWriter, r *http.Request, o op, inside func()) error {
		return st.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			if !o.fail {
				if _, err := tx.Exec(ctx, insert, o.key, o.id); err != nil {
					return err
				}
			}
			inside()
			return nil
		})
	}
	return e
}

func openRedis(t *testing.T, url string) *redis.Store {
	t.Helper()
	st, err := redis.Open(t.Context(), url, redis.Config{KeyPrefix: testenv.Name("matrix:") + ":", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// redisEnv is the Redis store st beside an application database with the backstop's
// table: SQLite, or PostgreSQL when onPostgres.
func redisEnv(t *testing.T, st *redis.Store, onPostgres bool) *env {
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
	e.move = func(t *testing.T, key, from, onto string, body []byte) {
		mustExec(t, func() error {
			ctx := context.Background()
			v, err := st.Client().HMGet(ctx, st.RecordKey(from, key), "status", "hdr").Result()
			if err != nil {
				return err
			}
			return st.Client().HSet(ctx, st.RecordKey(onto, key), "status", v[0], "hdr", v[1], "body", body).Err()
		})
	}
	return e.onSQL(db, insert, bs.Respond, bs.InTx)
}

// The Sentinel deployment of the RedisSentinel column: started once, by the column's
// test (useSentinel), and shared by its cells, each on a key prefix of its own.
var (
	sentinelMu  sync.Mutex
	sentinelRaw string
)

// useSentinel starts the Sentinel deployment for the RedisSentinel cells that t (the
// column's test) runs; it stops when t and its cells end.
func useSentinel(t *testing.T) {
	d := redistest.StartSentinel(t, redistest.SentinelOptions{})
	sentinelMu.Lock()
	defer sentinelMu.Unlock()
	// A WAIT bound that a busy machine meets (the replica is local), below the
	// client's read timeout and the middleware's StoreTimeout (5 s).
	sentinelRaw = d.URL() + "&wait_replicas=1&wait_timeout=2s&read_timeout=4s"
}

// sentinelURL returns the URL of the deployment useSentinel started.
func sentinelURL(t *testing.T) string {
	sentinelMu.Lock()
	defer sentinelMu.Unlock()
	if sentinelRaw == "" {
		t.Fatalf("no Sentinel deployment: the %q column's test starts it (useSentinel)", RedisSentinel)
	}
	return sentinelRaw
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

// The request headers that tell the cell's handler what to do: failHeader, answer 503
// and charge nothing; stallHeader, pass the cell's gate of that name before charging.
const (
	failHeader  = "X-Matrix-Fail"
	stallHeader = "X-Matrix-Stall"
)

// handler is the cell's POST /v1/charges: it makes one charge for the request's key
// through helper h and answers 201 with it (or, asked to, 503 and no charge). A
// request asking to stall passes the gate it names first, under the key's claim.
func (e *env) handler(h Helper, stall func(gate string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o := op{key: r.Header.Get("Idempotency-Key"), id: newID(), fail: r.Header.Get(failHeader) != ""}
		if gate := r.Header.Get(stallHeader); gate != "" {
			stall(gate)
		}
		var err error
		switch h {
		case Respond:
			err = e.respond(w, r, o)
		case InTx:
			err = e.inTx(w, r, o, func() { o.write(w) })
		case Finish:
			err = e.finish(r, o)
		case Late:
			if err = e.inTx(w, r, o, func() {}); err == nil {
				o.write(w) // too late: the transaction committed without it
			}
		case Direct:
			if !o.fail {
				err = e.direct(r.Context(), o.key, o.id)
			}
			if err == nil {
				o.write(w)
			}
		}
		if err != nil && !errors.Is(err, idem.ErrAnswered) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}
}

// counter counts by key, safe for concurrent use.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
}

func (c *counter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
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

// mustExec fails t when exec does.
func mustExec(t *testing.T, exec func() error) {
	t.Helper()
	if err := exec(); err != nil {
		t.Fatal(err)
	}
}
