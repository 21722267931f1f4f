package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/payments"
	"github.com/idem-go/idem/internal/secret"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/sqlite"
)

// Pool sizes. Requests hold a connection only for a statement or one short
// transaction; the simulated card processor (--processor-latency) holds none, so many
// more requests than connections can be in flight.
const (
	// sqliteConns: SQLite in WAL mode lets readers run while one writer writes, and
	// write transactions queue in-process, so a handful of connections serve reads
	// and the single writer.
	sqliteConns = 8
	// mysqlConns: as postgresConns.
	mysqlConns = 32
	// postgresConns: enough for claims, completions and the API's transactions of
	// dozens of concurrent requests.
	postgresConns = 32
)

// defaultStore is the --store of `idem payments`: an SQLite file in the working
// directory, so that the command runs with no setup.
const defaultStore = "sqlite:idem.db"

type storeKind int

const (
	kindSQLite storeKind = iota + 1
	kindPostgres
	kindRedis
	kindMySQL
)

// storeURL is a parsed --store or --db URL.
type storeURL struct {
	kind storeKind
	raw  string // as given
	// path is the SQLite database: a file path or a file: URI.
	path string
	// timeout bounds connecting to a PostgreSQL or Redis store and, for Redis, each
	// read and write, where the URL does not set its own bounds (conn.go). Zero means
	// idem.DefaultStoreTimeout.
	timeout time.Duration
}

// connTimeout is u.timeout or its default.
func (u storeURL) connTimeout() time.Duration {
	if u.timeout > 0 {
		return u.timeout
	}
	return idem.DefaultStoreTimeout
}

// parseStoreURL parses a store URL:
//
//	sqlite:PATH, sqlite://PATH      an SQLite file (sqlite:///abs/path is /abs/path);
//	                                PATH may be a file: URI carrying parameters
//	postgres://…, postgresql://…    PostgreSQL, as pgx reads it (pool_max_conns=N etc.)
//	mysql://[user[:password]@]host[:port]/database[?param=value…]
//	                                MySQL or MariaDB, the go-sql-driver/mysql parameters
//	redis://[user:password@]host:port[/db], rediss://…
//	                                one Redis server (rediss: over TLS)
//	redis+cluster://host:port[?addr=host:port&addr=…], rediss+cluster://…
//	                                a Redis Cluster (any reachable seed nodes)
//	redis+sentinel://[user:password@]host:port[,host:port…][/db]?master=NAME, rediss+sentinel://…
//	                                the master that Redis Sentinels watch
//
// Errors name the URL with its password redacted.
func parseStoreURL(raw string) (storeURL, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" {
		return storeURL{}, fmt.Errorf("store URL %q has no scheme (want sqlite:PATH, postgres://…, mysql://… or redis://…)", redact(raw))
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return storeURL{}, fmt.Errorf("store URL %q has no path (want sqlite:PATH)", raw)
		}
		return storeURL{kind: kindSQLite, raw: raw, path: path}, nil
	case "postgres", "postgresql":
		if !strings.HasPrefix(rest, "//") {
			return storeURL{}, fmt.Errorf("store URL %q: want postgres://[user[:password]@]host[:port]/database", redact(raw))
		}
		if _, err := pgxpool.ParseConfig(raw); err != nil {
			return storeURL{}, fmt.Errorf("store URL %q: %v", redact(raw), err)
		}
		return storeURL{kind: kindPostgres, raw: raw}, nil
	case "mysql":
		if !strings.HasPrefix(rest, "//") {
			return storeURL{}, fmt.Errorf("store URL %q: want mysql://[user[:password]@]host[:port]/database", redact(raw))
		}
		if _, err := mysql.ParseDSN(raw); err != nil {
			return storeURL{}, fmt.Errorf("store URL %q: %v", redact(raw), err)
		}
		return storeURL{kind: kindMySQL, raw: raw}, nil
	}
	if redis.IsURL(raw) {
		// Parsed now (NewClient does not connect), so that a bad port or option is a
		// usage error like any other bad URL; its errors are redacted.
		c, err := redis.NewClient(raw)
		if err != nil {
			return storeURL{}, err
		}
		_ = c.Close()
		return storeURL{kind: kindRedis, raw: raw}, nil
	}
	return storeURL{}, fmt.Errorf("store URL %q has unsupported scheme %q (want sqlite:PATH, postgres://…, postgresql://…, mysql://…, redis://, rediss://, redis+cluster:// or redis+sentinel://)", redact(raw), scheme)
}

// sql reports whether the URL names a database that can also keep the payments data:
// SQLite or PostgreSQL (the payments data has no MySQL schema: errNoMySQLPayments).
func (u storeURL) sql() bool { return u.kind == kindSQLite || u.kind == kindPostgres }

// errNoMySQLPayments is why a MySQL URL cannot keep the payments data (--db, or a
// --store without --db): internal/payments has SQLite and PostgreSQL schemas only.
const errNoMySQLPayments = "the payments data (charges, orders) has SQLite and PostgreSQL schemas only, not MySQL's: " +
	"keep idem's records on MySQL with --store mysql://… and the payments data elsewhere with --db sqlite:PATH or --db postgres://…"

// String is the URL with every password replaced by "xxxxx", for logs and errors.
func (u storeURL) String() string { return redact(u.raw) }

// redact hides the passwords of a URL (userinfo and password-like query parameters);
// a URL that does not parse is shown as its scheme only (SPEC §15).
func redact(raw string) string { return secret.RedactURL(raw) }

// openedStore is an open idempotency store, with the SPEC §7 helper when it has one.
type openedStore struct {
	url   storeURL
	store idemstore.Store
	// migrate creates or upgrades the store's schema.
	migrate func(ctx context.Context) error
	// unknownMigrations names the migrations a later release applied to the schema
	// (nil for Redis, which has none); lastMigration is the last this release knows.
	unknownMigrations func(ctx context.Context) ([]string, error)
	lastMigration     string
	// sqlite or pg is set for an SQL store, so that a DB on the same database can
	// share its connections and its InTx helper.
	sqlite *sqlite.Store
	pg     *postgres.Store
	close  func()
}

// startAttrs are what the start line says of the store: on PostgreSQL, what a failover
// of its database may lose (replication: synchronous, asynchronous, none or unknown;
// the store's migration logged a WARN already when it is asynchronous), and whether a
// connection pooler stands in between.
func (o *openedStore) startAttrs(ctx context.Context) []any {
	if o.pg == nil {
		return nil
	}
	r, err := o.pg.Replication(ctx)
	if err != nil {
		return []any{"replication", postgres.ReplicationUnknown}
	}
	attrs := []any{"replication", r.Mode}
	if r.Pooler {
		attrs = append(attrs, "pooler", true)
	}
	return attrs
}

// openStore opens the idempotency store at u. It does not migrate it. An SQL store
// runs its background cleaner with cleaner until it is closed; nil starts none (the
// one-shot commands: migrate, purge, keys). With existing, an SQLite file that does
// not exist is refused (an error matching fs.ErrNotExist) instead of created: the
// commands that inspect or maintain a store must not take a mistyped path for an
// empty store.
func openStore(ctx context.Context, u storeURL, logger *slog.Logger, cleaner *idem.CleanerConfig, existing bool) (*openedStore, error) {
	var clean idem.CleanerConfig
	if cleaner != nil {
		clean = *cleaner
	}
	switch u.kind {
	case kindSQLite:
		st, err := sqlite.Open(ctx, u.path, sqlite.Config{MaxOpenConns: sqliteConns, Logger: logger,
			Cleaner: clean, DisableCleaner: cleaner == nil, MustExist: existing})
		if err != nil {
			return nil, err
		}
		return &openedStore{url: u, store: st, migrate: st.Migrate, sqlite: st, close: func() { _ = st.Close() },
			unknownMigrations: st.UnknownMigrations, lastMigration: sqlite.LastMigration()}, nil
	case kindPostgres:
		pool, err := openPostgresPool(ctx, u.raw, postgresConns, u.connTimeout(), logger)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		st, err := postgres.NewFromPool(pool, postgres.Config{Logger: logger, Cleaner: clean, DisableCleaner: cleaner == nil})
		if err != nil {
			pool.Close()
			return nil, err
		}
		closeAll := func() { st.Close(); pool.Close() }
		return &openedStore{url: u, store: st, migrate: st.Migrate, pg: st, close: closeAll,
			unknownMigrations: st.UnknownMigrations, lastMigration: postgres.LastMigration()}, nil
	case kindMySQL:
		// Open logs its durability warnings (innodb_flush_log_at_trx_commit, sync_binlog)
		// once, through logger.
		st, err := mysql.Open(ctx, mysqlURLWithTimeout(u.raw, u.connTimeout()), mysql.Config{MaxOpenConns: mysqlConns,
			Logger: logger, Cleaner: clean, DisableCleaner: cleaner == nil})
		if err != nil {
			return nil, err
		}
		return &openedStore{url: u, store: st, migrate: st.Migrate, close: func() { _ = st.Close() },
			unknownMigrations: st.UnknownMigrations, lastMigration: mysql.LastMigration()}, nil
	case kindRedis:
		routeGoRedisLogs(logger)
		// Open logs its durability warnings (persistence, eviction) once, through logger.
		st, err := redis.Open(ctx, redisURLWithTimeouts(u.raw, u.connTimeout()), redis.Config{Logger: logger})
		if err != nil {
			return nil, err
		}
		// Redis has no schema: records are hashes written on first use.
		noMigration := func(context.Context) error { return nil }
		return &openedStore{url: u, store: st, migrate: noMigration, close: func() { _ = st.Close() }}, nil
	}
	return nil, fmt.Errorf("store URL %q: unknown kind", u)
}

// mysqlURLWithTimeout bounds dialing the server of a mysql:// URL by timeout unless
// the URL sets its own (the driver's timeout parameter).
func mysqlURLWithTimeout(raw string, timeout time.Duration) string {
	if strings.Contains(raw, "timeout=") {
		return raw
	}
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	return raw + sep + "timeout=" + timeout.String()
}

// check is the start sequence's check of the store (SPEC §20, idem.CheckStore), once
// it is migrated: it refuses a store whose format level is newer than this release
// knows, naming both, and records this release as serving the store today. It ends
// within timeout.
func (o *openedStore) check(ctx context.Context, timeout time.Duration) (idem.StoreState, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := idem.CheckStore(ctx, o.store)
	if err != nil {
		return st, fmt.Errorf("the store %s: %w", o.url, err)
	}
	return st, nil
}

// goRedisLogs makes go-redis's own logger (connection pool and cluster chatter, which
// it prints to stderr by default) write through slog at debug level, once per process:
// the store reports what matters as errors, and a Redis outage must not flood the log.
var goRedisLogs sync.Once

func routeGoRedisLogs(logger *slog.Logger) {
	goRedisLogs.Do(func() { goredis.SetLogger(goRedisLogger{logger}) })
}

// goRedisLogger is go-redis's logging interface on an slog.Logger.
type goRedisLogger struct{ l *slog.Logger }

func (g goRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	g.l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

// What migrate and purge say about a Redis store, which needs neither.
const (
	redisNoMigrate = "nothing to migrate: a Redis store has no schema (and expires records itself by key TTL)"
	redisNoPurge   = "nothing to purge: Redis expires records itself by key TTL (and a Redis store has no schema)"
)

// openDB opens where the payments API keeps its data. When db names the store's own
// SQL database, the DB shares the store's connections and its InTx helper, so every
// mutation commits its rows and the idempotency record together (SPEC §7); otherwise it
// gets connections of its own and plain transactions (a PostgreSQL pool's WARN about a
// connection pooler on logger, marked pool=--db).
func openDB(ctx context.Context, db storeURL, st *openedStore, logger *slog.Logger) (*payments.DB, func(), error) {
	if db.raw == st.url.raw {
		switch {
		case st.sqlite != nil:
			return payments.NewSQLiteStoreDB(st.sqlite), func() {}, nil
		case st.pg != nil:
			return payments.NewPostgresStoreDB(st.pg), func() {}, nil
		}
	}
	switch db.kind {
	case kindSQLite:
		sdb, err := payments.OpenSQLite(db.path, sqliteConns)
		if err != nil {
			return nil, nil, err
		}
		return payments.NewSQLiteDB(sdb, nil), func() { _ = sdb.Close() }, nil
	case kindPostgres:
		pool, err := openPostgresPool(ctx, db.raw, postgresConns, db.connTimeout(), logger.With("pool", "--db"))
		if err != nil {
			return nil, nil, fmt.Errorf("--db %q: %v", db, err)
		}
		return payments.NewPostgresDB(pool, nil), pool.Close, nil
	}
	return nil, nil, fmt.Errorf("--db %q: the payments data needs an SQL database (sqlite: or postgres://)", db)
}
