package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A pool of pgx's default exec mode, cache_statement, prepares each statement by name
// once per connection. Behind a transaction pooler that keeps no prepared statement
// (PgBouncer before 1.21, or with max_prepared_statements = 0) the next transaction
// of that connection may run on another server connection, where the name does not
// exist (26000) or is another client's already (42P05): every request fails, for as
// long as the process runs. A pool that ConfigurePool configured finds such a pooler
// and switches to cache_describe, which keeps nothing on the server (see "Poolers and
// exec modes" in the package doc).

// SwitchedExecMode is the exec mode that a pool configured by [ConfigurePool] switches
// to behind a connection pooler that keeps no prepared statements: each statement's
// description is cached on the client, its text sent with every execution, and
// nothing is kept on the server connection.
const SwitchedExecMode = pgx.QueryExecModeCacheDescribe

// execModeKey is the key of a connection's CustomData that holds the exec mode it
// was opened in (a pgx.QueryExecMode), set when a configured pool opens it.
const execModeKey = "idem.postgres.execMode"

// ConfigurePool makes a pool that the application creates itself (for [NewFromPool],
// or for its own tables beside the store) find a connection pooler that keeps no
// prepared statements between it and PostgreSQL, and then run in [SwitchedExecMode]
// instead of pgx's default, cache_statement, which fails behind one; [Open] configures
// its own pool so. Call it on the configuration before pgxpool.NewWithConfig:
//
//	cfg, err := pgxpool.ParseConfig(url)
//	...
//	postgres.ConfigurePool(cfg, logger)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// Each new connection, until the pool has switched, runs one probe (one round trip,
// pipelined): the server process's id, which a pooler answers for another process
// than the one whose id the connection was given, and whether a statement it prepared
// under a name of its own is known to the server under that name (a pooler that keeps
// prepared statements, PgBouncer 1.21 or later with max_prepared_statements > 0,
// renames it). A pooler that passes prepared statements through as they are, and a
// server that loses one of the connection's statements (SQLSTATE 26000 or 42P05 on a
// statement of pgx's cache: a pooler that the probe did not see), switch the pool: new
// connections open in SwitchedExecMode, and those opened before are closed when they
// are next acquired (a connection in use finishes its work first), so a pooler put in
// front of a running service is found on the first connection made through it.
// The switch is logged once, as a WARN on logger (nil: slog.Default()) that names the
// mode, its cost and the settings that avoid it, and lasts as long as the pool.
//
// A pool whose URL names default_query_exec_mode, or whose configuration sets another
// mode than pgx's default, is left as it is: the mode named is obeyed, and
// ConfigurePool changes nothing. A pooler in session mode looks like one in
// transaction mode from the client; name default_query_exec_mode=cache_statement there
// to keep pgx's default. The hooks that cfg has already (BeforeConnect, AfterConnect,
// PrepareConn or BeforeAcquire, OnPgError) still run; set none after ConfigurePool
// without calling the one it set. (It sets no AfterRelease, which would make pgxpool
// release every connection on a goroutine of its own.)
func ConfigurePool(cfg *pgxpool.Config, logger *slog.Logger) {
	configurePool(cfg, logger, true)
}

// configurePool is ConfigurePool; without probe, only a lost statement switches the
// pool (a pooler that passes the server's process id on, which the tests stand in for).
func configurePool(cfg *pgxpool.Config, logger *slog.Logger, probe bool) {
	if cfg == nil || cfg.ConnConfig == nil || execModeNamed(cfg.ConnConfig) {
		return
	}
	if logger == nil {
		logger = slog.Default()
	}
	w := &poolerWatch{logger: logger, probe: probe}

	beforeConnect := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if beforeConnect != nil {
			if err := beforeConnect(ctx, cc); err != nil {
				return err
			}
		}
		if w.switched.Load() && cc.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
			cc.DefaultQueryExecMode = SwitchedExecMode
			if cc.DescriptionCacheCapacity <= 0 { // description_cache_capacity=0, unused until now
				cc.DescriptionCacheCapacity = 512 // pgx's default
			}
		}
		return nil
	}

	afterConnect := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if err := w.watch(ctx, conn); err != nil {
			return err
		}
		if w.stale(conn.PgConn()) {
			return nil // closed before anyone uses it: the application's hook need not run
		}
		if afterConnect != nil {
			return afterConnect(ctx, conn)
		}
		return nil
	}

	prepareConn := cfg.PrepareConn
	if prepareConn == nil && cfg.BeforeAcquire != nil {
		beforeAcquire := cfg.BeforeAcquire
		prepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) { return beforeAcquire(ctx, conn), nil }
	}
	cfg.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		if w.stale(conn.PgConn()) {
			return false, nil // destroyed; the pool acquires another
		}
		if prepareConn != nil {
			return prepareConn(ctx, conn)
		}
		return true, nil
	}

	onPgError := cfg.ConnConfig.OnPgError
	cfg.ConnConfig.OnPgError = func(pc *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if lostCachedStatement(pgErr) && openedIn(pc) == pgx.QueryExecModeCacheStatement {
			w.switchMode(context.Background(), "the server lost a prepared statement of the connection's (SQLSTATE "+pgErr.Code+")")
		}
		if onPgError != nil {
			return onPgError(pc, pgErr)
		}
		return !strings.EqualFold(pgErr.Severity, "FATAL") // pgconn's own default
	}
}

// poolerWatch is the state of a pool that ConfigurePool configured.
type poolerWatch struct {
	logger *slog.Logger
	// probe runs probePooler on each new connection until the pool switched.
	probe bool
	// switched: new connections open in SwitchedExecMode, and those opened in
	// cache_statement are closed.
	switched atomic.Bool
	// keepsLogged: the INFO about a pooler that keeps prepared statements was logged.
	keepsLogged atomic.Bool
}

// watch records the mode conn was opened in and, while the pool runs
// cache_statement, probes what stands between it and PostgreSQL. An error means the
// connection failed (the pool closes it, as a failure to connect); a probe that the
// server refused switches the pool.
func (w *poolerWatch) watch(ctx context.Context, conn *pgx.Conn) error {
	mode := conn.Config().DefaultQueryExecMode
	conn.PgConn().CustomData()[execModeKey] = mode
	if !w.probe || mode != pgx.QueryExecModeCacheStatement || w.switched.Load() {
		return nil
	}
	pooled, keeps, err := probePooler(ctx, conn.PgConn())
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		// Something in between refused a named statement, or the probe: switch to the
		// mode that works everywhere rather than fail every connection (this one,
		// opened in cache_statement, is closed before anyone uses it).
		w.switchMode(ctx, "the probe for a connection pooler failed (SQLSTATE "+pgErr.Code+")")
		return nil
	case err != nil:
		return fmt.Errorf("postgres: probing for a connection pooler: %w", err)
	}
	switch {
	case pooled && !keeps:
		w.switchMode(ctx, "the server process that answers is not the connection's, and the server keeps "+
			"a statement prepared on the connection under the connection's name: a pooler that passes prepared statements through")
	case pooled && w.keepsLogged.CompareAndSwap(false, true):
		w.logger.InfoContext(ctx, "postgres: a connection pooler that keeps prepared statements stands between idem and PostgreSQL; "+
			"default_query_exec_mode stays cache_statement", "mode", execModeName(pgx.QueryExecModeCacheStatement))
	}
	return nil
}

// stale reports whether pc was opened in cache_statement and the pool has switched.
func (w *poolerWatch) stale(pc *pgconn.PgConn) bool {
	return w.switched.Load() && openedIn(pc) == pgx.QueryExecModeCacheStatement
}

// switchMode switches the pool to SwitchedExecMode, once, and logs it.
func (w *poolerWatch) switchMode(ctx context.Context, signal string) {
	if !w.switched.CompareAndSwap(false, true) {
		return
	}
	w.logger.WarnContext(ctx, switchWarning, "mode", execModeName(SwitchedExecMode),
		"was", execModeName(pgx.QueryExecModeCacheStatement), "signal", signal)
}

// switchWarning is the WARN of a pool that switched its exec mode: the mode, its
// cost, and what avoids it. The cost is measured in docs/benchmarks.md ("A pooler
// found at run time"): the round trips are cache_statement's
// (TestRoundTripsInEachExecMode counts a switched pool's), PostgreSQL's CPU per new
// key 1.9-2.4 times as much.
const switchWarning = "postgres: a connection pooler that keeps no prepared statements stands between idem and PostgreSQL " +
	"(PgBouncer in transaction mode before 1.21, or max_prepared_statements = 0): new connections run " +
	"default_query_exec_mode=cache_describe instead of cache_statement. It costs no round trip more per request, " +
	"but PostgreSQL parses and plans every statement afresh: about twice its CPU per new key (docs/benchmarks.md, " +
	"\"A pooler found at run time\"). To avoid it, let the pooler keep prepared " +
	"statements (PgBouncer 1.21 or later with max_prepared_statements > 0), or connect without it; to keep this mode " +
	"and silence this line, name default_query_exec_mode=cache_describe in the database URL (cache_statement for " +
	"a pooler in session mode)"

// openedIn is the exec mode pc was opened in by a configured pool, or -1 (none) for
// a connection that no configured pool opened.
func openedIn(pc *pgconn.PgConn) pgx.QueryExecMode {
	if m, ok := pc.CustomData()[execModeKey].(pgx.QueryExecMode); ok {
		return m
	}
	return -1
}

// probeSQL answers the server process's id and whether the server knows the
// statement named $1 under that name. It is itself the statement so named.
const probeSQL = `SELECT pg_backend_pid(), EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE name = $1)`

// probePooler asks, in one pipelined round trip that leaves nothing behind on the
// server connection, whether a pooler stands between pc and PostgreSQL (the server
// process that answers is not the one whose id pc was given at startup: a pooler
// gives its clients ids of its own, which is how it routes their cancel requests) and
// whether it keeps prepared statements: the probe prepares itself under a random
// name, runs, and closes; a pooler that keeps prepared statements across server
// connections prepares it on the server under a name of its own (PgBouncer 1.21:
// PGBOUNCER_n), one that passes it through leaves the name as it is. Everything runs
// before one Sync, so on one server connection.
func probePooler(ctx context.Context, pc *pgconn.PgConn) (pooled, keeps bool, err error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "idem_probe_" + hex.EncodeToString(b[:])
	p := pc.StartPipeline(ctx)
	p.SendPrepare(name, probeSQL, []uint32{pgtype.TextOID})
	p.SendQueryPrepared(name, [][]byte{[]byte(name)}, nil, nil)
	p.SendDeallocate(name)
	if err := p.Sync(); err != nil {
		_ = p.Close()
		return false, false, err
	}
	var row [][]byte
	for i := 0; i < 4; i++ {
		res, err := p.GetResults()
		if err != nil {
			_ = p.Close()
			return false, false, err
		}
		if rr, ok := res.(*pgconn.ResultReader); ok {
			r := rr.Read()
			if r.Err != nil {
				_ = p.Close()
				return false, false, r.Err
			}
			if len(r.Rows) == 1 && len(r.Rows[0]) == 2 {
				row = [][]byte{append([]byte(nil), r.Rows[0][0]...), append([]byte(nil), r.Rows[0][1]...)}
			}
		}
	}
	if err := p.Close(); err != nil {
		return false, false, err
	}
	if row == nil {
		return false, false, errors.New("the probe answered no row")
	}
	pid, err := strconv.ParseUint(string(row[0]), 10, 32)
	if err != nil {
		return false, false, fmt.Errorf("the probe answered pid %q", row[0])
	}
	return uint32(pid) != pc.PID(), string(row[1]) != "t", nil
}

// lostCachedStatement reports a lost statement (lostStatement) of pgx's statement
// cache, whose statements pgx names stmtcache_…: the signal of a pooler in between
// rather than of an application's own PREPARE or EXECUTE.
func lostCachedStatement(e *pgconn.PgError) bool {
	return (e.Code == "26000" || e.Code == "42P05") && strings.Contains(e.Message, `"stmtcache_`)
}

// execModeName is m as default_query_exec_mode names it.
func execModeName(m pgx.QueryExecMode) string {
	switch m {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe"
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec"
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return m.String()
}

// dsnExecMode finds default_query_exec_mode among the settings of a key=value
// connection string.
var dsnExecMode = regexp.MustCompile(`(^|\s)default_query_exec_mode\s*=`)

// execModeNamed reports whether the pool's exec mode was chosen: its connection
// string names default_query_exec_mode, or its configuration holds another mode
// than pgx's default (set in code).
func execModeNamed(cc *pgx.ConnConfig) bool {
	if cc.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return true
	}
	s := cc.ConnString()
	if lower := strings.ToLower(s); strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://") {
		_, query, _ := strings.Cut(s, "?")
		query, _, _ = strings.Cut(query, "#")
		q, _ := url.ParseQuery(query)
		return q.Has("default_query_exec_mode")
	}
	return dsnExecMode.MatchString(s)
}
