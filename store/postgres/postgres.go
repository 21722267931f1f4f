package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// DefaultMaxConns is the pool size [Open] uses when neither Config.MaxConns nor the
// URL's pool_max_conns sets one.
const DefaultMaxConns = 32

// Config configures a [Store]. The zero value is ready to use.
type Config struct {
	// Schema is the schema holding everything Migrate creates: the idem_records and
	// idem_migrations tables, their indexes, and the functions idem_fence, idem_claim,
	// idem_claim_v2, idem_claim_v3 and idem_stop (so a schema of idem's own is removed
	// whole with DROP SCHEMA … CASCADE). Migrate creates it when it does not exist. It
	// names idem's objects only: the connection's search_path is left as it is, so the
	// application's own statements (in Step, InTx, Respond) find its tables as they
	// always do, and name a schema themselves where they need one. Defaults to "", which
	// means the connection's search_path (normally public).
	Schema string

	// MaxConns is the size of the pool that [Open] creates; [NewFromPool] ignores it.
	// Defaults to DefaultMaxConns, unless the URL sets pool_max_conns.
	MaxConns int

	// AsynchronousClaim commits a new key's claim with synchronous_commit off, without
	// waiting for the WAL flush. A crash of the database may then lose the last claims
	// but never a completion or an application's write, because the completion's own
	// synchronous commit flushes the WAL that holds its claim (see "Durable claims" in
	// the package doc). The cost: a claim lost while its holder lives lets a retry run
	// the holder's work outside the database (a card processor call) a second time.
	// Measured here it saved little: POST /v1/charges 0.389× of plain with every claim
	// flushed, 0.394× with this (go test ./internal/payments -run '^$' -bench Ratio
	// -benchtime 1x, 2026-12-02; the cost of a new key is CPU, not the flush's wait), so
	// it is opt-in. Defaults to false: every claim is flushed.
	AsynchronousClaim bool

	// ClaimLockTimeout bounds how long a [Store.Respond] transaction that claims its
	// key (RouteOptions.ClaimInHandler) waits for a concurrent, uncommitted claim of the
	// same key (whose advisory lock it holds); the duplicate then answers 409
	// request_in_progress. The claim's insert waits for any other lock (the table's
	// extension lock on a database slow with I/O) up to 5 s, so that a fresh key is not
	// answered 409 for a slow disk. It must not be negative. Defaults to
	// [DefaultClaimLockTimeout].
	ClaimLockTimeout time.Duration

	// Logger receives the store's rare log lines (takeovers, retried statements,
	// migrations). Keys are never logged in full. Defaults to a logger that discards
	// everything.
	Logger *slog.Logger

	// Cleaner configures the cleaner that [Open] and [NewFromPool] start and
	// [Store.Close] stops: it deletes expired records in bounded batches in the
	// background (SPEC §8), its first pass one jittered Cleaner.Interval after the
	// start ([idem.Cleaner.Start]); the cleaners of several processes skip each other's
	// rows. Cleaner.Retention keeps records that long after they expire, for audits;
	// its warnings go to Cleaner.Logger, else to Logger when set, else to
	// slog.Default. Defaults to the zero [idem.CleanerConfig]: a pass every minute,
	// batches of 1000, no retention.
	Cleaner idem.CleanerConfig

	// DisableCleaner starts no cleaner, for a process that opens the store for a
	// moment (a migration, an admin tool such as `idem keys`) or whose expired records
	// are deleted elsewhere (another process's cleaner, `idem purge` from cron). An
	// expired record counts as absent at once, but without any cleaner it stays in the
	// table forever. Defaults to false.
	DisableCleaner bool
}

func (c Config) validate() error {
	if c.ClaimLockTimeout < 0 {
		return fmt.Errorf("postgres: Config.ClaimLockTimeout must not be negative, got %v", c.ClaimLockTimeout)
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("postgres: Config.MaxConns must not be negative, got %d", c.MaxConns)
	}
	if strings.ContainsRune(c.Schema, 0) {
		return errors.New("postgres: Config.Schema must not contain a NUL byte")
	}
	if err := c.Cleaner.Validate(); err != nil {
		return fmt.Errorf("postgres: Config.Cleaner: %w", err)
	}
	return nil
}

// Store is an [idemstore.Store] kept in PostgreSQL. It is safe for concurrent use by any
// number of goroutines and processes.
type Store struct {
	pool    *pgxpool.Pool
	ownPool bool
	schema  string
	q       *queries
	logger  *slog.Logger
	// asynchronousClaim is Config.AsynchronousClaim.
	asynchronousClaim bool
	// claimLockTimeout is Config.ClaimLockTimeout with its default.
	claimLockTimeout time.Duration
	// cleaner deletes expired records until stopCleaner (Config.Cleaner); nil with
	// Config.DisableCleaner.
	cleaner     *idem.Cleaner
	stopCleaner func()
	// walk is where the cleaner's walk of the table stands (RecordDeleteExpired).
	walk walk
	// durability is what the store knows of its sessions' synchronous_commit
	// (durability.go).
	durability durability
	// sqlDB is DB's *sql.DB on the pool, made once on first use (sqltx.go).
	sqlOnce sync.Once
	sqlDB   *sql.DB
}

var _ idemstore.Store = (*Store)(nil)

// Open creates a pool for the PostgreSQL database at url (a postgres:// URL or a
// key=value connection string, as pgx accepts) and returns a store using it. It does
// not connect: a database that is down makes requests fail with 503 until it returns,
// rather than failing Open. Call [Store.Migrate] before first use. It starts the
// store's cleaner (Config.Cleaner), which deletes expired records in the background
// until [Store.Close], unless Config.DisableCleaner. The pool is configured by
// [ConfigurePool] (its WARN on Config.Logger, else slog.Default()): behind a
// connection pooler that keeps no prepared statements, found at any time, it leaves
// pgx's default exec mode for one that works there, unless url names one.
func Open(ctx context.Context, url string, cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx redacts the password from the error it returns.
		return nil, fmt.Errorf("postgres: invalid database URL: %w", err)
	}
	switch {
	case cfg.MaxConns > 0:
		pcfg.MaxConns = int32(cfg.MaxConns)
	case !strings.Contains(url, "pool_max_conns"):
		pcfg.MaxConns = DefaultMaxConns
	}
	ConfigurePool(pcfg, cmp.Or(cfg.Logger, slog.Default()))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: creating pool: %w", err)
	}
	s, err := NewFromPool(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// NewFromPool returns a store using a pool the application already has, so that the
// application's transactions and the idempotency records share one pool (SPEC §7).
// Config.MaxConns is ignored, and [Store.Close] leaves the pool open. Like Open, it
// starts the store's cleaner unless Config.DisableCleaner. Configure the pool with
// [ConfigurePool] before creating it, so that a connection pooler put in front of
// PostgreSQL does not fail its statements (Migrate logs a WARN when it finds one in
// front of a pool left in pgx's default mode without it).
func NewFromPool(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: NewFromPool: pool is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		pool:   pool,
		schema: cfg.Schema,
		q:      newQueries(cfg.Schema),
		logger: logger,

		asynchronousClaim: cfg.AsynchronousClaim,
		claimLockTimeout:  cmp.Or(cfg.ClaimLockTimeout, DefaultClaimLockTimeout),
	}
	s.durability.origin = time.Now()
	if !cfg.DisableCleaner {
		ccfg := cfg.Cleaner
		if ccfg.Logger == nil && cfg.Logger != nil {
			ccfg.Logger = cfg.Logger
		}
		s.cleaner = idem.NewCleaner(s, ccfg)
		s.stopCleaner = s.cleaner.Start()
	}
	return s, nil
}

// Pool returns the store's pool, for the application's own queries.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Cleaner returns the store's background cleaner (Config.Cleaner), or nil when
// Config.DisableCleaner: its [idem.Cleaner.Passes] tells how many records each pass
// deleted.
func (s *Store) Cleaner() *idem.Cleaner { return s.cleaner }

// Close stops the store's cleaner and closes [Store.DB], then closes the pool when
// [Open] created it; a pool given to [NewFromPool] belongs to the application, which
// closes it itself.
func (s *Store) Close() {
	if s.stopCleaner != nil {
		s.stopCleaner()
	}
	s.sqlOnce.Do(func() {}) // no DB made after Close
	if s.sqlDB != nil {
		_ = s.sqlDB.Close()
	}
	if s.ownPool {
		s.pool.Close()
	}
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return interpretError(s.pool.Ping(ctx))
}

// Capabilities reports that this store offers the §7 transaction helper, needs the
// cleaner, and may be shared by any number of processes.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Transactions: true, BatchedCleanup: true, MultiProcess: true, RecoveryPoints: true}
}
