package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
)

// What a failover of the store's PostgreSQL may lose ([Replication.Mode]).
const (
	// ReplicationSynchronous: synchronous_standby_names names the standbys that each
	// commit waits for. A failover to one of them loses nothing that idem committed
	// (idem's writes commit at synchronous_commit on or stronger, whatever the session
	// says). When none of them streams, every commit waits until one does.
	ReplicationSynchronous = "synchronous"
	// ReplicationAsynchronous: standbys stream, and no commit waits for them. A
	// failover to one may lose the last commits: a request whose claim was lost runs
	// again, and a card processor charges twice unless it deduplicates by a key that
	// survives the loss.
	ReplicationAsynchronous = "asynchronous"
	// ReplicationNone: no standby streams from this server. A managed service that
	// replicates below PostgreSQL (RDS Multi-AZ, Aurora, Cloud SQL's high
	// availability) is not seen here: what its failover may lose is in its own
	// documentation.
	ReplicationNone = "none"
	// ReplicationUnknown: synchronous_standby_names is set and standbys stream, but
	// the role may not see which of them are synchronous (pg_stat_replication's
	// sync_state needs pg_monitor or pg_read_all_stats).
	ReplicationUnknown = "unknown"
)

// Replication is what the store's PostgreSQL says about its standbys and its
// settings: what a failover may lose ([Store.Replication]).
type Replication struct {
	// Mode is ReplicationSynchronous, ReplicationAsynchronous, ReplicationNone or
	// ReplicationUnknown.
	Mode string
	// Standbys is how many standbys stream from the server.
	Standbys int
	// SynchronousStandbys is how many of them are synchronous (sync or quorum), or -1
	// when the role may not see it.
	SynchronousStandbys int
	// SynchronousStandbyNames is the server's synchronous_standby_names.
	SynchronousStandbyNames string
	// SynchronousCommit is the synchronous_commit that the store's sessions start
	// with. idem's own writes commit at on when it says off or local
	// (Config.AsynchronousClaim's claims excepted), at the session's setting when it is
	// stronger.
	SynchronousCommit string
	// Pooler reports that a connection pooler stands between the store and
	// PostgreSQL: the server process that answered is not the one the connection
	// was opened with.
	Pooler bool

	// unconfigured: the connection that answered was not opened by a pool that
	// ConfigurePool configured.
	unconfigured bool
}

// Replication asks the store's PostgreSQL what a failover may lose, in one statement:
// its synchronous_standby_names and synchronous_commit, and which standbys stream
// (pg_stat_replication). A role without pg_monitor sees the standbys but not which are
// synchronous: the mode is then ReplicationUnknown, unless synchronous_standby_names
// is empty (every standby is asynchronous).
func (s *Store) Replication(ctx context.Context) (*Replication, error) {
	var (
		r                     Replication
		inRecovery            bool
		standbys, sync, blind int64
	)
	err := s.withRetry(ctx, "replication", func() error {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		var pid uint32
		err = conn.QueryRow(ctx, parsedQueries["Replication"]).Scan(&r.SynchronousStandbyNames, &r.SynchronousCommit,
			&inRecovery, &pid, &standbys, &sync, &blind)
		pc := conn.Conn().PgConn()
		r.Pooler = pid != pc.PID()
		r.unconfigured = openedIn(pc) < 0
		return err
	})
	if err != nil {
		return nil, interpretError(err)
	}
	r.Standbys, r.SynchronousStandbys = int(standbys), int(sync)
	named := strings.TrimSpace(r.SynchronousStandbyNames) != ""
	switch {
	case !named && standbys == 0:
		r.Mode = ReplicationNone
	case !named:
		r.Mode = ReplicationAsynchronous
		r.SynchronousStandbys = 0
	case blind > 0:
		r.Mode, r.SynchronousStandbys = ReplicationUnknown, -1
	default:
		r.Mode = ReplicationSynchronous
	}
	return &r, nil
}

// Warning is what an operator must know about r, or "": standbys that replicate
// asynchronously (what a failover may lose, and how to close it), or synchronous
// standbys named of which none streams (every commit waits).
func (r *Replication) Warning() string {
	switch {
	case r.Mode == ReplicationAsynchronous:
		return fmt.Sprintf("PostgreSQL streams to %d standby(s) asynchronously: a failover to one may lose the last commits, "+
			"and a request whose record was lost runs again (a card processor charges twice unless it deduplicates by a key "+
			"that survives the loss). To lose nothing, name the standbys in synchronous_standby_names, with synchronous_commit "+
			"on or remote_apply (idem raises off and local to on for its own writes)", r.Standbys)
	case r.Mode == ReplicationSynchronous && r.SynchronousStandbys == 0:
		return fmt.Sprintf("synchronous_standby_names is %q but no synchronous standby streams: every commit waits until one does",
			r.SynchronousStandbyNames)
	}
	return ""
}

// String is r in one line, as `idem migrate` prints it.
func (r *Replication) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replication %s", r.Mode)
	switch r.Mode {
	case ReplicationSynchronous:
		fmt.Fprintf(&b, " (%d of %d standbys synchronous, synchronous_standby_names %q)", r.SynchronousStandbys, r.Standbys, r.SynchronousStandbyNames)
	case ReplicationAsynchronous:
		fmt.Fprintf(&b, " (%d standbys, none synchronous)", r.Standbys)
	case ReplicationUnknown:
		fmt.Fprintf(&b, " (%d standbys; which are synchronous needs pg_monitor)", r.Standbys)
	case ReplicationNone:
		b.WriteString(" (no standby streams from this server)")
	}
	fmt.Fprintf(&b, ", synchronous_commit %s", r.SynchronousCommit)
	if r.SynchronousCommit == "off" || r.SynchronousCommit == "local" {
		b.WriteString(" (on for idem's writes)")
	}
	if r.Pooler {
		b.WriteString(", behind a connection pooler")
	}
	return b.String()
}

// logReplication logs, after a migration, what a failover of the database may lose:
// one INFO line, and one WARN when Replication.Warning says something.
func (s *Store) logReplication(ctx context.Context) {
	r, err := s.Replication(ctx)
	if err != nil {
		s.logger.WarnContext(ctx, "postgres: could not read the database's replication", "error", err)
		return
	}
	s.logger.InfoContext(ctx, "postgres: "+r.String(), "replication", r.Mode, "standbys", r.Standbys,
		"synchronous_standbys", r.SynchronousStandbys, "synchronous_commit", r.SynchronousCommit, "pooler", r.Pooler)
	if w := r.Warning(); w != "" {
		s.logger.WarnContext(ctx, "postgres: "+w, slog.String("replication", r.Mode))
	}
	if r.Pooler && r.unconfigured && !execModeNamed(s.pool.Config().ConnConfig) {
		s.logger.WarnContext(ctx, unconfiguredPoolWarning, "mode", execModeName(pgx.QueryExecModeCacheStatement))
	}
}

// unconfiguredPoolWarning is the WARN of Migrate behind a connection pooler when the
// store's pool, given to NewFromPool, runs pgx's default mode and was not configured
// by ConfigurePool: its statements fail if the pooler keeps no prepared statements.
const unconfiguredPoolWarning = "postgres: a connection pooler stands between idem and PostgreSQL, and the pool given to " +
	"postgres.NewFromPool runs pgx's default_query_exec_mode, cache_statement, without postgres.ConfigurePool: " +
	"if the pooler keeps no prepared statements (PgBouncer in transaction mode before 1.21, or max_prepared_statements = 0) " +
	"its statements fail. Configure the pool with postgres.ConfigurePool before creating it, or name a mode in the " +
	"database URL (default_query_exec_mode=cache_describe)"
