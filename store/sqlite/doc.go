// Package sqlite is the embedded default [idemstore.Store]: one SQLite file on local disk,
// through the pure-Go driver modernc.org/sqlite (no cgo).
//
// Any number of goroutines and processes on one host may share the file (SPEC §14); it
// must live on a local disk, not NFS, whose locks SQLite cannot trust. Records survive
// restarts. The application's own tables may live in the same file, which is what makes
// [Store.Respond] and [Store.InTx] possible: the handler's writes and the record's
// completion commit in one transaction or not at all (SPEC §7). Respond is the path of a
// handler whose writes all go to this file (it returns its response; on an
// idem.RouteOptions.ClaimInHandler route the claim is made in that same transaction, one
// fsync for the whole request); InTx the lease path's, for a handler that calls
// something outside the database first. It must be a file: [Open] refuses every form of
// in-memory or temporary database, which would be private to one pooled connection.
//
// # Connections and locking
//
// [Open] opens the file in WAL mode, so readers never wait for the writer, with
// synchronous=FULL (a commit is durable once it returns), foreign_keys on, and
// _txlock=immediate: every transaction is BEGIN IMMEDIATE, taking the write lock up
// front. A deferred transaction that reads and then writes can fail with SQLITE_BUSY
// at once, without waiting, when another connection committed in between; an immediate
// one waits for the lock before it reads anything.
//
// SQLite allows one writer at a time per file. Within one process the store queues its
// write transactions on an in-process semaphore, so they wait in order instead of
// sleeping in SQLite's busy handler, which polls with sleeps of up to 100 ms. Across
// processes the busy handler ([Config].BusyTimeout per statement) and then a short
// jittered retry of the whole transaction wait for the lock for as long as the
// request's context lives: lock contention is never reported as an error while the
// context lives (SPEC §9). Correctness never depends on the semaphore; it only saves
// waiting (SPEC §14).
//
// A claim first reads the record without any lock: a replay, a mismatch or a live
// lease is answered from that committed state, so retries never queue behind writers.
// Only a claim that inserts or takes over opens a write transaction, which reads the
// record again under the lock and decides with [idemstore.Decide].
//
// # Durable claims
//
// A claim's write transaction commits on a connection of its own with
// synchronous=NORMAL (unless Config.SynchronousClaim): in WAL mode its commit appends
// to the WAL without an fsync, saving one fsync per request; everything else, the
// [Store.InTx] completion included, commits with synchronous=FULL. A crash of the
// process loses nothing (the frames are in the operating system's cache); an
// operating-system crash or a power loss may lose the last claims, and that is safe:
//
//   - The application's writes commit only in the transaction that holds the fenced
//     completion (SPEC §7), and that completion updates the claim's row, which it must
//     find under the holder's token; without it the completion fails and nothing
//     commits.
//   - That transaction's FULL commit fsyncs the WAL file, and with it every frame
//     appended before its own, the claim's included; and recovery replays a WAL only up
//     to its first invalid frame (the frames carry cumulative checksums). So once a
//     completion is durable, so is its claim.
//   - A crash can therefore lose only a claim whose operation has not committed: the
//     holder (if it survived) fails its completion and answers 503, a duplicate that saw
//     the claim got 409 request_in_progress, and the client's retry executes once. What
//     the holder did outside the database happens again, as after a lapsed lease (SPEC
//     §5.3).
//
// TestInTxRefusesTheCompletionOfALostClaim shows the completion refusing.
//
// # Clock and times
//
// Leases and expiry use the host clock (time.Now), which is the store's clock for a
// database that only processes of one host share; a non-zero Now in the params
// replaces it (tests only). Times are stored as integer unix nanoseconds, so an
// injected time reads back exactly.
//
// # Schema
//
// [Store.Migrate] applies the numbered migrations embedded from migrations/*.sql, each
// once, inside BEGIN IMMEDIATE, recording them in the table idem_migrations; several
// processes may migrate one file at the same time. Records live in idem_records. All
// SQL lives in queries/*.sql.
//
// # Background work
//
// [Open] starts the store's cleaner, which deletes expired records in batches until
// [Store.Close] (Config.Cleaner; Config.DisableCleaner for short-lived tools): an
// application has nothing to start for SPEC §8. Operations that run as steps (SPEC
// §13, [Step]) and whose client may give up need an idem.Completer, which the
// application starts on its guard: idem.NewCompleter(mw.Guard(), …).Run(ctx).
package sqlite
