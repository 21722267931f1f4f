// Package backstop keeps an idempotency key's outcome in the application's own SQL
// database, in the transaction of the operation's writes, for stores that cannot join
// that transaction: Redis (and the in-memory store of tests), whose
// idem.Capabilities.Transactions is false.
//
// With such a store, the record of a key and the operation's writes commit apart. A
// retry executes the operation a second time when the record is lost after the writes
// committed: a Redis restart without persistence, an eviction, a failover to a replica
// that had not received it, or a process that crashed between its COMMIT and the
// record's completion (its lease then lapses and the retry takes the key over). The
// backstop closes that gap where the writes live: a table with one row per (scope,
// key), unique, written in the operation's transaction together with the response.
//
//   - A new key inserts its row first thing in the transaction, runs the operation's
//     writes, and stores the operation's response in the same row before COMMIT: the
//     writes and the row commit together or not at all.
//   - A key whose row is already there (its operation committed before, and the store
//     forgot) runs nothing: the backstop answers the request with the response the
//     row keeps, the same status, headers and body, or 409 key_reused when the request
//     differs (422 in the ietf profile). The store then keeps that answer as the key's
//     record again.
//   - Two executions at once (the record lost while the first still runs) meet on the
//     row's unique key: on PostgreSQL the second waits for the first's transaction and
//     then answers its response; on SQLite the write lock orders them.
//
// Rows expire with their record (the handle's TTL) and then count as absent: the key
// starts a new operation, as SPEC §8 says. Every hundredth new row, the backstop
// deletes up to a hundred expired ones after its commit, so the table stays bounded
// without a cleaner to remember; [Backstop.DeleteExpired] deletes more from a job of
// your own.
//
// [Backstop.Respond] has the contract of the SQL stores' Respond: its function runs the
// writes on a *sql.Tx and returns the response, and an error comes back only when the
// writes failed. [Backstop.InTx] is the form whose function writes the response itself,
// inside the transaction.
//
// The database is a *sql.DB: PostgreSQL through pgx's database/sql driver
// (stdlib.OpenDBFromPool(pool), or sql.Open("pgx", url)), or SQLite through
// modernc.org/sqlite (set its busy_timeout, so that concurrent writers wait for the
// lock rather than fail at once).
//
// The SQL stores need no backstop: their §7 helpers (their Respond and InTx) commit the
// record itself with the writes. docs/redis.md says
// what Redis can lose, and when.
package backstop
