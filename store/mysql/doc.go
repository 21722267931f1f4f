// Package mysql is an [idemstore.Store] kept in MySQL or MariaDB (InnoDB), on
// github.com/go-sql-driver/mysql and database/sql, with the same guarantees as the
// PostgreSQL store: the §7 helpers ([Store.Respond], [Store.InTx], [Step] and the
// *sql.Tx helpers [Store.CompleteTx] and [Store.StepTx]) commit the application's
// writes and the idempotency record in one transaction; recovery points, listing and
// `idem keys` ([admin.Store]), the cleaner, fencing, lease takeover, unknown outcomes
// and sealed records all work, for any number of processes.
//
//	st, err := mysql.Open(ctx, "mysql://app:secret@db:3306/payments", mysql.Config{})
//	if err != nil { ... }
//	defer st.Close()
//	if err := st.Migrate(ctx); err != nil { ... }
//	mw := idem.New(idem.Config{Store: st})
//
// # Servers
//
// Tested: MariaDB 10.11 (every run of the suite, at REPEATABLE READ and READ
// COMMITTED). Expected to work, not tested here: MariaDB 10.6 and later, MySQL 8.0 and
// later; the SQL keeps to what both run (no CREATE INDEX IF NOT EXISTS, no RETURNING,
// CHECK constraints that MySQL before 8.0.16 parses and ignores). MySQL 5.7 lacks
// indexes on virtual columns of the form used here and is not supported.
//
// # How a claim holds
//
// A claim reads the key first, without a lock: a completed record, a mismatch or a live
// lease is the answer, so replays cost one SELECT by primary key. An absent key is
// claimed by one INSERT, and a duplicate key (1062) means another claim won: the claim
// reads again. Only a record that must change (expired, a lapsed lease to take over or
// to mark unknown) is locked with SELECT … FOR UPDATE, judged again under the lock and
// updated, fenced by the token it read. No step relies on gap locks or on a snapshot,
// so the claim holds at REPEATABLE READ (MySQL's default) and READ COMMITTED alike.
// Every completion, renewal, step and release is an UPDATE or DELETE fenced by the
// holder's token: no row matched is [idemstore.ErrLeaseLost].
//
// A duplicate that arrives while a [Store.Respond] transaction holds an uncommitted
// claim of its key waits for that transaction (InnoDB's row lock on the inserted key),
// then replays its response: Respond's transactions hold only the application's own
// writes, which are short. The wait is bounded by the request's context and by the
// server's innodb_lock_wait_timeout.
//
// # Errors
//
// Errors are normalised at the store's edge: a connection lost or refused, a server
// shutting down, read only or out of connections, and a Galera node not ready wrap
// [ErrUnavailable] (the middleware answers 503 and keeps the key as it was). A deadlock
// (1213) or lock wait timeout (1205) in one of the store's own transactions runs the
// transaction again, a few times, and then wraps ErrUnavailable; it is never "key
// reused". The application's function in InTx, Step or Respond runs once: a deadlock
// there is returned, and Respond, when it claimed the key itself, treats a deadlock or
// a Galera certification failure (1213 at COMMIT) as a lost race, answered by the
// usual claim, which reads the winner's record.
//
// # Durability
//
// [Open] reads innodb_flush_log_at_trx_commit, sync_binlog and log_bin and logs a WARN
// for each setting that can lose a committed claim or completion in a crash
// ([Durability.Warnings]): innodb_flush_log_at_trx_commit other than 1, and
// sync_binlog other than 1 with the binary log on. A lost claim lets a retry run its
// request's outside work (a card processor call) again; a lost completion runs the
// whole request again.
//
// # Connections and proxies
//
// The store sets no session variable and keeps no server-side prepared statement
// (interpolateParams): every statement stands alone, so a proxy that multiplexes
// connections, such as ProxySQL, may send each to another backend connection between
// transactions. The one exception is [Store.Migrate], which holds a named lock
// (GET_LOCK) on one connection for the length of the migration, so that processes
// starting at once migrate in turn; a proxy keeps such a connection to itself while
// the lock is held (ProxySQL disables multiplexing for it).
//
// # Galera
//
// On a MariaDB Galera cluster every node accepts claims. Two claims of one key on two
// nodes both insert locally; at COMMIT the cluster certifies one, and the other fails
// with 1213 (or is aborted by the winner's write as it arrives), which the store treats
// as the lost race it is: RecordClaim reads again after a pause, and Respond hands the
// request to the usual claim; either reads the winner's record and answers 409
// request_in_progress or its response, never a 5xx that releases the key. A node that
// crashes loses no commit the client was answered for: the others have it. Tested on a
// three-node cluster that the test starts (TestGaleraRunsEachKeyOnceAcrossNodesAndLosesNoCompletedRecord).
// A read on one node may not see a commit made on another a moment before: a client
// that retries through another node may get 409 request_in_progress (never a second
// execution) where one node would have replayed; wsrep_sync_wait=1 in the DSN closes
// that gap at the cost of a wait per read.
package mysql

import (
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

// Keep the doc's links resolvable.
var (
	_ admin.Store     = (*Store)(nil)
	_ idemstore.Store = (*Store)(nil)
)
