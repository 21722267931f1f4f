package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Defaults of [Config].
const (
	// DefaultMaxOpenConns bounds the connection pool.
	DefaultMaxOpenConns = 32
	// DefaultConnMaxLifetime is how long a pooled connection lives: less than the
	// server's wait_timeout (8 hours) and than most proxies' idle limits.
	DefaultConnMaxLifetime = 30 * time.Minute
)

// Config configures a [Store]. The zero value is ready to use.
type Config struct {
	// MaxOpenConns bounds the pool of connections to the server. A claim, a
	// completion and each of the application's transactions ([Store.InTx],
	// [Store.Respond], [Step]) use one at a time. It must not be negative. Defaults to
	// [DefaultMaxOpenConns].
	MaxOpenConns int

	// ConnMaxLifetime closes pooled connections older than this, so that a proxy or
	// the server's wait_timeout never closes one under the store first. It must not be
	// negative. Defaults to [DefaultConnMaxLifetime].
	ConnMaxLifetime time.Duration

	// Logger receives migrations (info), settings that can lose a committed claim
	// (warn) and contention retries (debug). Keys and bodies are never logged.
	// Defaults to a logger that discards everything.
	Logger *slog.Logger

	// Cleaner configures the cleaner that [Open] starts and [Store.Close] stops: it
	// deletes expired records in bounded batches in the background (SPEC §8), its
	// first pass one jittered Cleaner.Interval after Open ([idem.Cleaner.Start]).
	// Cleaner.Retention keeps records that long after they expire, for audits; its
	// warnings go to Cleaner.Logger, else to Logger when set, else to slog.Default.
	// Defaults to the zero [idem.CleanerConfig]: a pass every minute, batches of 1000,
	// no retention.
	Cleaner idem.CleanerConfig

	// DisableCleaner starts no cleaner, for a process that opens the store for a
	// moment (a migration, an admin tool such as `idem keys`) or whose expired records
	// are deleted elsewhere (another process's cleaner, `idem purge` from cron).
	// Defaults to false.
	DisableCleaner bool
}

func (c Config) withDefaults() (Config, error) {
	if c.MaxOpenConns < 0 {
		return c, fmt.Errorf("mysql: Config.MaxOpenConns must not be negative, got %d", c.MaxOpenConns)
	}
	if c.ConnMaxLifetime < 0 {
		return c, fmt.Errorf("mysql: Config.ConnMaxLifetime must not be negative, got %s", c.ConnMaxLifetime)
	}
	if err := c.Cleaner.Validate(); err != nil {
		return c, fmt.Errorf("mysql: Config.Cleaner: %w", err)
	}
	if c.Cleaner.Logger == nil && c.Logger != nil {
		c.Cleaner.Logger = c.Logger
	}
	if c.MaxOpenConns == 0 {
		c.MaxOpenConns = DefaultMaxOpenConns
	}
	if c.ConnMaxLifetime == 0 {
		c.ConnMaxLifetime = DefaultConnMaxLifetime
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Store is the MySQL and MariaDB [idemstore.Store]. It is safe for concurrent use by any
// number of goroutines and processes. Create it with [Open], call [Store.Migrate] once
// per process (or run `idem migrate`), and [Store.Close] it when done.
type Store struct {
	db     *sql.DB
	logger *slog.Logger
	// tx runs the SPEC §7 helpers on db.
	tx *sqlstore.Tx
	// cleaner deletes expired records until stopCleaner (Config.Cleaner); nil with
	// Config.DisableCleaner.
	cleaner     *idem.Cleaner
	stopCleaner func()
}

// Open opens a pool of connections to the MySQL or MariaDB database that dsn names,
// checks that the server answers, reads its durability settings (a WARN on
// Config.Logger for each that can lose a committed claim: [Durability]) and starts the
// store's cleaner unless Config.DisableCleaner. dsn is a URL,
// mysql://user:password@host:3306/database?param=value, or the driver's own form,
// user:password@tcp(host:3306)/database?param=value; its parameters are the driver's
// (tls, timeout, …).
//
// The store sets three of the driver's parameters whatever dsn says:
// clientFoundRows (a fenced UPDATE counts the row it matched, even when it changed no
// value), interpolateParams (a statement travels in one round trip, without a
// server-side prepared statement that a proxy would have to keep) and parseTime off
// (times are integers). It sets no session variable: nothing a proxy such as ProxySQL
// could lose between two statements.
//
// Open does not create the store's tables; call [Store.Migrate].
func Open(ctx context.Context, dsn string, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dc, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	connector, err := gomysql.NewConnector(dc)
	if err != nil {
		return nil, fmt.Errorf("mysql: %s: %w", Redact(dsn), err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxOpenConns)
	db.SetConnMaxLifetime(cfg.ConnMaxLifetime)
	s := &Store{db: db, logger: cfg.Logger}
	s.tx = s.txHelpers()
	d, err := s.Durability(ctx)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("mysql: open %s: %w", Redact(dsn), err)
	}
	for _, w := range d.Warnings() {
		s.logger.WarnContext(ctx, "mysql: "+w, "server", d.Version)
	}
	if !cfg.DisableCleaner {
		s.cleaner = idem.NewCleaner(s, cfg.Cleaner)
		s.stopCleaner = s.cleaner.Start()
	}
	return s, nil
}

// ParseDSN parses dsn as [Open] does, a mysql:// URL or the driver's DSN, and returns
// the driver's configuration with the store's parameters set (see Open). Errors never
// hold the password.
func ParseDSN(dsn string) (*gomysql.Config, error) {
	driverDSN := dsn
	if strings.HasPrefix(dsn, "mysql://") {
		var err error
		if driverDSN, err = urlToDSN(dsn); err != nil {
			return nil, err
		}
	}
	dc, err := gomysql.ParseDSN(driverDSN)
	if err != nil {
		return nil, fmt.Errorf("mysql: invalid DSN %s: %w", Redact(dsn), err)
	}
	dc.ClientFoundRows = true
	dc.InterpolateParams = true
	dc.ParseTime = false
	dc.MultiStatements = false
	return dc, nil
}

// urlToDSN turns mysql://user:password@host:port/db?params into the driver's
// user:password@tcp(host:port)/db?params.
func urlToDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("mysql: invalid URL %s", Redact(raw))
	}
	dc := gomysql.NewConfig()
	if u.User != nil {
		dc.User = u.User.Username()
		dc.Passwd, _ = u.User.Password()
	}
	if u.Host != "" {
		dc.Net, dc.Addr = "tcp", u.Host
		if u.Port() == "" {
			dc.Addr += ":3306"
		}
	}
	dc.DBName = strings.TrimPrefix(u.Path, "/")
	dsn := dc.FormatDSN()
	if u.RawQuery != "" {
		// The driver reads its parameters from the DSN's query, as the URL spells them.
		base, _, _ := strings.Cut(dsn, "?")
		dsn = base + "?" + u.RawQuery
	}
	return dsn, nil
}

// Redact returns dsn (a mysql:// URL or the driver's DSN) with its password replaced
// by "xxxxx", for logs and error messages.
func Redact(dsn string) string {
	if strings.HasPrefix(dsn, "mysql://") {
		if u, err := url.Parse(dsn); err == nil {
			return u.Redacted()
		}
		return "mysql://(unparsable URL)"
	}
	at := strings.LastIndex(dsn, "@")
	if at < 0 {
		return dsn
	}
	creds := dsn[:at]
	if user, _, ok := strings.Cut(creds, ":"); ok {
		return user + ":xxxxx" + dsn[at:]
	}
	return dsn
}

// DB returns the store's connection pool. The application may keep its own tables in
// the same database and use them through it; to commit its writes together with a
// record's completion, it uses [Store.Respond], [Store.InTx] or [Step].
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
	return s.db.Close()
}

// Ping implements [idemstore.Store.Ping].
func (s *Store) Ping(ctx context.Context) error {
	return interpretError(s.db.PingContext(ctx))
}

// Capabilities implements [idemstore.Store.Capabilities]: MySQL offers the §7
// helpers, needs batched cleanup, serves any number of processes and keeps recovery
// points (SPEC §13, [Step]).
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Transactions: true, BatchedCleanup: true, MultiProcess: true, RecoveryPoints: true}
}
