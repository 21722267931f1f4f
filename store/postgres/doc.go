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
// A new key costs one round trip to claim and one to complete; a replay and an
// in-flight duplicate cost one; a takeover two (see queries.go for the full table).
// Statements run at READ COMMITTED and a replay writes nothing.
//
// [Store.InTx] runs a handler's own writes and the record's completion in one
// transaction (SPEC §7): either both commit or neither does, and the client never
// receives a response whose effects did not commit. The fenced completion and COMMIT
// travel in one pipelined round trip; a lost lease raises SQLSTATE IDL01 inside the
// transaction so that the queued COMMIT is skipped.
//
// Errors are normalised at the package's edge: a missing record is [idem.ErrNotFound],
// a fenced operation that lost its token is [idem.ErrLeaseLost], and a database that
// cannot be reached wraps [ErrUnavailable] (the middleware answers 503 and the pool
// reconnects when the database returns).
//
// The SQL lives in queries/*.sql and the numbered migrations in migrations/, both
// embedded in the binary.
package postgres
