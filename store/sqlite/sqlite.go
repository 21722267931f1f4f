package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/sqlstore"

	// The driver registers itself as "sqlite".
	_ "modernc.org/sqlite"
)

// Defaults of [Config].
const (
	// DefaultBusyTimeout is how long one statement waits for another process's lock
	// before the store retries its whole transaction.
	DefaultBusyTimeout = 5 * time.Second
	// DefaultMaxOpenConns bounds the connection pool.
	DefaultMaxOpenConns = 8
)

// DefaultCleanerBatchSize is the batch size of the store's cleaner (Config.Cleaner):
// smaller than idem.DefaultCleanerBatchSize, because a batch holds the file's one write
// lock, which every claim and completion waits for. Deleting a backlog of 100,000
// expired records beside requests raised their p99 3.7 times in batches of 1000 and 1.7
// times in batches of 200, the cleaner pausing as long as each batch took.
const DefaultCleanerBatchSize = 200

// Config configures a [Store]. The zero value is ready to use.
type Config struct {
	// BusyTimeout is SQLite's per-connection busy_timeout: how long one statement
	// waits for a lock that another process (or a connection outside the store) holds
	// before it fails with SQLITE_BUSY. The store then retries the whole transaction
	// with a short jittered backoff for as long as the context lives, so this bounds
	// one wait, not the request. It must not be negative. Defaults to
	// [DefaultBusyTimeout].
	BusyTimeout time.Duration

	// MaxOpenConns bounds the pool of connections to the file. Readers use several at
	// once (WAL lets them read while one writer writes); the store's own write
	// transactions use one at a time per process, queued in process, so more
	// connections add read concurrency only. [Store.InTx] holds one for the length of
	// the application's function, and that function may use more through [Store.DB].
	// It must not be negative. Defaults to [DefaultMaxOpenConns].
	MaxOpenConns int

	// SynchronousClaim makes a claim's write transaction wait for its fsync like every
	// other commit. Without it claims commit on a connection of their own with
	// synchronous=NORMAL, which in WAL mode skips the fsync: an operating-system crash or
	// a power loss may lose the last claims (a retry then executes, exactly once), never
	// a completion or an application's write, because the completion's synchronous=FULL
	// commit fsyncs the WAL, and with it every frame written before its own, the claim's
	// included (see "Durable claims" in the package doc). Defaults to false.
	SynchronousClaim bool

	// Logger receives migrations (info) and lock-contention retries (debug). Keys and
	// bodies are never logged. Defaults to a logger that discards everything.
	Logger *slog.Logger

	// Cleaner configures the cleaner that [Open] starts and [Store.Close] stops: it
	// deletes expired records in bounded batches in the background (SPEC §8), its
	// first pass one jittered Cleaner.Interval after Open ([idem.Cleaner.Start]).
	// Cleaner.Retention keeps records that long after they expire, for audits; its
	// warnings go to Cleaner.Logger, else to Logger when set, else to slog.Default.
	// Defaults to the zero [idem.CleanerConfig] but for its BatchSize,
	// [DefaultCleanerBatchSize] (each batch holds SQLite's one write lock): a pass
	// every minute, batches of 200 paced by the time each took, no retention.
	Cleaner idem.CleanerConfig

	// DisableCleaner starts no cleaner, for a process that opens the store for a
	// moment (a migration, an admin tool such as `idem keys`) or whose expired records
	// are deleted elsewhere (another process's cleaner, `idem purge` from cron). An
	// expired record counts as absent at once, but without any cleaner it stays on
	// disk forever. Defaults to false.
	DisableCleaner bool

	// MustExist makes [Open] refuse a database file that does not exist (an error
	// matching [fs.ErrNotExist]) instead of creating an empty one, for tools that
	// inspect or maintain an existing store: a mistyped path must not look like an
	// empty store. Defaults to false: Open creates the file.
	MustExist bool
}

func (c Config) withDefaults() (Config, error) {
	if c.BusyTimeout < 0 {
		return c, fmt.Errorf("sqlite: Config.BusyTimeout must not be negative, got %s", c.BusyTimeout)
	}
	if c.MaxOpenConns < 0 {
		return c, fmt.Errorf("sqlite: Config.MaxOpenConns must not be negative, got %d", c.MaxOpenConns)
	}
	if err := c.Cleaner.Validate(); err != nil {
		return c, fmt.Errorf("sqlite: Config.Cleaner: %w", err)
	}
	if c.Cleaner.BatchSize == 0 {
		c.Cleaner.BatchSize = DefaultCleanerBatchSize
	}
	if c.Cleaner.Logger == nil && c.Logger != nil {
		c.Cleaner.Logger = c.Logger
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = DefaultBusyTimeout
	}
	if c.MaxOpenConns == 0 {
		c.MaxOpenConns = DefaultMaxOpenConns
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c, nil
}

// Store is the SQLite [idemstore.Store]. It is safe for concurrent use. Create it with
// [Open], call [Store.Migrate] once per process (or run `idem migrate`), and
// [Store.Close] it when done.
type Store struct {
	db *sql.DB
	// claimDB writes claims with synchronous=NORMAL (one connection: writes are
	// queued in process anyway); it is db itself with Config.SynchronousClaim.
	claimDB *sql.DB
	logger  *slog.Logger
	// writeSem queues this process's write transactions (capacity 1). It saves
	// SQLite's busy polling; SQLite's own lock keeps them correct.
	writeSem chan struct{}
	// tx runs the SPEC §7 helpers on db, in this process's write turn.
	tx *sqlstore.Tx
	// cleaner deletes expired records until stopCleaner (Config.Cleaner); nil with
	// Config.DisableCleaner.
	cleaner     *idem.Cleaner
	stopCleaner func()
}

var _ idemstore.Store = (*Store)(nil)

// Open opens the SQLite database at dsnOrPath, creating it when missing unless
// Config.MustExist, and checks that it can be used. dsnOrPath is a file path ("idem.db", "/var/lib/app/idem.db"), the
// same with a "sqlite:" prefix, or a "file:" URI; the store adds its own connection
// settings (WAL, busy_timeout, foreign_keys, synchronous=FULL, BEGIN IMMEDIATE) to it.
// The directory must exist. In-memory databases (":memory:", "file::memory:…",
// mode=memory, vfs=memdb, in any case) and SQLite's temporary ones (an empty URI path)
// are refused: every pooled connection would see a database of its own, gone when it
// closes.
//
// Open does not create the store's tables; call [Store.Migrate]. It starts the
// store's cleaner (Config.Cleaner), which deletes expired records in the background
// until [Store.Close], unless Config.DisableCleaner.
func Open(ctx context.Context, dsnOrPath string, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	db, err := openPool(dsnOrPath, cfg.BusyTimeout, "FULL", cfg.MaxOpenConns)
	if err != nil {
		return nil, err
	}
	if cfg.MustExist {
		if _, err := os.Stat(databaseFile(strings.TrimPrefix(dsnOrPath, "sqlite:"))); err != nil {
			_ = db.Close()
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("sqlite: open %q: the database %w", dsnOrPath, fs.ErrNotExist)
			}
			return nil, fmt.Errorf("sqlite: open %q: %w", dsnOrPath, err)
		}
	}
	s := &Store{db: db, claimDB: db, logger: cfg.Logger, writeSem: make(chan struct{}, 1)}
	s.tx = s.txHelpers()
	// The first connection creates the file and switches it to WAL, which needs the
	// write lock: retry like any other contention.
	if err := s.retryBusy(ctx, "open", func() error { return s.ping(ctx) }); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %q: %w", dsnOrPath, err)
	}
	if !cfg.SynchronousClaim {
		if s.claimDB, err = openPool(dsnOrPath, cfg.BusyTimeout, "NORMAL", 1); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	if !cfg.DisableCleaner {
		s.cleaner = idem.NewCleaner(s, cfg.Cleaner)
		s.stopCleaner = s.cleaner.Start()
	}
	return s, nil
}

// openPool opens a pool of connections to the file with the store's settings and
// the given synchronous level.
func openPool(dsnOrPath string, busyTimeout time.Duration, synchronous string, conns int) (*sql.DB, error) {
	dsn, err := buildDSN(dsnOrPath, busyTimeout, synchronous)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %q: %w", dsnOrPath, err)
	}
	db.SetMaxOpenConns(conns)
	// Keep every connection: opening one runs its PRAGMAs again.
	db.SetMaxIdleConns(conns)
	return db, nil
}

// buildDSN turns a path or "file:" URI into a DSN carrying the store's per-connection
// settings.
func buildDSN(dsnOrPath string, busyTimeout time.Duration, synchronous string) (string, error) {
	name := strings.TrimPrefix(dsnOrPath, "sqlite:")
	if name == "" {
		return "", errors.New("sqlite: empty database path")
	}
	if inMemory(name) {
		return "", fmt.Errorf("sqlite: %q: in-memory and temporary databases are refused: each pooled connection "+
			"would see a database of its own that dies with it, so records would be neither durable nor shared "+
			"between connections or processes; use a file, such as one in t.TempDir()", dsnOrPath)
	}
	q := url.Values{}
	// modernc.org/sqlite runs busy_timeout first whatever the order, so that the
	// others wait for locks too.
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(busyTimeout.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous("+synchronous+")")
	q.Set("_txlock", "immediate")
	// Report open errors with their own message, not a stale one (modernc #230).
	q.Set("_error_rc", "1")
	params := q.Encode()

	if strings.HasPrefix(name, "file:") {
		sep := "?"
		if strings.Contains(name, "?") {
			sep = "&"
		}
		return name + sep + params, nil
	}
	if strings.Contains(name, "?") {
		// The driver would cut a plain path at '?'.
		return "", fmt.Errorf("sqlite: path %q contains '?': use a file: URI for parameters", dsnOrPath)
	}
	dir := filepath.Dir(name)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("sqlite: open %q: directory %q does not exist", dsnOrPath, dir)
	}
	return name + "?" + params, nil
}

// inMemory reports whether name (a path or a "file:" URI) names a database that SQLite
// keeps in memory or in a temporary file private to one connection: ":memory:", a URI
// whose path is ":memory:" or empty, or one with mode=memory or vfs=memdb. It matches
// in any case and after %-decoding, as SQLite decodes URIs, so that no spelling slips
// through: one that SQLite would take for a file name instead (":MEMORY:") is a
// mistake too.
func inMemory(name string) bool {
	if strings.EqualFold(name, ":memory:") {
		return true
	}
	if len(name) < len("file:") || !strings.EqualFold(name[:len("file:")], "file:") {
		return false
	}
	path, query := uriParts(name)
	if path == "" || strings.EqualFold(path, ":memory:") {
		return true
	}
	for param := range strings.SplitSeq(query, "&") {
		k, v, _ := strings.Cut(param, "=")
		k, v = uriUnescape(k), uriUnescape(v)
		if strings.EqualFold(k, "mode") && strings.EqualFold(v, "memory") ||
			strings.EqualFold(k, "vfs") && strings.EqualFold(v, "memdb") {
			return true
		}
	}
	return false
}

// uriParts splits a "file:" URI into its path, %-decoded, and its query.
func uriParts(uri string) (path, query string) {
	rest, _, _ := strings.Cut(uri[len("file:"):], "#")
	path, query, _ = strings.Cut(rest, "?")
	if authority, ok := strings.CutPrefix(path, "//"); ok {
		_, path, _ = strings.Cut(authority, "/")
		path = "/" + path
	}
	return uriUnescape(path), query
}

// databaseFile is the file that name (a path or a "file:" URI) names.
func databaseFile(name string) string {
	if len(name) >= len("file:") && strings.EqualFold(name[:len("file:")], "file:") {
		path, _ := uriParts(name)
		return path
	}
	return name
}

// uriUnescape decodes %-escapes as SQLite does in a URI, leaving '+' alone; a
// malformed escape leaves s as it is.
func uriUnescape(s string) string {
	if d, err := url.PathUnescape(s); err == nil {
		return d
	}
	return s
}

// DB returns the store's connection pool. The application may keep its own tables in
// the same file and use them through it; to commit its writes together with a
// record's completion, it uses [Store.InTx]. Transactions begun directly on it are
// BEGIN IMMEDIATE too and wait up to [Config].BusyTimeout for the write lock, but are
// neither queued with the store's writes nor retried; InTx (with or without the
// middleware) does both.
func (s *Store) DB() *sql.DB { return s.db }

// Cleaner returns the store's background cleaner (Config.Cleaner), or nil when
// Config.DisableCleaner: its [idem.Cleaner.Passes] tells how many records each pass
// deleted.
func (s *Store) Cleaner() *idem.Cleaner { return s.cleaner }

// Close stops the store's cleaner and closes the connection pool.
func (s *Store) Close() error {
	if s.stopCleaner != nil {
		s.stopCleaner()
	}
	if s.claimDB != s.db {
		_ = s.claimDB.Close()
	}
	return s.db.Close()
}

// Ping implements [idemstore.Store.Ping]: it reads the database file's schema page.
func (s *Store) Ping(ctx context.Context) error {
	return interpretError(s.retryBusy(ctx, "ping", func() error { return s.ping(ctx) }))
}

func (s *Store) ping(ctx context.Context) error {
	var n int
	return s.db.QueryRowContext(ctx, queryPing).Scan(&n)
}

// Capabilities implements [idemstore.Store.Capabilities]: SQLite offers the §7 helper,
// needs batched cleanup, serves any number of processes on one host, and keeps
// recovery points (SPEC §13, [Step]).
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Transactions: true, BatchedCleanup: true, MultiProcess: true, RecoveryPoints: true}
}
