// Package payments is the reference payments API of SPEC §11, in Stripe's shape: charges
// and orders owned by bearer-token principals, behind the idem middleware, on SQLite or
// PostgreSQL.
//
// Construction takes an idempotency store, a [DB] and options:
//
//	st, _ := sqlite.Open(ctx, path, sqlite.Config{})     // or postgres.Open(ctx, url, …)
//	_ = st.Migrate(ctx)
//	db := payments.NewSQLiteStoreDB(st)                  // or NewPostgresStoreDB(st)
//	_, _ = db.Migrate(ctx)
//	srv := payments.New(payments.Config{Store: st, DB: db})
//	handler := srv.Handler()                             // mount it, or httptest.NewServer(handler)
//
// A DB on the store's own database (NewSQLiteStoreDB, NewPostgresStoreDB, or
// NewSQLiteDB with the store's InTx) makes every mutating endpoint commit its rows and
// the completion of the idempotency record in one transaction (SPEC §7), and a client
// never receives a response whose effects did not commit. With a store that is not the DB's
// database (Redis), pass a nil InTx: mutations run in plain transactions and the reply
// is written after COMMIT.
//
// Creations go through the store's Respond (respond.go), the README's path; the other
// mutations, which read before they write, through its InTx. Round trips and flushes
// (PostgreSQL, the store sharing the DB's database):
//   - POST /v1/charges (the lease path: the key is claimed and committed before the
//     card processor's call): the claim (flushed; store/postgres's AsynchronousClaim
//     would save that flush, see its "Durable claims"), then the insert and the fenced
//     completion pipelined in one round trip (Respond): 2 round trips and 2 flushes;
//     without idempotency 1 and 1.
//   - POST /v1/orders claims its key in its own transaction
//     (idem.RouteOptions.ClaimInHandler, Respond): the record's read, the record
//     inserted completed (waiting at most 100 ms for a concurrent claim of the key),
//     the order and its order_keys row in one round trip and 1 flush. A duplicate that finds the first uncommitted
//     waits at most the lock timeout and gets 409 request_in_progress; one after the
//     commit gets the replay, in that same one round trip. On SQLite Respond claims in
//     the order's transaction likewise (one fsync instead of two).
//   - Both predict their reply (the insert echoes what it was given) and return it to
//     Respond. When the insert conflicts with an object the key wrote before (its
//     record was lost or expired), nothing commits, and the request takes the
//     read-then-write path (InTx) that explains the conflict.
//
// With Config.ProcessorURL, POST /v1/charges charges through a card processor (`idem
// processor`) with recovery points (SPEC §13, charge_steps.go): the charge is recorded
// pending with the record's recovery point, charged at the processor under
// idem.Handle.DerivedKey("processor_charge"), then settled with the answer in one
// transaction; a takeover (a retry, or the idem.Completer through the resume function
// the route registers; [Server.Guard]) resumes after the pending step, so a card is
// charged once however often the process dies. The DB must be the store's own
// (NewSQLiteStoreDB or NewPostgresStoreDB: [DB.RunsSteps]).
//
// Every charge and order carries scope, idempotency_key, request_fingerprint and the
// key's expiry; a live (scope, idempotency_key) is unique. When the idempotency record
// was lost (a store without §7, a lapsed lease) a re-execution of the same request
// re-renders the object the key already wrote, byte for byte, and another request with
// that key gets key_reused. Once the key's record expired (Config.TTL) the key starts a
// new operation (SPEC §8).
//
// Choices where the SPEC is silent:
//   - Unknown body parameters are refused with 400 parameter_unknown, as Stripe does;
//     query parameters of GET are not checked.
//   - amount must be a JSON integer (not 20.5, 2e3 or "2000") or, in a form, digits;
//     an empty form value or a JSON null leaves an optional parameter unset.
//   - Orders are {"id", "object": "order", "amount", "currency", "description" (string or
//     null), "status" (open, paid, fulfilled or canceled; default open), "created",
//     "updated", "idempotency_key"}. Their ids are per principal: two principals may each
//     PUT ord_x.
//   - A malformed order id answers 404 to GET (no such order can exist), 400 to PUT (it
//     cannot be created) and 204 to DELETE (deleting what does not exist succeeds).
//   - A missing or malformed Authorization header is 401 api_key_invalid.
//   - Errors of the API itself always have Stripe's shape; the middleware's follow
//     Config.Profile.
//   - With DisableIdempotency, Idempotency-Key headers are ignored and objects carry a
//     null idempotency_key.
package payments
