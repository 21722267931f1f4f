// Package postgres is the PostgreSQL store of idem, built on pgx v5 (SPEC §5, §7, §8,
// §14). Any number of processes on any number of hosts may share one database: every
// claim, takeover and fenced update is a single conditional statement, and every lease
// and expiry is decided by the database's own clock (clock_timestamp()), never by the
// hosts' clocks.
//
// Open a store from a URL, or wrap a pool the application already has, and create the
// tables once (Migrate is safe when several processes start at the same moment):
//
//	st, err := postgres.Open(ctx, "postgres://app@db/app", postgres.Config{})
//	...
//	if err := st.Migrate(ctx); err != nil { ... }
//	mw := idem.New(idem.Config{Store: st, ...})
//
// A new key costs one round trip to claim and one to complete (the claim's commit does
// not wait for the WAL flush, see Durable claims); a replay and an
// in-flight duplicate cost one; a takeover two (the full table is in the package's source, queries.go, and
// roundtrip_test.go counts each row on the wire).
// Statements run at READ COMMITTED and a replay writes nothing. A key the caller
// expects to be new (idemstore.ClaimParams.LikelyNew: a lease route that mostly sees
// new keys, or whose read of the key just found none) is claimed by a plain INSERT that
// answers only the store's time; a key that is there after all fails that insert
// (unique_violation) and is read by the usual claim statement: one round trip more for
// a retry that the route did not expect.
//
// [Store.Respond] and [Store.InTx] run a handler's own writes and the record's
// completion in one transaction (SPEC §7): either both commit or neither does, and the
// client never receives a response whose effects did not commit. Respond is the path
// of a handler whose writes all go to this database: its function queues them and
// returns the response, and on an idem.RouteOptions.ClaimInHandler route the claim, the
// writes and the completed record travel in one pipelined round trip (while the
// route's retries are frequent the middleware reads the key first, and answers a retry
// from that read before the handler runs). InTx is the
// lease path's, for a handler that calls something outside the database before it
// writes: its transaction's BEGIN travels with the first statement, and the fenced
// completion and COMMIT in one pipelined round trip; a lost lease raises SQLSTATE
// IDL01 inside the transaction so that the queued COMMIT is skipped. A ClaimInHandler transaction whose key is recorded already stops before the
// application's statements run (SQLSTATE IDL02, idem_stop, or unique_violation for a
// record committed since its snapshot): the server logs it as an ERROR
// (log_min_messages), and Respond claims the key the usual way.
//
// # Poolers and exec modes
//
// The store keeps no session state from one transaction to the next: no prepared
// statement of its own, no session SET (each setting it changes is the transaction's,
// set_config(…, true)), no session advisory lock (Migrate's and a ClaimInHandler
// claim's are the transaction's). Consecutive transactions may run on different server
// connections, so a transaction pooler may stand in between (PgBouncer in transaction
// mode, RDS Proxy, Supavisor). What pgx keeps on a connection is chosen by the URL's
// default_query_exec_mode, pgx's own parameter:
//
//   - cache_statement (pgx's default) prepares each statement by name once per
//     connection: behind a transaction pooler it needs one that keeps prepared
//     statements (PgBouncer 1.21 or later with max_prepared_statements > 0).
//   - cache_describe keeps each statement's description and sends its text with every
//     execution: the mode for a pooler that keeps no prepared statements, at the
//     default's round trips; the server parses and plans each statement afresh, which
//     for idem's statements costs PostgreSQL about twice the CPU per request.
//   - exec and simple_protocol need no description: their parameters travel as text.
//   - describe_exec describes each statement in one round trip and binds what it
//     described in the next, which a transaction pooler may have given another client:
//     Migrate refuses it behind a pooler ([ErrModeUnsafeBehindPooler]).
//
// A URL that names no mode need not say what stands in front of PostgreSQL, nor change
// when that does: [Open]'s pool, and one that [ConfigurePool] configured for
// [NewFromPool], find a pooler that keeps no prepared statements and leave pgx's
// default for cache_describe ([SwitchedExecMode]). Each new connection, until the pool
// has switched, runs one probe, pipelined in one round trip and leaving nothing on the
// server: the server process's id, which differs from the one the connection was given
// at startup when a pooler stands in between (a pooler hands its clients ids of its
// own, to route their cancel requests), and whether a statement the probe prepared
// under a random name is known to the server by that name (a pooler that keeps
// prepared statements renames it). A prepared statement of pgx's cache that the server
// lost (SQLSTATE 26000 or 42P05) switches the pool too, should a pooler hide from the
// probe. From the switch on, new connections open in cache_describe and those opened
// before are closed when they are next acquired, so a pooler put in front of a
// running service is found on the first connection made through it; the switch is
// logged once, a WARN that names the mode, its cost and the settings that avoid it. A
// statement that met a lost prepared statement did not run, and what provably did not
// run is run again on a connection in the new mode: an autocommit statement of the
// store (claims, completions, reads, the cleaner's and the admin tools'), a Respond
// transaction (the server ran nothing of its batch after the error), Migrate's
// transaction. An InTx or Step transaction is not: its function has run. A URL that
// names default_query_exec_mode is obeyed as it is: cache_statement there, behind a
// pooler that keeps no prepared statements, fails as the store being unavailable (503,
// nothing happened), with an error that says what to change. A pooler in session mode
// looks like one in transaction mode from the client: name cache_statement there to
// keep pgx's default.
//
// In every mode but describe_exec a request costs the round trips of the table in
// queries.go; describe_exec costs two for each statement (TestRoundTripsInEachExecMode,
// which counts a switched pool too); the probe costs each new connection one. The time
// each costs, straight and behind PgBouncer, is in docs/benchmarks.md. A pooler passes
// on few startup parameters (PgBouncer refuses a search_path in the URL): name the
// schema with Config.Schema.
//
// # database/sql
//
// Applications written against database/sql (sqlc's database/sql mode, sqlx, GORM)
// get the same guarantee through pgx's database/sql driver: [Store.DB] is a *sql.DB on
// the store's own pool; [Store.RespondSQL] is [Store.Respond] with a *sql.Tx on which
// the handler runs its statements, and [Store.InSQLTx] takes a *sql.Tx where InTx takes
// a pgx.Tx. database/sql sends one statement per round trip: it cannot pipeline the
// completion with COMMIT (InSQLTx: five round trips for a request with one INSERT,
// against InTx's three), nor the claim with the writes (RespondSQL on a ClaimInHandler
// route claims first, the usual way). [Store.CompleteSQLTx] completes a record in a
// transaction the application manages.
//
// # Durable claims
//
// Every write of a record commits durably whatever the role's or the session's
// synchronous_commit says: the statement that writes it raises the transaction's
// setting from off or local to on (set_config(…, true), in the statement itself: no
// round trip), and keeps a stronger one (remote_write, remote_apply) that the user set
// (TestRecordsCommitDurablyWhateverTheSessionSays). The transactions of InTx, Step and
// Respond, which hold a record's completion, step or claim, commit so with the
// application's writes in them. Where the sessions are at on or stronger already (the
// server's default), the raise would change nothing, so the store reads the setting
// from its pool when it first writes and every minute after, and while it finds on,
// remote_write or remote_apply it sends its statements without the raise, which saves
// PostgreSQL a few per cent of its time per request (issue 50). What that read cannot
// see is a session lowered on one pooled connection only (SET, not SET LOCAL, or an
// AfterConnect hook that lowers some connections): lower synchronous_commit for a
// role, a database or the server, or per transaction, not per pooled session.
//
// Every claim is flushed by default. With Config.AsynchronousClaim a new key's claim
// commits with synchronous_commit off: it returns without waiting for the WAL flush, saving one
// flush per request. This is safe because nothing of the operation can commit without
// the claim having reached disk first:
//
//   - The application's writes commit only in the transaction that holds the fenced
//     completion (SPEC §7), and that completion updates the claim row, which it must find
//     under the holder's token; without it the fence raises, and nothing commits.
//   - That transaction commits synchronously, and a synchronous commit flushes all the
//     WAL before its own commit record. The claim's commit record precedes it (the
//     completion found the claim's row, so the claim had committed), so once a
//     completion is durable, so is its claim.
//   - A crash can therefore lose only a claim whose operation has not committed. The
//     holder's completion then finds no row and rolls back, and the client gets 503 (the
//     client's retry executes once). A duplicate that saw the lost claim in flight got
//     409 request_in_progress, and its retry finds the key absent and executes: still
//     only one execution's writes commit, because the holder's completion can no longer
//     succeed. What the holder did outside the database (a call to a card processor)
//     happens again, as after a lapsed lease (SPEC §5.3). With durable claims (the
//     default) a database outage shorter than the lease costs no such re-execution:
//     the record stays in flight, duplicates get 409, and the holder completes once the
//     database returns. That, and a small measured gain, is why the option is opt-in.
//
// TestInTxRefusesTheCompletionOfALostClaim shows the fence refusing. Takeovers, expired
// records, renewals, releases and completions all stay synchronous.
//
// # Failover
//
// A commit is durable on the server that made it; whether it survives a failover to
// a standby depends on the replication, which the store reads ([Store.Replication]) and
// [Store.Migrate] logs: with a synchronous standby (synchronous_standby_names, and
// idem's writes at synchronous_commit on or stronger) a failover to it loses nothing
// idem committed; with asynchronous standbys it may lose the last commits, and Migrate
// logs a WARN that says so. A multi-host URL (postgres://…@a,b/db?target_session_attrs=read-write)
// lets the pool find the new primary; meanwhile requests get 503 with Retry-After.
//
// Errors are normalised at the package's edge: a missing record is [idemstore.ErrNotFound],
// a fenced operation that lost its token is [idem.ErrLeaseLost], and a database that
// cannot be reached wraps [ErrUnavailable] (the middleware answers 503 and the pool
// reconnects when the database returns).
//
// The SQL lives in queries/*.sql and the numbered migrations in migrations/, both
// embedded in the binary.
//
// # Background work
//
// [Open] and [NewFromPool] start the store's cleaner, which deletes expired records in
// batches until [Store.Close] (Config.Cleaner; Config.DisableCleaner for short-lived
// tools): an application has nothing to start for SPEC §8, and the cleaners of several
// processes skip each other's rows. The table keeps no index of expiry (migration 0010):
// [Store.RecordDeleteExpired] walks it in disk order, a range of pages per short
// transaction, from where the last call stopped. Operations that run as steps (SPEC §13, [Step]) and
// whose client may give up need an idem.Completer, which the application starts on its
// guard: idem.NewCompleter(mw.Guard(), …).Run(ctx).
package postgres
