package payments

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// bundle is one payments API under test, mounted in-process, with what built it.
type bundle struct {
	t       testing.TB
	srv     *Server
	handler http.Handler
	store   idemstore.Store
	db      *DB
	// exec runs a statement on the bundle's database (to simulate a lost record).
	exec func(sql string)
}

// option changes a bundle's Config before New.
type option func(*Config)

func withProfile(p idem.Profile) option { return func(c *Config) { c.Profile = p } }
func withoutIdempotency() option        { return func(c *Config) { c.DisableIdempotency = true } }

func withClock(now func() time.Time) option { return func(c *Config) { c.Now = now } }

// skippableClock is a ticking clock that a test can move forward.
type skippableClock struct {
	tick func() time.Time
	skip atomic.Int64
}

func newSkippableClock() *skippableClock { return &skippableClock{tick: tickingClock()} }

func (c *skippableClock) now() time.Time          { return c.tick().Add(time.Duration(c.skip.Load())) }
func (c *skippableClock) advance(d time.Duration) { c.skip.Add(int64(d)) }

// tickingClock returns a clock that advances one second at every reading, so that
// objects created one after the other have distinct created times.
func tickingClock() func() time.Time {
	var n atomic.Int64
	base := time.Unix(1_700_000_000, 0)
	return func() time.Time { return base.Add(time.Duration(n.Add(1)) * time.Second) }
}

// eachDB runs test once on SQLite and once on PostgreSQL (its own schema).
func eachDB(t *testing.T, test func(t *testing.T, newBundle func(...option) *bundle)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		test(t, func(opts ...option) *bundle { return sqliteBundle(t, opts...) })
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		test(t, func(opts ...option) *bundle { return postgresBundle(t, opts...) })
	})
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func sqliteBundle(t testing.TB, opts ...option) *bundle {
	t.Helper()
	ctx := testenv.Context(t)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := newBundle(t, st, NewSQLiteStoreDB(st), opts...)
	b.exec = func(q string) {
		if _, err := st.DB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return b
}

func postgresBundle(t testing.TB, opts ...option) *bundle {
	t.Helper()
	ctx := testenv.Context(t)
	dbURL, schema := pgtest.Schema(t)
	st, err := postgres.Open(ctx, pgtest.SearchPathURL(t, dbURL, schema), postgres.Config{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := newBundle(t, st, NewPostgresStoreDB(st), opts...)
	b.exec = func(q string) {
		if _, err := st.Pool().Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return b
}

func newBundle(t testing.TB, st idemstore.Store, db *DB, opts ...option) *bundle {
	t.Helper()
	if _, err := db.Migrate(testenv.Context(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	cfg := Config{Store: st, DB: db, Logger: quietLogger(), Now: tickingClock()}
	for _, o := range opts {
		o(&cfg)
	}
	srv := New(cfg)
	return &bundle{t: t, srv: srv, handler: srv.Handler(), store: st, db: db}
}

// count returns how many rows table holds in the bundle's database.
func (b *bundle) count(table string) int {
	b.t.Helper()
	var n int
	var err error
	if b.db.dialect == dialectPostgres {
		err = b.db.pool.QueryRow(testenv.Context(b.t), "SELECT count(*) FROM "+table).Scan(&n)
	} else {
		err = b.db.sqlDB.QueryRowContext(testenv.Context(b.t), "SELECT count(*) FROM "+table).Scan(&n)
	}
	if err != nil {
		b.t.Fatalf("counting %s: %v", table, err)
	}
	return n
}

// req describes one request to the API.
type req struct {
	method, path string
	token        string // "" sends no Authorization header
	auth         string // a raw Authorization header, instead of token
	key          string // "" sends no Idempotency-Key
	contentType  string // defaults to application/json when body is set
	body         string
}

func (b *bundle) do(r req) *httptest.ResponseRecorder {
	b.t.Helper()
	hr := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
	switch {
	case r.auth != "":
		hr.Header.Set("Authorization", r.auth)
	case r.token != "":
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	switch {
	case r.contentType != "":
		hr.Header.Set("Content-Type", r.contentType)
	case r.body != "":
		hr.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	b.handler.ServeHTTP(w, hr)
	return w
}

// postCharge posts a JSON charge body with key as principal token.
func (b *bundle) postCharge(token, key, body string) *httptest.ResponseRecorder {
	b.t.Helper()
	return b.do(req{method: "POST", path: "/v1/charges", token: token, key: key, body: body})
}

func wantStatus(t *testing.T, w *httptest.ResponseRecorder, status int) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body: %s", w.Code, status, w.Body.String())
	}
}

// decode decodes a JSON body into a map, failing the test when it is not JSON.
func decode(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, w.Body.String())
	}
	return m
}

// apiErr returns the error member of a Stripe-shaped error body.
func apiErr(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	e, ok := decode(t, w)["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %s", w.Body.String())
	}
	return e
}

// newKey returns a fresh idempotency key.
func newKey() string { return testenv.Name("key-") }
